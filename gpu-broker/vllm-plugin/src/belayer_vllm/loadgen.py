"""``python -m belayer_vllm.loadgen``: concurrent OpenAI requests (chat and completions, streamed
and not) with every token's arrival time, for the vLLM takeover tests and ``belayer-bench vllm``.

Writes ``--out`` (JSON: one record per request: kind, stream, token ids, text, finish reason,
error, arrival times) and, once every streamed request has ``--min-tokens`` tokens, touches
``--generating`` so a test knows when to kill.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import aiohttp

WORDS = (
    "the rollout worker keeps its weights and cache in a broker so that a shadow can take over "
    "when a process dies and every request continues from the tokens already logged"
).split()


def prompt_text(i: int, words: int) -> str:
    body = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(words))
    return f"Note {i}: {body}. Summary of note {i}:"


def spec(n: int, prefix_tokens: int, max_tokens: int, mix: str, tokenizer: str | None) -> list[dict]:
    tok = None
    if tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    out = []
    for i in range(n):
        text = prompt_text(i, prefix_tokens)
        if tok is not None:
            # Exactly prefix_tokens tokens: a long text cut at that many tokens.
            ids = tok(prompt_text(i, prefix_tokens * 2)).input_ids[:prefix_tokens]
            text = tok.decode(ids)
        kind = "chat" if (mix == "mixed" and i % 2 == 1) or mix == "chat" else "completion"
        stream = mix != "mixed" or i % 4 in (0, 1)
        out.append({"kind": kind, "stream": stream, "text": text, "max_tokens": max_tokens})
    return out


async def one(http: aiohttp.ClientSession, url: str, r: dict, rec: dict) -> None:
    body: dict = {"model": "smol", "temperature": 0, "max_tokens": r["max_tokens"], "stream": r["stream"], "return_token_ids": True, "ignore_eos": True}
    if r["kind"] == "chat":
        body["messages"] = [{"role": "user", "content": r["text"]}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = r["text"]
        path = "/v1/completions"
    rec.update(kind=r["kind"], stream=r["stream"], tokens=[], text="", times=[], finish=None, error=None, sent=time.time())
    try:
        async with http.post(url + path, json=body) as resp:
            if not r["stream"]:
                data = await resp.json(content_type=None)
                if resp.status != 200 or "error" in data:
                    rec["error"] = data.get("error", data) if isinstance(data, dict) else str(data)
                    return
                c = data["choices"][0]
                rec["tokens"] = c.get("token_ids") or []
                rec["text"] = c.get("text") if r["kind"] == "completion" else c["message"]["content"]
                rec["finish"] = c.get("finish_reason")
                rec["times"] = [time.time()] * len(rec["tokens"])
                return
            async for line in resp.content:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    rec["error"] = chunk["error"]
                    continue
                c = chunk["choices"][0]
                ids = c.get("token_ids") or []
                now = time.time()
                rec["tokens"] += ids
                rec["times"] += [now] * len(ids)
                rec["text"] += (c.get("text") if r["kind"] == "completion" else (c.get("delta") or {}).get("content")) or ""
                if c.get("finish_reason"):
                    rec["finish"] = c["finish_reason"]
    except Exception as e:  # noqa: BLE001 - recorded, the test fails on it
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        rec["done"] = time.time()


async def run(url: str, reqs: list[dict], generating: str | None, min_tokens: int) -> list[dict]:
    recs: list[dict] = [{} for _ in reqs]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
        tasks = [asyncio.create_task(one(http, url, r, rec)) for r, rec in zip(reqs, recs)]
        if generating:
            streamed = [rec for r, rec in zip(reqs, recs) if r["stream"]]
            while not all(t.done() for t in tasks):
                if all(len(rec.get("tokens", ())) >= min_tokens for rec in streamed):
                    with open(generating, "w") as f:
                        f.write(str(time.time()))
                    break
                await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
    return recs


def main() -> None:
    ap = argparse.ArgumentParser(prog="belayer_vllm.loadgen")
    ap.add_argument("--url", required=True)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--prefix-tokens", type=int, default=40, help="prompt length (exact with --tokenizer, else words)")
    ap.add_argument("--tokenizer", help="model directory whose tokenizer sizes the prompts")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--mix", choices=["mixed", "completion", "chat"], default="mixed")
    ap.add_argument("--generating", help="file touched once every streamed request has --min-tokens")
    ap.add_argument("--min-tokens", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--start-at", help="send nothing until this file exists (start-up and the tokenizer done before)")
    a = ap.parse_args()
    reqs = spec(a.requests, a.prefix_tokens, a.max_tokens, a.mix, a.tokenizer)
    while a.start_at and not os.path.exists(a.start_at):
        time.sleep(0.001)
    recs = asyncio.run(run(a.url, reqs, a.generating, a.min_tokens))
    with open(a.out, "w") as f:
        json.dump(recs, f)


if __name__ == "__main__":
    main()
