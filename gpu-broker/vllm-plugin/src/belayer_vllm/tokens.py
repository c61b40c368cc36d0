"""The broker's token log as the vLLM worker writes it: each request is admitted with its prompt
token ids and sampling parameters when the scheduler first sends it, and every step's sampled
tokens are committed before the step's output leaves the worker, so the log always holds at least
what any client has seen."""

from __future__ import annotations

import hashlib
import logging
import re

from .client import BrokerClient, BrokerError
from .wire import MAX_LIST, CommitEntry, SamplingParams

log = logging.getLogger("vllm.belayer")

# The front names each request `blyr-<16 hex digits>` (header X-Request-Id); vLLM keeps it inside
# its own request id ("cmpl-blyr-...-0-<suffix>").
_ID = re.compile(r"blyr-([0-9a-f]{16})")


def log_id(req_id: str) -> int:
    """The broker log's key for a vLLM request id."""
    m = _ID.search(req_id)
    if m:
        return int(m.group(1), 16)
    return int.from_bytes(hashlib.blake2b(req_id.encode(), digest_size=8).digest(), "little")


def front_request_id(rid: int) -> str:
    return f"blyr-{rid:016x}"


def params_of(sp) -> SamplingParams:
    if sp is None:
        return SamplingParams(0.0, 0, 0, 0)
    top_k = sp.top_k if sp.top_k and sp.top_k > 0 else 0
    return SamplingParams(float(sp.temperature or 0.0), int(top_k), int(sp.seed or 0) & (2**64 - 1), int(sp.max_tokens or 0))


class TokenLog:
    def __init__(self, client: BrokerClient) -> None:
        self.client = client
        self.pos: dict[str, int] = {}
        self.ids: dict[str, int] = {}

    def on_schedule(self, scheduler_output) -> None:
        done = []
        for req_id in getattr(scheduler_output, "finished_req_ids", ()) or ():
            if req_id in self.pos:
                done.append(CommitEntry(self.ids[req_id], self.pos.pop(req_id), [], 0, True))
                self.ids.pop(req_id)
        if done:
            self._commit(done)
        for new in scheduler_output.scheduled_new_reqs:
            if new.prompt_token_ids is None or new.req_id in self.pos:
                continue
            rid = log_id(new.req_id)
            try:
                self.client.admit(rid, params_of(new.sampling_params), list(new.prompt_token_ids))
            except BrokerError as e:
                if e.stale or e.restarted:
                    raise
                log.warning("belayer: request %s not logged: %s", new.req_id, e)
                continue
            self.ids[new.req_id] = rid
            self.pos[new.req_id] = 0

    def on_output(self, output, skip: set[str] = frozenset()) -> None:
        """Commits each request's sampled tokens, but those of ``skip`` (whose step vLLM
        discards)."""
        req_ids = getattr(output, "req_ids", None)
        sampled = getattr(output, "sampled_token_ids", None)
        if not req_ids or sampled is None:
            return
        entries = []
        for req_id, toks in zip(req_ids, sampled):
            toks = [int(t) for t in (toks.tolist() if hasattr(toks, "tolist") else toks)]
            if not toks or req_id not in self.pos or req_id in skip:
                continue
            entries.append(CommitEntry(self.ids[req_id], self.pos[req_id], toks, 0, False))
            self.pos[req_id] += len(toks)
        for i in range(0, len(entries), MAX_LIST):
            self._commit(entries[i : i + MAX_LIST])

    def _commit(self, entries: list[CommitEntry]) -> None:
        self.client.commit(entries)
