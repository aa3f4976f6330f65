"""What the Responses API costs over chat, on the default model, in one run (issue 44).

    python -m tools.bench.responses [--rounds 7] [--tokens 256] [--threads N]

tools/bench/front.py measures and reports. Here: `max_output_tokens` N on
`/v1/responses` (`store: false`, as chat keeps nothing), its tokens read from
`usage.output_tokens`; streamed, the first `response.output_text.delta` event is the
first text. Goals: decode responses / chat >= 0.98, streamed TTFT responses / chat <= 1.05.
"""

from __future__ import annotations

import json
import sys
import time

import httpx

from tools.bench import common
from tools.bench.front import MODEL, TTFT_TOKENS, Front, main
from tools.bench.peer import MESSAGES

PROMPT = MESSAGES[0]["content"]


def response(client: httpx.Client, url: str, tokens: int) -> common.Run:
    body = {"model": MODEL, "input": PROMPT, "max_output_tokens": tokens, "temperature": 0}
    body["store"] = False  # as chat keeps nothing
    started = time.perf_counter()
    reply = client.post(f"{url}/responses", json=body)
    seconds = time.perf_counter() - started
    reply.raise_for_status()
    found = reply.json()
    text = "".join(
        part["text"]
        for item in found["output"]
        if item["type"] == "message"
        for part in item["content"]
    )
    return common.Run(found["usage"]["output_tokens"], seconds, text)


def response_stream(client: httpx.Client, url: str) -> common.Run:
    body = {
        "model": MODEL,
        "input": PROMPT,
        "max_output_tokens": TTFT_TOKENS,
        "temperature": 0,
        "stream": True,
        "store": False,
    }
    parts: list[str] = []
    ttft, tokens = 0.0, 0
    started = time.perf_counter()
    with client.stream("POST", f"{url}/responses", json=body) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.output_text.delta":
                ttft = ttft or time.perf_counter() - started
                parts.append(event["delta"])
            elif event["type"] in ("response.completed", "response.incomplete"):
                tokens = event["response"]["usage"]["output_tokens"]
    return common.Run(tokens, time.perf_counter() - started, "".join(parts), ttft)


RESPONSES_API = Front("responses", "/v1/responses", response, response_stream)

if __name__ == "__main__":
    sys.exit(main(RESPONSES_API, __doc__ or ""))
