"""The targets: every route of spec/openapi/v1.yaml and api.yaml, each with a base body.

A base body is valid, cheap (one token at most) and leaves nothing behind that
changes a later reply: its model, SAE and profile names do not exist (the
profile `hostile` is created and deleted; it is never made active; the probe
`hostile` likewise, never armed; the circuit `hostile` names an SAE that does
not exist, so it is never stored; downloads name a catalog id that does not
exist, so none starts; the /api/hf bodies name a repository the site does not
have, so nothing is added: the server under the corpus runs with
`--hf-endpoint` on a fake site, tools/fakehub.py), and the
config change names an unknown key; the plan is read with `?cached=1` (no
measurement), so there is never a plan to apply (409 `no_plan`). The corpus's
cases are edits of these bodies; `routes.json` carries them, so the tests and
the bench read them as data.
"""

from __future__ import annotations

from typing import Any

from . import spec

MODEL = "SmolLM2-135M-Instruct:Q4_1"  # the embedded default: `miserver serve` with no --model
SAE = "/api/steering/attachments/hostile-sae/0"

_CHAT: dict[str, Any] = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": [{"type": "text", "text": "Say hi."}], "name": "hostile"},
    ],
    "max_tokens": 1,
    "temperature": 0,
    "top_p": 1.0,
    "seed": 7,
    "frequency_penalty": 0.1,
    "presence_penalty": 0.1,
    "stop": ["\n\n", "END"],
    "user": "hostile-user",
    "think": False,
}
_CHAT_STREAM: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say hi."}],
    "max_tokens": 1,
    "temperature": 0,
    "stream": True,
    "stream_options": {"include_usage": True},
    "stop": ["END"],
}
_TOOL_CALL = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
_CHAT_TOOLS: dict[str, Any] = {
    "model": MODEL,
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_1", "type": "function", "function": _TOOL_CALL}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather of a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "max_tokens": 1,
    "temperature": 0,
}
_CHAT_FORMAT: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Is water wet?"}],
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "verdict",
            "description": "A verdict.",
            "schema": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
            },
            "strict": True,
        },
    },
    "max_tokens": 1,
    "temperature": 0,
}
_COMPLETION: dict[str, Any] = {
    "model": MODEL,
    "prompt": "Once upon a time",
    "max_tokens": 1,
    "temperature": 0,
    "top_p": 1.0,
    "seed": 7,
    "stop": ["\n"],
    "echo": False,
    "user": "hostile-user",
}
_PROFILE: dict[str, Any] = {
    "sae_id": "hostile-sae",
    "layer": 0,
    "features": [{"index": 0, "strength": 1.5}],
    "description": "A hostile profile.",
    "intensity": 1.0,
    "intensity_range": [0.5, 1.5],
}
_PROBE: dict[str, Any] = {
    "detector": {
        "kind": "linear",
        "layer": 0,
        "weight": [0.5, -0.5],
        "bias": 0.0,
        "link": "identity",
    },
    "threshold": 1.0,
    "windows": ["prompt", "last_user"],
    "aggregate": "mean",
    "description": "A hostile probe, never armed.",
    "armed": False,
}

_RESPONSE: dict[str, Any] = {
    "model": MODEL,
    "instructions": "Answer in one word.",
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Say hi."}]},
        {"type": "message", "role": "user", "content": "Again."},
    ],
    "max_output_tokens": 1,
    "temperature": 0,
    "top_p": 1.0,
    "store": False,  # leaves nothing behind
    "metadata": {"case": "hostile"},
    "text": {"format": {"type": "text"}},
    "reasoning": {"effort": "none"},
}
_RESPONSE_STREAM: dict[str, Any] = {
    "model": MODEL,
    "input": "Say hi.",
    "max_output_tokens": 1,
    "temperature": 0,
    "stream": True,
    "store": False,
}
RESPONSE = "/v1/responses/resp_hostile"  # never stored
FILE = "/v1/files/file-hostile"  # never kept: an upload's id is `file-` and 24 hex digits
BATCH = "/v1/batches/batch_hostile"  # never made: a batch's id is `batch_` and 24 hex digits
_MESSAGE: dict[str, Any] = {
    "model": MODEL,
    "system": "Answer in one word.",
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Say hi."}]},
        {"role": "assistant", "content": "Hi"},
        {"role": "user", "content": "Again."},
    ],
    "max_tokens": 1,
    "temperature": 0,
    "top_p": 1.0,
    "top_k": 5,
    "stop_sequences": ["END"],
    "metadata": {"user_id": "hostile"},
}
_MESSAGE_STREAM: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say hi."}],
    "max_tokens": 1,
    "temperature": 0,
    "stream": True,
}
_MESSAGE_COUNT: dict[str, Any] = {
    "model": MODEL,
    "system": [{"type": "text", "text": "Answer in one word."}],
    "messages": [{"role": "user", "content": "Say hi."}],
}

# name: (method, path, base body or None)
TARGETS: dict[str, tuple[str, str, Any]] = {
    "chat": ("POST", "/v1/chat/completions", _CHAT),
    "chat-stream": ("POST", "/v1/chat/completions", _CHAT_STREAM),
    "chat-tools": ("POST", "/v1/chat/completions", _CHAT_TOOLS),
    "chat-format": ("POST", "/v1/chat/completions", _CHAT_FORMAT),
    "responses": ("POST", "/v1/responses", _RESPONSE),
    "responses-stream": ("POST", "/v1/responses", _RESPONSE_STREAM),
    "response-cancel": ("POST", f"{RESPONSE}/cancel", None),
    "response-delete": ("DELETE", RESPONSE, None),
    "file-upload": (
        "POST",
        "/v1/files",
        {"purpose": "batch", "filename": "hostile.jsonl", "content": '{"custom_id": "h"}\n'},
    ),
    "files": ("GET", "/v1/files", None),
    "file": ("GET", FILE, None),
    "file-content": ("GET", f"{FILE}/content", None),
    "file-delete": ("DELETE", FILE, None),
    "batch-create": (
        "POST",
        "/v1/batches",
        {
            "input_file_id": "file-hostile",
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"run": "hostile"},
        },
    ),
    "batches": ("GET", "/v1/batches", None),
    "batch": ("GET", BATCH, None),
    "batch-cancel": ("POST", f"{BATCH}/cancel", None),
    "messages": ("POST", "/v1/messages", _MESSAGE),
    "messages-stream": ("POST", "/v1/messages", _MESSAGE_STREAM),
    "messages-count": ("POST", "/v1/messages/count_tokens", _MESSAGE_COUNT),
    "completions": ("POST", "/v1/completions", _COMPLETION),
    "completions-ids": (
        "POST",
        "/v1/completions",
        {"model": MODEL, "prompt": [[1, 2, 3], [4, 5]], "max_tokens": 1, "temperature": 0},
    ),
    "completions-stream": (
        "POST",
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": ["Once upon a time"],
            "max_tokens": 1,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    "embeddings": (
        "POST",
        "/v1/embeddings",
        {
            "model": MODEL,
            "input": ["hello", "world"],
            "encoding_format": "float",
            "pooling": "mean",
            "normalize": True,
            "user": "hostile-user",
        },
    ),
    "embeddings-ids": ("POST", "/v1/embeddings", {"model": MODEL, "input": [[1, 2, 3], [4, 5]]}),
    "tokenize": (
        "POST",
        "/v1/tokenize",
        {
            "model": MODEL,
            "prompt": "Say hi.",
            "add_special_tokens": True,
            "return_token_strs": True,
        },
    ),
    "tokenize-chat": (
        "POST",
        "/v1/tokenize",
        {
            "model": MODEL,
            "messages": _CHAT["messages"],
            "add_generation_prompt": True,
            "tools": _CHAT_TOOLS["tools"],
        },
    ),
    "v1-detokenize": ("POST", "/v1/detokenize", {"model": MODEL, "tokens": [1, 2, 3]}),
    "load": ("POST", "/api/session/load", {"model": "hostile-no-such-model"}),
    "unload": ("POST", "/api/session/unload", None),
    "cancel": ("POST", "/api/cancel", None),
    "decide": (
        "POST",
        "/api/decide",
        {"prefix": "Is the sky blue?", "suffix": " Answer:", "choices": ["yes", "no"]},
    ),
    "detokenize": ("POST", "/api/detokenize", {"tokens": [1, 2, 3]}),
    "attach": ("POST", "/api/steering/attachments", {"sae_id": "hostile-sae", "layer": 0}),
    "detach": ("DELETE", SAE, None),
    "features-put": (
        "PUT",
        f"{SAE}/features",
        {"features": [{"index": 0, "strength": 1.5}, {"index": 1, "strength": -0.5}]},
    ),
    "features-delete": ("DELETE", f"{SAE}/features", None),
    "active-profile-put": ("PUT", "/api/steering/active-profile", {"name": "hostile-none"}),
    "profile-put": ("PUT", "/api/profiles/hostile", _PROFILE),
    "profile-delete": ("DELETE", "/api/profiles/hostile", None),
    "cluster-import": (
        "POST",
        "/api/clusters",
        {"schema": "mi.cluster/v1", "name": "hostile", **_PROFILE},
    ),
    "profile-dial": ("PUT", "/api/profiles/hostile/dial", {"intensity": 1.0}),
    "circuit-import": (
        "POST",
        "/api/circuits",
        {
            "schema": "mi.circuit/v1",
            "id": "hostile",
            "members": [{"sae_id": "hostile-sae", "layer": 0, "index": 0, "strength": 1.5}],
            "evidence": {"rung": 1, "ladder": [{"rung": 1, "summary": "hostile"}]},
            "intensity_range": [0.5, 1.5],
        },
    ),
    "circuit-dial": ("PUT", "/api/circuits/hostile/dial", {"intensity": 1.0}),
    "circuit-activate": ("PUT", "/api/circuits/hostile/active", None),
    "circuit-deactivate": ("DELETE", "/api/circuits/hostile/active", None),
    "circuit-delete": ("DELETE", "/api/circuits/hostile", None),
    "download": ("POST", "/api/models/download", {"id": "hostile-none"}),
    "download-cancel": ("DELETE", "/api/models/download/hostile-none", None),
    "partial-delete": ("DELETE", "/api/models/partial/hostile-none", None),
    "hf-search": ("POST", "/api/hf/search", {"query": "hostile", "token": "hostile-token"}),
    "hf-models": ("POST", "/api/hf/models", {"repo": "hostile/none", "token": "hostile-token"}),
    "hf-add": ("POST", "/api/hf/add", {"repo": "hostile/none", "name": "hostile.gguf"}),
    "hf-inspect": ("POST", "/api/hf/inspect", {"repo": "hostile/none", "name": "hostile.gguf"}),
    "hf-forget": ("DELETE", "/api/hf/entry/hf:hostile%2Fnone%2Fhostile.gguf", None),
    "lock-put": ("PUT", "/api/steering/lock", {"model": "hostile-no-such-model"}),
    "lock-delete": ("DELETE", "/api/steering/lock", None),
    "probe-put": ("PUT", "/api/probes/hostile", _PROBE),
    "probe-delete": ("DELETE", "/api/probes/hostile", None),
    "probe-arm": ("POST", "/api/probes/hostile-none/arm", None),
    "probe-disarm": ("POST", "/api/probes/hostile/disarm", None),
    "probe-import": (
        "POST",
        "/api/probes/import",
        {"path": "/nonexistent/hostile-probe.json", "armed": False},
    ),
    "probe-score": (
        "POST",
        "/api/probes/score",
        {"model": MODEL, "input": "Say hi.", "probes": ["hostile"]},
    ),
    "config-put": (
        "PUT",
        "/api/config",
        {"values": {"hostile-key": "x"}, "reset": ["hostile-key"], "auto_plan": False},
    ),
    "plan-apply": ("POST", "/api/plan/apply", None),
    "v1-openapi": ("GET", "/v1/openapi.json", None),
    "models": ("GET", "/v1/models", None),
    "model": ("GET", f"/v1/models/{MODEL}", None),
    "response": ("GET", RESPONSE, None),
    "response-items": ("GET", f"{RESPONSE}/input_items?limit=2&order=asc", None),
    "tokenizer-info": ("GET", f"/v1/tokenizer_info?model={MODEL}", None),
    "metrics": ("GET", "/v1/metrics", None),
    "liveness": ("GET", "/v1/health", None),
    "readiness": ("GET", "/v1/health/ready", None),
    "api-openapi": ("GET", "/api/openapi.json", None),
    "info": ("GET", "/api/info", None),
    "health-inference": ("GET", "/api/health/inference", None),
    "events": ("GET", "/api/events", None),
    "local-models": ("GET", "/api/models", None),
    "schema": ("GET", "/api/schemas/millm-scoring-api-v1.json", None),
    "saes": ("GET", "/api/saes", None),
    "steering": ("GET", "/api/steering", None),
    "active-profile": ("GET", "/api/steering/active-profile", None),
    "profiles": ("GET", "/api/profiles", None),
    "profile": ("GET", "/api/profiles/hostile", None),
    "lock": ("GET", "/api/steering/lock", None),
    "circuits": ("GET", "/api/circuits", None),
    "circuits-active": ("GET", "/api/circuits/active", None),
    "circuit": ("GET", "/api/circuits/hostile", None),
    "probes": ("GET", "/api/probes", None),
    "probe": ("GET", "/api/probes/hostile", None),
    "probe-events": ("GET", "/api/probes/events", None),
    "params": ("GET", "/api/params", None),
    "config": ("GET", "/api/config", None),
    "plan": ("GET", "/api/plan?cached=1", None),
}


def document(path: str) -> str:
    return "api" if path.startswith("/api") else "v1"


def json_targets() -> list[str]:
    """Targets whose route takes a JSON body (spec), in table order."""
    return [
        name
        for name, (method, path, _) in TARGETS.items()
        if spec.body_schema(document(path), method, path) is not None
    ]


def route_sets() -> dict[str, list[str]]:
    """The named sets a case may give as its `routes`."""
    writes = [name for name, (method, _, _) in TARGETS.items() if method != "GET"]
    seen: set[tuple[str, str]] = set()
    every_body = []
    for name in writes:
        method, path, _ = TARGETS[name]
        if (method, path) not in seen:
            seen.add((method, path))
            every_body.append(name)
    return {
        "every-body": every_body,
        "json": json_targets(),
        "bodyless": [n for n in writes if n not in json_targets()],
        "get": [name for name, (method, _, _) in TARGETS.items() if method == "GET"],
    }


def uncovered() -> list[str]:
    """Operations of either document that no target reaches (the generator refuses any)."""
    reached = {(m, spec.template(document(p), m, p)) for m, p, _ in TARGETS.values()}
    every = spec.operations("v1") + spec.operations("api")
    return [f"{m} {p}" for m, p in every if (m, p) not in reached]


def routes_file() -> dict[str, Any]:
    """routes.json: the model, the targets and the route sets."""
    return {
        "model": MODEL,
        "targets": {
            name: {"method": m, "path": p, "body": body} for name, (m, p, body) in TARGETS.items()
        },
        "sets": route_sets(),
    }
