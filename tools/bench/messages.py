"""What Anthropic's Messages API costs over chat, on the default model, in one run (issue 45).

    python -m tools.bench.messages [--rounds 7] [--tokens 256] [--threads N]

tools/bench/front.py measures and reports. Here: `max_tokens` N on `/v1/messages`, its
tokens read from `usage.output_tokens`; streamed, the first `text_delta` is the first
text, and `message_delta` carries the usage. Goals: decode messages / chat >= 0.98,
streamed TTFT messages / chat <= 1.05.
"""

from __future__ import annotations

import json
import sys
import time

import httpx

from tools.bench import common
from tools.bench.front import MODEL, TTFT_TOKENS, Front, main
from tools.bench.peer import MESSAGES


def message(client: httpx.Client, url: str, tokens: int) -> common.Run:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": tokens, "temperature": 0}
    started = time.perf_counter()
    reply = client.post(f"{url}/messages", json=body)
    seconds = time.perf_counter() - started
    reply.raise_for_status()
    found = reply.json()
    text = "".join(block["text"] for block in found["content"] if block["type"] == "text")
    return common.Run(found["usage"]["output_tokens"], seconds, text)


def message_stream(client: httpx.Client, url: str) -> common.Run:
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": TTFT_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    parts: list[str] = []
    ttft, tokens = 0.0, 0
    started = time.perf_counter()
    with client.stream("POST", f"{url}/messages", json=body) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            delta = event.get("delta") or {}
            if event["type"] == "content_block_delta" and delta.get("type") == "text_delta":
                ttft = ttft or time.perf_counter() - started
                parts.append(delta["text"])
            elif event["type"] == "message_delta":
                tokens = event["usage"]["output_tokens"]
    return common.Run(tokens, time.perf_counter() - started, "".join(parts), ttft)


MESSAGES_API = Front("messages", "/v1/messages", message, message_stream)

if __name__ == "__main__":
    sys.exit(main(MESSAGES_API, __doc__ or ""))
