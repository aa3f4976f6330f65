"""A small fake OpenAI-compatible server, correct by default, broken on request.

`fake_app()` answers the /v1 contract the kit checks (models, chat and text
completions, streams, errors, scoring, `X-miLLM-*` headers, inline steering
with the real steering-set hash, an OpenAPI document and `/api/steering`).
`fake_app(extensions=False)` is a plain OpenAI server with none of the miLLM
extensions; `fake_app(api_key=KEY)` answers only `Authorization: Bearer KEY`.
Each name in `faults` breaks one thing:

    error_shape         errors are `{"detail": ...}`, not OpenAI's shape
    stream_no_done      streams end without `data: [DONE]`
    steering_grammar    X-miLLM-Steering is `nothing`, a kind the grammar lacks
    steering_hash       the inline hash also covers the layer (OAI-HASH-02 says it must not)
    models_content_type GET /v1/models sends JSON as text/plain (its OpenAPI says JSON)
    usage_twice         with include_usage, the finish chunk carries usage too (counted twice)
    steering_created_zero  the steering chunk comes apart, after the usage chunk, created 0
    lenient_json        bodies are read as Python's json reads them: a name given twice, the
                        last one wins; 2,000 nested arrays, a 500
    lenient_values      lone surrogate escapes and numbers past int64 are taken as they come
    probe_verdicts_unsorted  X-miLLM-Probe-Verdicts lists its entries in reverse order
    rung_grammar        the rung-1 circuit is described as "causally validated (edge)"
    circuit_hash        the active circuit's layer hash also covers the layer
    cluster_hash        a dialled cluster's hash is over the stored strengths, not x λ
    logprobs_need_one_token  `logprobs` with `max_tokens` other than 1 is a 400 (the rule before
                        contract 0.17.0), not a generation that reports its tokens
    logprobs_one_entry  a chat generation with logprobs reports only its last token
    echo_first_scored   an echoed prompt's first token gets a log-probability, not null

and the Responses API's faults (fake_responses.py). Without extensions the fake has no
Responses API either (404), as an OpenAI-compatible server that predates it.

With extensions it also has one active circuit (two members at the SAE's layer,
one past ±200 at its dial) and one stored cluster.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

from starlette.applications import Starlette
from starlette.middleware.base import (
    BaseHTTPMiddleware,
    DispatchFunction,
    RequestResponseEndpoint,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from miserver.steering import steering_set_hash
from tests.conformance.fake_responses import FAULTS as RESPONSES_FAULTS
from tests.conformance.fake_responses import FakeResponses

MODEL = "fake-model"
SAE = "fake-sae"
LAYER = 3
D_SAE = 16
WORDS = ["Hello", " there", ",", " friend", "!"]
CIRCUIT = "crc_fake"
CIRCUIT_LAMBDA = 1.5
CIRCUIT_MEMBERS = [
    {"sae_id": SAE, "layer": LAYER, "index": 1, "strength": 150.0},
    {"sae_id": SAE, "layer": LAYER, "index": 2, "strength": 10.0},
]
CLUSTER = "fake-cluster"
CLUSTER_FEATURES = [{"index": 3, "strength": 40.0}, {"index": 4, "strength": -12.5}]
RUNG_1 = "suggested (attribution-supported)"
ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
FAULTS = (
    "error_shape",
    "stream_no_done",
    "steering_grammar",
    "steering_hash",
    "models_content_type",
    "usage_twice",
    "steering_created_zero",
    "lenient_json",
    "lenient_values",
    "activations_last_token",
    "probe_verdicts_unsorted",
    "rung_grammar",
    "circuit_hash",
    "cluster_hash",
    "logprobs_need_one_token",
    "logprobs_one_entry",
    "echo_first_scored",
    *RESPONSES_FAULTS,
)
PROBE = "fake-probe"
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")
MAX_DEPTH = 64
INT64 = (-(2**63), 2**63 - 1)
SURROGATE = re.compile("[\ud800-\udfff]")  # left in a decoded string only when unpaired
ENTRY = {"id": MODEL, "object": "model", "created": 1700000000, "owned_by": "fake"}
OPENAPI = {
    "openapi": "3.0.3",
    "info": {"title": "fake", "version": "1"},
    "servers": [{"url": "/v1"}],
    "paths": {
        "/models": {
            "get": {
                "responses": {
                    "200": {
                        "description": "models",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["object", "data"],
                                    "properties": {
                                        "object": {"type": "string", "enum": ["list"]},
                                        "data": {"type": "array", "items": {"type": "object"}},
                                    },
                                }
                            }
                        },
                    }
                }
            }
        }
    },
}


class Refusal(Exception):
    def __init__(self, status: int, code: str, param: str | None, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.param, self.message = status, code, param, message


class _Repeated(dict[str, Any]):
    """A JSON object that names `name` twice (the walk, which knows its path, refuses it)."""

    def __init__(self, pairs: list[tuple[str, Any]], name: str) -> None:
        super().__init__(pairs)
        self.name = name


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    names = [name for name, _ in pairs]
    repeated = next((n for i, n in enumerate(names) if n in names[:i]), None)
    return dict(pairs) if repeated is None else _Repeated(pairs, repeated)


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _unrepresentable(value: Any) -> bool:
    """A lone surrogate, NaN or an infinity, an integer past int64."""
    if isinstance(value, str):
        return SURROGATE.search(value) is not None
    if isinstance(value, float):
        return not math.isfinite(value)
    return isinstance(value, int) and not INT64[0] <= value <= INT64[1]


class Fake:
    """The fake's behaviour: which extensions it offers and which faults it has."""

    def __init__(self, faults: frozenset[str], extensions: bool) -> None:
        unknown = faults - set(FAULTS)
        assert not unknown, unknown
        self.faults = faults
        self.extensions = extensions

    # -- responses ---------------------------------------------------------------------

    def error(self, refusal: Refusal) -> JSONResponse:
        if "error_shape" in self.faults:
            return JSONResponse({"detail": refusal.message}, refusal.status)
        body = {"message": refusal.message, "type": "invalid_request_error"}
        body |= {"param": refusal.param, "code": refusal.code}
        return JSONResponse({"error": body}, refusal.status)

    def steering_value(self, body: dict[str, Any]) -> str:
        if "steering_grammar" in self.faults:
            return "nothing"
        steering = body.get("steering")
        if steering is not None and not steering.get("features"):
            return "none"
        if steering is None:
            return self.base_value(body)
        sent = [(f["index"], f["strength"]) for f in steering["features"]]
        count = sum(1 for _, s in sent if float(s) != 0.0)
        clamped = sum(1 for _, s in sent if abs(float(s)) > 200.0)
        hashed_id = f"{SAE}/layer_{LAYER}" if "steering_hash" in self.faults else SAE
        value = f'inline;sae="{SAE}";layer={LAYER};features={count};'
        value += f'hash="{steering_set_hash(hashed_id, sent)}"'
        return value + (f";clamped={clamped}" if clamped else "")

    def base_value(self, body: dict[str, Any]) -> str:
        """Without inline steering: the named cluster, else the active circuit (off at 0)."""
        dial = body.get("steering_intensity")
        if dial in (0, "off") or _scoring(body):  # off, or scoring
            return "none"
        if body.get("profile") == CLUSTER:
            lam = float(dial) if isinstance(dial, int | float) else 1.0
            stored = [(f["index"], f["strength"]) for f in CLUSTER_FEATURES]
            scaled = stored if "cluster_hash" in self.faults else [(i, v * lam) for i, v in stored]
            value = f'profile;name="{CLUSTER}";source=request;intensity="{lam!r}";sae="{SAE}";'
            return value + f'layer={LAYER};features=2;hash="{steering_set_hash(SAE, scaled)}"'
        return f'circuit;id="{CIRCUIT}";intensity="{CIRCUIT_LAMBDA!r}"'

    def rung(self) -> str:
        phrase = "causally validated (edge)" if "rung_grammar" in self.faults else RUNG_1
        return f'1;language="{phrase}"'

    def circuits(self) -> dict[str, Any]:
        """GET /api/circuits/active: the one circuit, its layer hash, the evidence."""
        scaled = [(m["index"], m["strength"] * CIRCUIT_LAMBDA) for m in CIRCUIT_MEMBERS]
        hashed = f"{SAE}/layer_{LAYER}" if "circuit_hash" in self.faults else SAE
        layer = {"sae_id": SAE, "layer": LAYER, "attached": True, "features": 2, "clamped": 1}
        layer["hash"] = steering_set_hash(hashed, scaled)
        circuit = {"id": CIRCUIT, "rung": 1, "language": RUNG_1, "mode": "circuit"}
        circuit |= {"intensity": CIRCUIT_LAMBDA, "resolved_intensity": CIRCUIT_LAMBDA}
        circuit |= {"steering": True, "layers": [layer], "error": None}
        evidence = {"rung": 1, "language": RUNG_1, "header": f'1;language="{RUNG_1}"'}
        return {"model": MODEL, "epoch": 1, "circuits": [circuit], "steering": evidence}

    def headers(self, body: dict[str, Any], strict: str | None, stream: bool) -> dict[str, str]:
        if not self.extensions:
            return {}
        headers = {"X-miLLM-Model": MODEL}
        if "user" in body:
            if strict in ("true", "1"):
                raise Refusal(400, "unused_fields_refused", "user", "unused fields: user")
            headers["X-miLLM-Ignored-Fields"] = '"user"'
        if not stream:
            headers["X-miLLM-Steering"] = self.steering_value(body)
            if headers["X-miLLM-Steering"].startswith("circuit;"):
                headers["X-miLLM-Circuit-Rung"] = self.rung()
        return headers

    # -- request checks ----------------------------------------------------------------

    def document(self, raw: bytes) -> Any:
        """The body read as the contract reads it (strict JSON), unless a fault relaxes that."""
        lenient = "lenient_json" in self.faults
        try:
            document = json.loads(raw, object_pairs_hook=None if lenient else _object)
        except RecursionError:
            if lenient:
                raise Refusal(500, "internal_error", None, "maximum recursion depth") from None
            raise Refusal(400, "invalid_json", "body", "nested too deep") from None
        except ValueError:
            raise Refusal(400, "invalid_json", None, "the body is not JSON") from None
        self.walk(document, "", 1)
        return document

    def walk(self, value: Any, path: str, depth: int) -> None:
        """Refuse a container past MAX_DEPTH, a name given twice, an unrepresentable value."""
        deep = isinstance(value, dict | list) and depth > MAX_DEPTH
        if deep and "lenient_json" not in self.faults:
            raise Refusal(400, "invalid_json", "body", "nested too deep")
        if isinstance(value, _Repeated):
            raise Refusal(400, "invalid_json", _at(path, value.name), "a name given twice")
        if isinstance(value, dict):
            for name, item in value.items():
                self.walk(item, _at(path, name), depth + 1)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                self.walk(item, f"{path}[{index}]", depth + 1)
        elif "lenient_values" not in self.faults and _unrepresentable(value):
            raise Refusal(400, "invalid_parameter", path or "body", f"`{path}` is not a value")

    def validate(self, body: Any, strict: str | None, required: str) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise Refusal(400, "invalid_parameter", None, "the body must be a JSON object")
        if strict is not None and strict not in ("true", "false", "1", "0"):
            raise Refusal(400, "invalid_parameter", "X-miLLM-Strict", "bad X-miLLM-Strict")
        if required not in body:
            raise Refusal(400, "invalid_parameter", required, f"`{required}` is required")
        if body.get("model") != MODEL:
            raise Refusal(404, "model_not_found", "model", f"no model {body.get('model')!r}")
        temperature = body.get("temperature")
        if temperature is not None and not 0 <= temperature <= 2:
            raise Refusal(400, "invalid_parameter", "temperature", "temperature is 0..2")
        for i, message in enumerate(body.get("messages") or []):
            if message.get("role") not in ROLES:
                raise Refusal(400, "invalid_parameter", f"messages[{i}].role", "unknown role")
        if (body.get("n") or 1) > 1 and body.get("stream"):
            raise Refusal(400, "invalid_parameter", "n", "n > 1 cannot stream")
        for name in ("logprobs", "echo"):
            if body.get(name) not in (None, False) and not self.extensions:
                raise Refusal(400, "field_not_honoured", name, f"`{name}` is not honoured")
        one = body.get("max_tokens") == 1
        if body.get("allowed_token_ids") is not None and not one:
            raise Refusal(400, "invalid_parameter", "max_tokens", "scoring needs max_tokens 1")
        asks = body.get("logprobs") not in (None, False)
        if asks and not one and "logprobs_need_one_token" in self.faults:
            raise Refusal(400, "invalid_parameter", "max_tokens", "logprobs needs max_tokens 1")
        return body


def _scoring(body: dict[str, Any]) -> bool:
    """Contract 0.17.0's rule: `allowed_token_ids`, or logprobs with `max_tokens: 1`, scores;
    any other request with logprobs generates and reports its tokens."""
    asks = body.get("logprobs") not in (None, False)
    return body.get("allowed_token_ids") is not None or (asks and body.get("max_tokens") == 1)


def _words(body: dict[str, Any]) -> list[str]:
    if body.get("echo") and body.get("max_tokens") == 0:
        return []  # the prompt's log-probabilities only
    return WORDS[: min(body.get("max_tokens") or len(WORDS), len(WORDS))]


def _usage(body: dict[str, Any], completion: int) -> dict[str, int]:
    return {"prompt_tokens": 7, "completion_tokens": completion, "total_tokens": 7 + completion}


def _finish(body: dict[str, Any], words: list[str]) -> str:
    return "length" if body.get("max_tokens") and len(words) >= body["max_tokens"] else "stop"


def _activations(body: dict[str, Any], completion: int, faults: frozenset[str]) -> dict[str, Any]:
    """`millm` for a request asking for activations: each position fed (prompt then completion
    less the last token; the `activations_last_token` fault lists that one too)."""
    ask = body["return_sae_activations"] or {}
    fed = _usage(body, completion)["total_tokens"] - (
        0 if "activations_last_token" in faults else 1
    )
    shown = {"all": range(fed), "last": range(fed - 1, fed)}[ask.get("positions") or "last"]
    features = [{"index": 1, "value": 2.0}, {"index": 0, "value": 0.5}][: ask.get("top_k") or 8]
    positions = [{"position": p, "token_id": p, "features": features} for p in shown]
    reading = {"sae_id": SAE, "layer": LAYER, "read_point": "post_steering"}
    return {"sae_activations": reading | {"positions": positions, "note": "fake"}}


FINGERPRINT = f"millm:{MODEL}@0000000:float32/none:fake"


def _probe_results(request: Request, reply_id: str) -> list[dict[str, Any]]:
    """The armed fake probe's results (two windows), in the request's trace if it sent a valid
    `traceparent` once."""
    sent = request.headers.getlist("traceparent")
    match = TRACEPARENT.fullmatch(sent[0]) if len(sent) == 1 else None
    trace = match.group(1) if match and int(match.group(1), 16) else "f" * 32
    results = []
    for window, score in (("completion", 0.25), ("last_user", 0.75)):
        flagged = score >= 0.5
        results.append(
            {
                "schema": "mi.probe.result/v1",
                "result_id": "pr_" + ("0" if flagged else "1") * 32,
                "probe": PROBE,
                "name": PROBE,
                "window": window,
                "index": 0,
                "outcome": "scored",
                "reason": "above_threshold" if flagged else "below_threshold",
                "verdict": "flagged" if flagged else "clear",
                "score": score,
                "scored": True,
                "threshold": 0.5,
                "tokens": 3,
                "layer": LAYER,
                "detector_digest": "sha256:" + "a" * 64,
                "decision_digest": "sha256:" + "b" * 64,
                "served": {"backend": "serial", "engine": "fake", "model": MODEL},
                "trace_id": trace,
                "request_id": reply_id,
                "created": 1700000000,
            }
        )
    return results


def _probe_header(results: list[dict[str, Any]], faults: frozenset[str]) -> str:
    entries = [
        f'"{r["probe"]}";window={r["window"]};verdict={r["verdict"]};score="{r["score"]!r}";'
        f"reason={r['reason']}"
        for r in results
    ]
    return ", ".join(reversed(entries) if "probe_verdicts_unsorted" in faults else entries)


TOP = {"Hello": -0.25, "Hi": -2.0, "Hey": -3.0}


def _chat_scored(body: dict[str, Any]) -> dict[str, Any]:
    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    top = [entry(t, p) for t, p in TOP.items()][: body.get("top_logprobs") or 0]
    logprobs = {"content": [{**entry("Hello", TOP["Hello"]), "top_logprobs": top}]}
    message = {"role": "assistant", "content": "Hello"}
    return {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": "length"}


def _alternatives(word: str) -> list[tuple[str, float]]:
    """A generated word's alternatives, most probable first: the word itself leads."""
    others = [(t, p) for t, p in list(TOP.items())[1:] if t != word]
    return [(word, TOP["Hello"]), *others]


def _chat_generated(words: list[str], body: dict[str, Any], faults: frozenset[str]) -> Any:
    """`logprobs` of a chat generation: one entry per word (the last only, under a fault)."""
    if not body.get("logprobs"):
        return None

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    count = body.get("top_logprobs") or 0
    content = [
        {**entry(w, -0.25), "top_logprobs": [entry(t, p) for t, p in _alternatives(w)][:count]}
        for w in words
    ]
    return {"content": content[-1:] if "logprobs_one_entry" in faults else content}


def _text_generated(
    prompt: str, words: list[str], body: dict[str, Any], faults: frozenset[str]
) -> dict[str, Any]:
    """A text completion's choice: echo puts the prompt (and its tokens, the first `null`)
    first; with `logprobs` every generated word has its entry."""
    echoed = re.findall(r"\s*\S+|\s+", prompt) if body.get("echo") else []
    text = "".join(echoed + words)
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": _finish(body, words)}
    count = body.get("logprobs")
    if count is None or count is False:
        return choice | {"logprobs": None}
    tokens = echoed + words
    values: list[float | None] = [-1.5] * len(echoed) + [-0.25] * len(words)
    tops: list[dict[str, float] | None] = [{t: -1.5} for t in echoed]
    tops += [dict(_alternatives(w)[: max(count, 1)]) for w in words]
    if echoed and "echo_first_scored" not in faults:
        values[0], tops[0] = None, None
    start = 0 if echoed else len(prompt)
    offsets = [start + len("".join(tokens[:i])) for i in range(len(tokens))]
    logprobs = {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops}
    return choice | {"logprobs": logprobs | {"text_offset": offsets}}


def _text_scored(prompt: str, count: int) -> dict[str, Any]:
    top = dict(list({" Paris": -0.25, " the": -2.7, " London": -4.3}.items())[:count])
    logprobs = {
        "tokens": [" Paris"],
        "token_logprobs": [-0.25],
        "top_logprobs": [top],
        "text_offset": [len(prompt)],
    }
    return {"index": 0, "text": " Paris", "logprobs": logprobs, "finish_reason": "length"}


def fake_app(
    faults: frozenset[str] = frozenset(), *, extensions: bool = True, api_key: str | None = None
) -> Starlette:
    fake = Fake(faults, extensions)

    def sse(frames: Iterator[dict[str, Any]], headers: dict[str, str]) -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            for frame in frames:
                yield f"data: {json.dumps(frame)}\n\n".encode()
            if "stream_no_done" not in faults:
                yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    def chunks(
        body: dict[str, Any],
        obj: str,
        texts: list[str],
        delta: bool,
        verdicts: list[dict[str, Any]] | None = None,
    ) -> Iterator[dict[str, Any]]:
        base: dict[str, Any] = {"id": "chatcmpl-fake" if delta else "cmpl-fake", "object": obj}
        base |= {"created": 1, "model": MODEL, "system_fingerprint": FINGERPRINT}
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        if include:
            base["usage"] = None

        def choice(text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
            if not delta:
                return {"index": 0, "text": text or "", "finish_reason": finish}
            d: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            return {
                "index": 0,
                "delta": d | ({"content": text} if text else {}),
                "finish_reason": finish,
            }

        if delta:
            yield base | {"choices": [choice(None, None, role=True)]}
        for text in texts:
            yield base | {"choices": [choice(text, None)]}
        usage = _usage(body, len(texts))
        finish = base | {"choices": [choice(None, _finish(body, texts))]}
        if (extensions and not include) or "usage_twice" in faults:
            finish["usage"] = usage  # miLLM's finish chunk carries usage (OAI-STREAM-05)
        yield finish
        if extensions and verdicts is not None:
            yield base | {"choices": [], "millm_probe_verdicts": verdicts}
        if extensions and body.get("return_sae_activations"):
            yield base | {"choices": [], "millm": _activations(body, len(texts), faults)}
        last = base | {"choices": []} | ({"usage": usage} if include else {})
        if extensions and "steering_created_zero" in faults:  # the old, separate chunk
            if include:
                yield last
            last = base | {"created": 0, "choices": []}
        if extensions:
            last["millm_steering"] = fake.steering_value(body)
        if include or extensions:
            yield last

    async def chat(request: Request) -> Response:
        strict = request.headers.get("X-miLLM-Strict")
        try:
            body = fake.validate(fake.document(await request.body()), strict, "messages")
            headers = fake.headers(body, strict, bool(body.get("stream")))
        except Refusal as refusal:
            return fake.error(refusal)
        words = _words(body)
        watched = extensions and not _scoring(body)  # scoring is never monitored
        if body.get("stream"):
            verdicts = _probe_results(request, "chatcmpl-fake") if watched else None
            return sse(chunks(body, "chat.completion.chunk", words, True, verdicts), headers)
        if _scoring(body):
            choice = _chat_scored(body)
        else:
            message = {"role": "assistant", "content": "".join(words)}
            choice = {"index": 0, "message": message, "finish_reason": _finish(body, words)}
            logprobs = _chat_generated(words, body, faults)
            if logprobs is not None:
                choice["logprobs"] = logprobs
        reply = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1700000000}
        reply |= {"model": MODEL, "system_fingerprint": FINGERPRINT, "choices": [choice]}
        if fake.extensions and body.get("return_sae_activations"):
            reply["millm"] = _activations(body, len(words), faults)
        if watched:
            reply["millm_probe_verdicts"] = _probe_results(request, "chatcmpl-fake")
            headers["X-miLLM-Probe-Verdicts"] = _probe_header(reply["millm_probe_verdicts"], faults)
        return JSONResponse(reply | {"usage": _usage(body, len(words))}, headers=headers)

    async def completions(request: Request) -> Response:
        strict = request.headers.get("X-miLLM-Strict")
        try:
            body = fake.validate(fake.document(await request.body()), strict, "prompt")
            headers = fake.headers(body, strict, bool(body.get("stream")))
        except Refusal as refusal:
            return fake.error(refusal)
        words = _words(body)
        watched = extensions and not _scoring(body)  # scoring is never monitored
        if body.get("stream"):
            verdicts = _probe_results(request, "cmpl-fake") if watched else None
            return sse(chunks(body, "text_completion", words, False, verdicts), headers)
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        if _scoring(body) and body.get("logprobs") is not None and not body.get("echo"):
            choices = [_text_scored(prompts[0], body["logprobs"])]
        else:
            choices = [
                _text_generated(prompt, words, body, faults) | {"index": i}
                for i, prompt in enumerate(prompts)
            ]
        reply = {"id": "cmpl-fake", "object": "text_completion", "created": 1700000000}
        reply |= {"model": MODEL, "system_fingerprint": FINGERPRINT, "choices": choices}
        if watched:
            reply["millm_probe_verdicts"] = _probe_results(request, "cmpl-fake")
            headers["X-miLLM-Probe-Verdicts"] = _probe_header(reply["millm_probe_verdicts"], faults)
        return JSONResponse(reply | {"usage": _usage(body, len(words))}, headers=headers)

    async def models(request: Request) -> Response:
        body = {"object": "list", "data": [ENTRY]}
        if "models_content_type" in faults:
            return Response(json.dumps(body), media_type="text/plain")
        return JSONResponse(body)

    async def model(request: Request) -> Response:
        if request.path_params["model_id"] == MODEL:
            return JSONResponse(ENTRY)
        return fake.error(Refusal(404, "model_not_found", "model", "no such model"))

    async def openapi(request: Request) -> Response:
        return (
            JSONResponse(OPENAPI)
            if extensions
            else fake.error(Refusal(404, "not_found", None, "Not Found"))
        )

    async def steering(request: Request) -> Response:
        attachment = {"model": MODEL, "sae_id": SAE, "layer": LAYER, "d_sae": D_SAE}
        attachment |= {"features": [], "live": False}
        state = {"model": MODEL, "epoch": 1, "steering": "none", "attachments": [attachment]}
        return JSONResponse(state | {"active_profile": None})

    async def probes(request: Request) -> Response:
        listed = {"name": PROBE, "armed": True, "windows": ["last_user", "completion"]}
        return JSONResponse({"object": "list", "data": [listed]})

    async def circuits_active(request: Request) -> Response:
        return JSONResponse(fake.circuits())

    async def circuit(request: Request) -> Response:
        if request.path_params["circuit_id"] != CIRCUIT:
            return fake.error(Refusal(404, "circuit_not_found", "id", "no such circuit"))
        document = {"schema": "mi.circuit/v1", "id": CIRCUIT, "members": CIRCUIT_MEMBERS}
        return JSONResponse({"id": CIRCUIT, "document": document | {"evidence": {"rung": 1}}})

    async def profiles(request: Request) -> Response:
        cluster = {"name": CLUSTER, "sae_id": SAE, "layer": LAYER, "features": CLUSTER_FEATURES}
        return JSONResponse({"object": "list", "data": [cluster]})

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models),
        Route("/v1/openapi.json", openapi),
        Route("/v1/models/{model_id:path}", model),
    ]
    if extensions:
        routes.append(Route("/api/steering", steering))
        routes.append(Route("/api/probes", probes))
        routes.append(Route("/api/circuits/active", circuits_active))
        routes.append(Route("/api/circuits/{circuit_id}", circuit))
        routes.append(Route("/api/profiles", profiles))
        refuse = lambda status, code, param, message: fake.error(  # noqa: E731
            Refusal(status, code, param, message)
        )
        routes += FakeResponses(MODEL, faults, refuse).routes()
    app = Starlette(routes=routes)
    if api_key is not None:
        app.add_middleware(BaseHTTPMiddleware, dispatch=_key_check(fake, api_key))
    return app


def _key_check(fake: Fake, key: str) -> DispatchFunction:
    async def dispatch(request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.headers.get("authorization") != f"Bearer {key}":
            return fake.error(Refusal(401, "invalid_api_key", None, "a key is needed"))
        return await call_next(request)

    return dispatch
