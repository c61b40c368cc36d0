"""``--worker-cls belayer_vllm.worker.BelayerCPUWorker``: vLLM's CPU worker, writing every step's
tokens into the broker's log and refusing to run once fenced."""

from __future__ import annotations

import logging

from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.cpu_worker import CPUWorker

from . import session as session_mod
from .client import BrokerError
from .tokens import TokenLog

log = logging.getLogger("vllm.belayer")


class BelayerCPUWorker(CPUWorker):
    _belayer_log: TokenLog | None = None

    def _token_log(self) -> TokenLog | None:
        sess = session_mod.current()
        if sess is None or not sess.holds_lease:
            return None
        if self._belayer_log is None:
            self._belayer_log = TokenLog(sess.client)
        return self._belayer_log

    def _logged(self, what: str, fn) -> None:
        try:
            fn()
        except BrokerError as e:
            sess = session_mod.current()
            assert sess is not None
            sess.on_broker_error(e, what)

    def execute_model(self, scheduler_output):
        tl = self._token_log()
        if tl is not None:
            self._logged("admit", lambda: tl.on_schedule(scheduler_output))
        out = super().execute_model(scheduler_output)
        if tl is not None and isinstance(out, ModelRunnerOutput):
            self._logged("commit", lambda: tl.on_output(out))
        return out

    def sample_tokens(self, grammar_output):
        out = super().sample_tokens(grammar_output)
        tl = self._token_log()
        if tl is not None:
            if isinstance(out, ModelRunnerOutput):
                self._logged("commit", lambda: tl.on_output(out))
            elif out is not None:
                log.error("belayer: %s output is not logged; run vLLM with --no-async-scheduling", type(out).__name__)
        return out
