"""``belayer-vllm-front``: the OpenAI endpoint clients use, in front of a primary and a shadow vLLM.

Every request is sent to the current primary (the lease holder named by the lease file whose
epoch is the broker's) as a stream with token ids, under the id ``blyr-<id>`` that the worker uses
as the key of the broker's token log. When the primary dies or is fenced mid-request (connection
lost, a 5xx, an error chunk, or the broker's epoch moving on), the front waits for the promoted
shadow, reads the request's logged prompt and tokens from the broker, and sends the rest as a
completion of ``prompt + logged tokens`` with the remaining budget. The client sees one answer,
streamed or not, chat or completion; with greedy decoding its tokens are those of a failure-free
run. Nothing here changes vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from .client import BrokerClient, BrokerError
from .tokens import front_request_id
from .wire import ErrorCode, Role, Status

log = logging.getLogger("belayer_vllm.front")

# Sampling fields carried from the client's request into a resumed completion.
CARRIED = (
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "skip_special_tokens",
)


class Unavailable(Exception):
    """No primary to send to (broker restarted, or none promoted in time)."""


@dataclass
class Attempt:
    rid: int
    epoch: int
    prompt: list[int] | None = None  # prompt token ids of this attempt, from the stream
    tokens: list[int] = field(default_factory=list)


class BrokerWatch:
    """The broker's status, polled by a thread over an observer connection."""

    def __init__(self, path: str, every: float = 0.01) -> None:
        self.path = path
        self.every = every
        self.status = Status()
        self.broken: str | None = None
        self.instance = 0
        self.conn: BrokerClient | None = None
        self.lock = threading.Lock()
        self.changed = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        threading.Thread(target=self._run, name="belayer-front-watch", daemon=True).start()

    def _connect(self) -> BrokerClient:
        c = BrokerClient(self.path, Role.OBSERVER, self.instance)
        self.instance = c.instance
        return c

    def _run(self) -> None:
        while True:
            try:
                if self.conn is None:
                    self.conn = self._connect()
                st = self.conn.status()
                if st.epoch != self.status.epoch and self.loop is not None:
                    self.loop.call_soon_threadsafe(self.changed.set)
                self.status = st
            except BrokerError as e:
                if self.conn is not None:
                    self.conn.close()
                    self.conn = None
                if e.code == ErrorCode.BROKER_RESTARTED:
                    self.broken = str(e)
                    if self.loop is not None:
                        self.loop.call_soon_threadsafe(self.changed.set)
                    log.error("%s", e)
                    return
            time.sleep(self.every)

    def log_get(self, rid: int):
        with self.lock:
            c = BrokerClient(self.path, Role.OBSERVER, self.instance)
            try:
                return c.log_get(rid)
            finally:
                c.close()


class Front:
    def __init__(self, broker: str, state_dir: str, wait_s: float) -> None:
        self.watch = BrokerWatch(broker)
        self.lease_path = os.path.join(state_dir, "primary.json")
        self.wait_s = wait_s
        self.http: aiohttp.ClientSession | None = None
        self.healthy: dict[int, str] = {}
        self.resumes: list[dict] = []

    def _lease(self) -> dict | None:
        try:
            with open(self.lease_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    async def primary(self, min_epoch: int) -> tuple[int, str]:
        """(epoch, endpoint) of a live primary whose epoch is at least ``min_epoch``."""
        deadline = time.monotonic() + self.wait_s
        while True:
            if self.watch.broken:
                raise Unavailable(self.watch.broken)
            st, lease = self.watch.status, self._lease()
            if st.primary_pid and lease and lease["epoch"] == st.epoch and st.epoch >= min_epoch:
                ep = lease["endpoint"]
                if self.healthy.get(st.epoch) == ep:
                    return st.epoch, ep
                try:
                    async with self.http.get(f"{ep}/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            self.healthy[st.epoch] = ep
                            return st.epoch, ep
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
            if time.monotonic() > deadline:
                raise Unavailable(f"no primary vLLM took over within {self.wait_s:.0f} s (broker epoch {st.epoch}, lease file {lease})")
            self.watch.changed.clear()
            try:
                await asyncio.wait_for(self.watch.changed.wait(), 0.01)
            except asyncio.TimeoutError:
                pass

    # --- one request ----------------------------------------------------------------------------

    async def generate(self, chat: bool, body: dict, emit) -> tuple[str, dict]:
        """Runs a request to completion across failovers. ``emit(text, ids, finish)`` is called
        for each new piece; returns (finish_reason, usage)."""
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if not chat and limit is None:
            limit = 16  # the OpenAI (and vLLM) default for completions
        attempts: list[Attempt] = []
        sent: list[int] = []
        prompt_len = 0
        min_epoch = 0
        while True:
            epoch, ep = await self.primary(min_epoch)
            rid = random.getrandbits(63) | 1
            prompt = await self._logged_prefix(attempts[-1]) if attempts else None
            if prompt is None:
                # The first attempt, or one the dead primary never admitted (nothing delivered).
                url, req = f"{ep}/v1/{'chat/completions' if chat else 'completions'}", dict(body)
                if attempts:
                    log.warning("request never reached the dead primary's log; sending it afresh on epoch %d", epoch)
                    attempts.clear()
            else:
                req = {k: body[k] for k in CARRIED if k in body}
                req.update(model=body.get("model"), prompt=prompt)
                if limit is not None:
                    req["max_tokens"] = int(limit) - len(sent)
                url = f"{ep}/v1/completions"
                self.resumes.append({"at_token": len(sent), "epoch": epoch, "t": time.time()})
                log.warning("resuming after %d tokens on epoch %d (%s)", len(sent), epoch, ep)
            req.update(stream=True, return_token_ids=True)
            req.pop("stream_options", None)
            att = Attempt(rid, epoch, prompt=None)
            if attempts:
                att.prompt = req["prompt"]
            attempts.append(att)
            try:
                finish = await self._stream(url, req, att, chat and len(attempts) == 1, emit, sent)
            except _Failover as e:
                log.warning("request blyr-%016x: primary of epoch %d failed (%s)", rid, epoch, e)
                min_epoch = epoch + 1
                continue
            if attempts[0].prompt is not None:
                prompt_len = len(attempts[0].prompt)
            return finish, {"prompt_tokens": prompt_len, "completion_tokens": len(sent), "total_tokens": prompt_len + len(sent)}

    async def _logged_prefix(self, att: Attempt) -> list[int] | None:
        """The failed attempt's prompt and tokens as the broker's log holds them, checked
        against what the client was sent; ``None`` when the primary died before admitting the
        request (it is not in the log and the client has nothing of it)."""
        try:
            entry = await asyncio.get_running_loop().run_in_executor(None, self.watch.log_get, att.rid)
        except BrokerError as e:
            if att.prompt is None and not att.tokens and not e.restarted:
                return None
            if att.prompt is None:
                raise Unavailable(f"the broker's log has no request blyr-{att.rid:016x} ({e})") from e
            log.error("request blyr-%016x missing from the log (%s); resuming from the stream's copy", att.rid, e)
            return att.prompt + att.tokens
        if entry.generated[: len(att.tokens)] != att.tokens:
            raise Unavailable(f"the log of blyr-{att.rid:016x} disagrees with the tokens streamed to the client")
        if att.prompt is not None and entry.prompt != att.prompt:
            raise Unavailable(f"the log of blyr-{att.rid:016x} holds another prompt")
        # Resume from what the client has: logged tokens past it were never delivered and are
        # generated again (the same ones, greedily).
        return list(entry.prompt) + att.tokens

    async def _stream(self, url: str, req: dict, att: Attempt, chat: bool, emit, sent: list[int]) -> str:
        headers = {"X-Request-Id": front_request_id(att.rid)}
        try:
            async with self.http.post(url, json=req, headers=headers, timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)) as r:
                if r.status >= 500:
                    raise _Failover(f"HTTP {r.status}")
                if r.status != 200:
                    raise _ClientError(r.status, await r.read())
                while True:
                    try:
                        line = await asyncio.wait_for(r.content.readline(), 0.25)
                    except asyncio.TimeoutError:
                        if self.watch.status.epoch != att.epoch or self.watch.broken:
                            raise _Failover("the broker's epoch moved on (primary fenced)") from None
                        continue
                    if not line:
                        raise _Failover("stream ended before a finish reason")
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        raise _Failover("stream ended before a finish reason")
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise _Failover(f"error chunk: {chunk['error']}")
                    if att.prompt is None:
                        pids = chunk.get("prompt_token_ids")
                        if pids is None and chunk.get("choices"):
                            pids = chunk["choices"][0].get("prompt_token_ids")
                        if pids:
                            att.prompt = list(pids)
                    if not chunk.get("choices"):
                        continue
                    c = chunk["choices"][0]
                    text = c.get("text") if not chat else (c.get("delta") or {}).get("content")
                    ids = list(c.get("token_ids") or [])
                    att.tokens.extend(ids)
                    sent.extend(ids)
                    finish = c.get("finish_reason")
                    if text or ids or finish:
                        await emit(text or "", ids, finish)
                    if finish:
                        return finish
        except (aiohttp.ClientError, ConnectionError) as e:
            raise _Failover(f"{type(e).__name__}: {e}") from e

    # --- HTTP -----------------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON")
        if int(body.get("n") or 1) != 1:
            return _error(400, "belayer-vllm-front serves n=1 only")
        want_ids = bool(body.get("return_token_ids"))
        cid = f"{'chatcmpl' if chat else 'cmpl'}-blyr{random.getrandbits(64):016x}"
        created = int(time.time())
        model = body.get("model")
        obj = "chat.completion.chunk" if chat else "text_completion"

        def piece(text: str, ids: list[int], finish: str | None, first: bool) -> dict:
            choice: dict = {"index": 0, "finish_reason": finish, "logprobs": None}
            if chat:
                choice["delta"] = {"content": text} | ({"role": "assistant"} if first else {})
            else:
                choice["text"] = text
            if want_ids:
                choice["token_ids"] = ids
            return {"id": cid, "object": obj, "created": created, "model": model, "choices": [choice]}

        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            first = [True]

            async def emit(text, ids, finish):
                await resp.write(b"data: " + json.dumps(piece(text, ids, finish, first[0])).encode() + b"\n\n")
                first[0] = False

            try:
                await self.generate(chat, body, emit)
            except (Unavailable, _ClientError) as e:
                await resp.write(b"data: " + json.dumps({"error": {"message": str(e), "type": "unavailable", "code": 503}}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp

        texts: list[str] = []
        ids_all: list[int] = []

        async def collect(text, ids, finish):
            texts.append(text)
            ids_all.extend(ids)

        try:
            finish, usage = await self.generate(chat, body, collect)
        except Unavailable as e:
            return _error(503, str(e))
        except _ClientError as e:
            return web.Response(status=e.status, body=e.body, content_type="application/json")
        choice: dict = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": "".join(texts)}
        else:
            choice["text"] = "".join(texts)
        if want_ids:
            choice["token_ids"] = ids_all
        return web.json_response({
            "id": cid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model, "choices": [choice], "usage": usage,
        })

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        try:
            _, ep = await self.primary(0)
        except Unavailable as e:
            return _error(503, str(e))
        async with self.http.get(f"{ep}{request.path}") as r:
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

    async def stats(self, request: web.Request) -> web.Response:
        st = self.watch.status
        return web.json_response({"epoch": st.epoch, "primary_pid": st.primary_pid, "takeovers": st.takeovers, "resumes": self.resumes, "broken": self.watch.broken})


class _Failover(Exception):
    pass


class _ClientError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200]!r}")
        self.status = status
        self.body = body


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "belayer", "code": status}}, status=status)


def app(front: Front) -> web.Application:
    a = web.Application()

    async def on_startup(_):
        front.watch.loop = asyncio.get_running_loop()
        front.watch.changed = asyncio.Event()
        front.http = aiohttp.ClientSession()

    async def on_cleanup(_):
        await front.http.close()

    a.on_startup.append(on_startup)
    a.on_cleanup.append(on_cleanup)
    a.router.add_post("/v1/completions", front.completions)
    a.router.add_post("/v1/chat/completions", front.chat)
    a.router.add_get("/v1/models", front.passthrough)
    a.router.add_get("/health", front.passthrough)
    a.router.add_get("/belayer/stats", front.stats)
    return a


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="belayer-vllm-front", description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT to serve the OpenAI API on")
    ap.add_argument("--broker", required=True, help="belayer-gpu-broker's socket")
    ap.add_argument("--state-dir", help="where the vLLMs write primary.json (default: the socket's directory)")
    ap.add_argument("--wait-s", type=float, default=120.0, help="how long a request waits for a primary")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    host, port = a.listen.rsplit(":", 1)
    front = Front(a.broker, a.state_dir or os.path.dirname(a.broker), a.wait_s)
    web.run_app(app(front), host=host, port=int(port), print=lambda *_: log.info("serving on %s", a.listen))


if __name__ == "__main__":
    main()
