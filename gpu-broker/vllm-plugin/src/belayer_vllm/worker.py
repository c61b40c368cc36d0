"""``--worker-cls belayer_vllm.worker.BelayerCPUWorker``: vLLM's CPU worker, writing every step's
tokens into the broker's log and refusing to run once fenced, and recording each KV block it
fills (prefix hash, checksum) so a successor can adopt it (:mod:`belayer_vllm.kvreuse`)."""

from __future__ import annotations

import logging

from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.cpu_worker import CPUWorker

from . import kvreuse
from . import session as session_mod
from .client import BrokerError
from .kv import connector
from .tokens import TokenLog

log = logging.getLogger("vllm.belayer")


class BelayerCPUWorker(CPUWorker):
    _belayer_log: TokenLog | None = None
    _belayer_kv: kvreuse.Recorder | None = None

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

    def _failed_loads(self) -> set[str]:
        """Requests whose adopted KV failed its checksum this step: vLLM discards their output
        and recomputes, so their tokens are not logged and their blocks not recorded."""
        c = connector()
        return c.failed_reqs if c is not None else set()

    def _record_kv(self, scheduler_output) -> None:
        c = connector()
        if c is None or not c.layers:
            return
        if self._belayer_kv is None:
            self._belayer_kv = kvreuse.Recorder(c.block_size, c.salt)
        rec = self._belayer_kv
        rec.forget(getattr(scheduler_output, "finished_req_ids", ()) or ())
        failed = c.failed_reqs
        rec.forget(failed)
        scheduled = {r: n for r, n in scheduler_output.num_scheduled_tokens.items() if r not in failed}
        blocks = rec.after_forward(self.model_runner.requests, scheduled, c.layers)
        if blocks:
            sess = session_mod.current()
            assert sess is not None
            self._logged("kv note", lambda: sess.client.kv_note(blocks))

    def execute_model(self, scheduler_output):
        tl = self._token_log()
        if tl is not None:
            self._logged("admit", lambda: tl.on_schedule(scheduler_output))
        out = super().execute_model(scheduler_output)
        if tl is not None:
            self._record_kv(scheduler_output)
        if tl is not None and isinstance(out, ModelRunnerOutput):
            self._logged("commit", lambda: tl.on_output(out, self._failed_loads()))
        return out

    def sample_tokens(self, grammar_output):
        out = super().sample_tokens(grammar_output)
        tl = self._token_log()
        if tl is not None:
            if isinstance(out, ModelRunnerOutput):
                self._logged("commit", lambda: tl.on_output(out, self._failed_loads()))
            elif out is not None:
                log.error("belayer: %s output is not logged; run vLLM with --no-async-scheduling", type(out).__name__)
        return out
