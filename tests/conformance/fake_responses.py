"""The fake server's Responses API (`/v1/responses`, contract 0.20.0): stored responses in a
dict, a conversation continued by `previous_response_id`, typed stream events.

Correct by default; each fault breaks one thing:

    response_usage_names        a Response's usage in chat's names (prompt_tokens, ...)
    response_events_unnumbered  a stream's `sequence_number` counts from 1
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

FAULTS = ("response_usage_names", "response_events_unnumbered")
WORDS = ["Hello", " there", "!"]
INPUT_TOKENS = 5  # per input item the fake is sent; the template's share is not counted

Refuse = Callable[[int, str, str | None, str], Response]


class FakeResponses:
    def __init__(self, model: str, faults: frozenset[str], refuse: Refuse) -> None:
        self._model = model
        self._faults = faults
        self._refuse = refuse
        self._stored: dict[str, tuple[dict[str, Any], list[dict[str, Any]], int]] = {}
        self._ids = itertools.count(1)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses", self.create, methods=["POST"]),
            Route("/v1/responses/{id}", self.retrieve, methods=["GET"]),
            Route("/v1/responses/{id}", self.delete, methods=["DELETE"]),
            Route("/v1/responses/{id}/input_items", self.items, methods=["GET"]),
        ]

    async def create(self, request: Request) -> Response:
        body = json.loads(await request.body())
        seen = 0  # the tokens of the conversation before this input
        previous = body.get("previous_response_id")
        if previous is not None:
            if previous not in self._stored:
                return self._refuse(
                    400, "previous_response_not_found", "previous_response_id", "no such response"
                )
            stored, _, seen = self._stored[previous]
            seen += stored["usage"]["output_tokens"]
        said = body["input"] if isinstance(body["input"], str) else json.dumps(body["input"])
        item = {"id": f"msg_in{next(self._ids)}", "type": "message", "role": "user"}
        item |= {"status": "completed", "content": [{"type": "input_text", "text": said}]}
        words = WORDS[: max(1, min(len(WORDS), body.get("max_output_tokens") or len(WORDS)))]
        response = self._response(body, words, seen + INPUT_TOKENS)
        if body.get("store") is not False:
            self._stored[response["id"]] = (response, [item], seen + INPUT_TOKENS)
        if body.get("stream"):
            return StreamingResponse(self._events(response, words), media_type="text/event-stream")
        return JSONResponse(response)

    def _response(self, body: dict[str, Any], words: list[str], input_tokens: int) -> Any:
        text = "".join(words)
        message = {"id": f"msg_{next(self._ids)}", "type": "message", "role": "assistant"}
        message |= {"status": "completed"}
        message["content"] = [{"type": "output_text", "text": text, "annotations": []}]
        short = len(words) < len(WORDS)
        usage: dict[str, Any] = {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": len(words),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + len(words),
        }
        if "response_usage_names" in self._faults:
            usage = {"prompt_tokens": input_tokens, "completion_tokens": len(words)}
            usage["total_tokens"] = input_tokens + len(words)
        return {
            "id": f"resp_{next(self._ids)}",
            "object": "response",
            "created_at": 1700000000,
            "status": "incomplete" if short else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if short else None,
            "model": self._model,
            "output": [message],
            "previous_response_id": body.get("previous_response_id"),
            "usage": usage,
        }

    async def _events(self, response: dict[str, Any], words: list[str]) -> AsyncIterator[bytes]:
        first = 1 if "response_events_unnumbered" in self._faults else 0
        numbers = itertools.count(first)
        message = response["output"][0]
        text = message["content"][0]["text"]
        where = {"item_id": message["id"], "output_index": 0, "content_index": 0}
        opened = response | {"status": "in_progress", "output": [], "usage": None}
        made: list[dict[str, Any]] = [
            {"type": "response.created", "response": opened},
            {"type": "response.in_progress", "response": opened},
            *({"type": "response.output_text.delta", **where, "delta": w} for w in words),
            {"type": "response.output_text.done", **where, "text": text},
        ]
        ended = "response.completed" if response["status"] == "completed" else "response.incomplete"
        made.append({"type": ended, "response": response})
        for event in made:
            event["sequence_number"] = next(numbers)
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()

    async def retrieve(self, request: Request) -> Response:
        found = self._stored.get(request.path_params["id"])
        if found is None:
            return self._refuse(404, "response_not_found", "response_id", "no such response")
        return JSONResponse(found[0])

    async def delete(self, request: Request) -> Response:
        response_id = request.path_params["id"]
        if self._stored.pop(response_id, None) is None:
            return self._refuse(404, "response_not_found", "response_id", "no such response")
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    async def items(self, request: Request) -> Response:
        found = self._stored.get(request.path_params["id"])
        if found is None:
            return self._refuse(404, "response_not_found", "response_id", "no such response")
        data = found[1]
        page = {"object": "list", "data": data, "first_id": data[0]["id"]}
        return JSONResponse(page | {"last_id": data[-1]["id"], "has_more": False})
