"""Probes through HTTP (REQ-000 PROBE; issue 18 items 2-4), on the transformers SmolLM2 with
the French-vs-English probe trained by tools/probe_train.py armed. References are direct
forwards of the same renders, hooked at the probe's layer."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import torch
from safetensors.torch import load_file
from starlette.testclient import TestClient

from miserver import contract
from miserver.app import Server
from miserver.engines.base import ChatPrompt
from miserver.engines.transformers import TransformersEngine
from miserver.probes.verdicts import parse, serialize
from miserver.steering.sae import SAE
from tests.conftest import GGUF_ID, MODEL_ID, SAE_ID, LocalClient, steering_settings
from tests.engines import direct
from tests.events import data_of
from tests.prometheus import samples
from tools.uvicorn_thread import uvicorn_serving

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HEADER = "x-millm-probe-verdicts"
FRENCH = "Bonjour, pouvez-vous me dire quelle heure il est à Paris maintenant ?"
ENGLISH = "Hello, could you tell me what time it is in London right now?"
LAYER = 12
RESULT_SCHEMA = json.loads(contract.schema_bytes("mi-probe-result-v1.json"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("probes") / "data"


@pytest.fixture(scope="module")
def server(data_dir: Path, saes_dir: Path) -> Iterator[TestClient]:
    with LocalClient(
        Server(steering_settings(data_dir, saes_dir)), raise_server_exceptions=False
    ) as client:
        yield client


@pytest.fixture(autouse=True)
def armed(server: TestClient, trained_probe: Path) -> Iterator[None]:
    """The French probe imported and armed for every test; no probe and no attachment after."""
    response = server.post("/api/probes/import", json={"path": str(trained_probe), "armed": True})
    assert response.status_code in (200, 201), response.text
    yield
    for p in server.get("/api/probes").json()["data"]:
        assert server.delete(f"/api/probes/{p['name']}", headers=JSON).status_code == 200
    for a in server.get("/api/steering").json()["attachments"]:
        server.delete(f"/api/steering/attachments/{a['sae_id']}/{a['layer']}", headers=JSON)


JSON = {"Content-Type": "application/json"}


def chat(text: str, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": text}]
    return {"model": MODEL_ID, "messages": messages, "max_tokens": 8, "temperature": 0, **extra}


def verdicts(response: httpx.Response) -> list[dict[str, Any]]:
    """The body's results, each valid against the published schema and sorted, after
    checking the header says the same."""
    assert response.status_code == 200, response.text
    body = response.json()
    results: list[dict[str, Any]] = body["millm_probe_verdicts"]
    for result in results:
        jsonschema.validate(result, RESULT_SCHEMA)
        assert result["request_id"] == body["id"]
    assert results == sorted(results, key=lambda r: (r["probe"], r["window"], r["index"]))
    assert response.headers[HEADER] == serialize(results, choices=len(body["choices"]))
    return results


def by_window(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["window"]: r for r in results}


def probe_weights(trained_probe: Path) -> tuple[torch.Tensor, float]:
    tensors = load_file(str(trained_probe.parent / "french.safetensors"))
    return tensors["weight"], float(tensors["bias"][0])


def test_manage_probes_and_they_survive_a_restart(
    server: TestClient, data_dir: Path, saes_dir: Path
) -> None:
    """Issue 18 item 2: list, get, arm, disarm; definitions and arming persist in SQLite, so
    a server started again on the same data dir has them; names route segments take, and
    unknown probes, are refused."""
    listed = server.get("/api/probes").json()["data"]
    assert [(p["name"], p["armed"], p["d_model"]) for p in listed] == [("french", True, 576)]
    assert server.post("/api/probes/french/disarm", headers=JSON).json()["armed"] is False
    assert "x-millm-probe-verdicts" not in server.post(CHAT, json=chat(FRENCH)).headers
    assert server.post("/api/probes/french/arm", headers=JSON).json()["armed"] is True
    put = server.put(
        "/api/probes/bias-only",
        json={
            "detector": {"kind": "linear", "layer": 3, "weight": [0.0] * 576, "bias": 2.0},
            "threshold": 1.0,
            "windows": ["prompt"],
        },
    )
    assert put.status_code == 201, put.text
    with LocalClient(Server(steering_settings(data_dir, saes_dir), preload=False)) as again:
        found = {p["name"]: p for p in again.get("/api/probes").json()["data"]}
    assert found["french"]["armed"] is True and found["bias-only"]["armed"] is False
    assert found["french"]["detector_digest"] == listed[0]["detector_digest"]
    missing = server.post("/api/probes/nothing/arm", headers=JSON)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "probe_not_found")
    small = {
        "detector": {"kind": "linear", "layer": 3, "weight": [1.0]},
        "threshold": 0,
        "windows": ["prompt"],
    }
    for name in ("events", "score", "Upper"):  # a route's segment, or not a name
        refused = server.put(f"/api/probes/{name}", json=small)
        assert (refused.status_code, refused.json()["error"]["param"]) == (400, "name")


def test_chat_verdicts_follow_the_language(server: TestClient) -> None:
    """OAI-PROBE-01, OAI-PROBE-02, OAI-PROBE-03, OAI-PROBE-05, OAI-PROBE-10..14, issue 18
    item 4: the probe flags a French user message and clears an English one, in the header
    and the body alike; each result states how the request was served (a row of the
    batch: the server batches by default, issue 43)."""
    french = by_window(verdicts(server.post(CHAT, json=chat(FRENCH))))
    english = by_window(verdicts(server.post(CHAT, json=chat(ENGLISH))))
    assert french["last_user"]["verdict"] == "flagged" and french["last_user"]["score"] > 0.9
    assert english["last_user"]["verdict"] == "clear" and english["last_user"]["score"] < 0.1
    for result in (*french.values(), *english.values()):
        assert result["served"] == {
            "backend": "batch",
            "engine": "transformers",
            "model": MODEL_ID,
        }
        assert result["outcome"] == "scored" and result["name"] == "french"
        assert result["tokens"] > 0 and result["layer"] == LAYER


def test_last_user_score_equals_a_direct_forward(
    server: TestClient, reference: TransformersEngine, trained_probe: Path
) -> None:
    """OAI-PROBE-13: the `last_user` score is sigmoid(mean(weight . h + bias)) over the
    user message's content in the render, h read at the probe's layer by a direct forward
    of the same ids."""
    result = by_window(verdicts(server.post(CHAT, json=chat(FRENCH))))["last_user"]
    prompt = ChatPrompt(messages=[{"role": "user", "content": FRENCH}])
    ids = reference.render_chat(prompt)
    span = reference.user_span(prompt)
    assert span is not None
    weight, bias = probe_weights(trained_probe)
    rows = direct(reference, ids, LAYER)[span[0] : span[1]]
    expected = torch.sigmoid((rows @ weight + bias).double().mean()).item()
    assert result["tokens"] == span[1] - span[0]
    assert result["score"] == pytest.approx(expected, abs=1e-4)
    assert reference.decode(ids[span[0] : span[1]]) == FRENCH


def test_text_completion_verdicts_and_stream_order(server: TestClient) -> None:
    """OAI-PROBE-01, OAI-PROBE-08, OAI-STREAM-09 (open points 19, 20): a text completion
    reports too (its `last_user` is the whole prompt); a stream carries the results on one
    `choices: []` chunk after the choices, then the activations, then the steering chunk."""
    plain = verdicts(
        server.post(
            COMPLETIONS,
            json={
                "model": MODEL_ID,
                "prompt": "Once upon a time",
                "max_tokens": 6,
                "temperature": 0,
            },
        )
    )
    assert {r["window"] for r in plain} == {"last_user", "completion"}
    assert by_window(plain)["last_user"]["tokens"] > 0
    server.post("/api/steering/attachments", json={"sae_id": SAE_ID})
    for path, body in (
        (CHAT, chat(FRENCH, stream=True, return_sae_activations={"top_k": 2})),
        (
            COMPLETIONS,
            {
                "model": MODEL_ID,
                "prompt": FRENCH,
                "max_tokens": 6,
                "temperature": 0,
                "stream": True,
                "return_sae_activations": {"top_k": 2},
            },
        ),
    ):
        with server.stream("POST", path, json=body) as response:
            assert response.status_code == 200 and HEADER not in response.headers
            chunks = data_of(list(response.iter_lines()))
        assert chunks[-1] == "[DONE]"
        tail = chunks[-4:-1]
        assert [sorted(k for k in c if k.startswith("millm")) for c in tail] == [
            ["millm_probe_verdicts"],
            ["millm"],
            ["millm_steering"],
        ]
        assert all(c["choices"] == [] for c in tail)
        assert any(c["choices"] and c["choices"][0]["finish_reason"] for c in chunks[:-4])
        results = tail[0]["millm_probe_verdicts"]
        for result in results:
            jsonschema.validate(result, RESULT_SCHEMA)
            assert result["request_id"] == tail[0]["id"]
        assert parse(serialize(results))  # the same results would make a valid header


def test_nothing_armed_is_the_response_without_probes(server: TestClient) -> None:
    """OAI-PROBE-06: with every probe disarmed there is no header, no body member and no
    stream chunk: the keys are exactly those of a response of a server without probes."""
    server.post("/api/probes/french/disarm", headers=JSON)
    response = server.post(CHAT, json=chat(FRENCH))
    assert HEADER not in response.headers
    assert set(response.json()) == {
        "id",
        "object",
        "created",
        "model",
        "system_fingerprint",
        "choices",
        "usage",
        "timings",  # every reply's (contract 0.27.0)
        "millm_summary",
    }
    with server.stream("POST", CHAT, json=chat(FRENCH, stream=True)) as streamed:
        chunks = data_of(list(streamed.iter_lines()))
    assert not any("millm_probe_verdicts" in c for c in chunks if isinstance(c, dict))


def test_scoring_is_never_monitored(server: TestClient) -> None:
    """OAI-PROBE-17, OAI-SCORE-34 (open point 38): completion and chat scoring carry no
    verdicts and record nothing."""
    before = server.get("/api/probes/events", params={"limit": 1000}).json()["data"]
    scored = [
        server.post(
            COMPLETIONS, json={"model": MODEL_ID, "prompt": FRENCH, "max_tokens": 1, "logprobs": 2}
        ),
        server.post(CHAT, json=chat(FRENCH, max_tokens=1, logprobs=True, top_logprobs=2)),
    ]
    for response in scored:
        assert response.status_code == 200, response.text
        assert HEADER not in response.headers
        assert "millm_probe_verdicts" not in response.json()
    after = server.get("/api/probes/events", params={"limit": 1000}).json()["data"]
    assert len(after) == len(before)


@pytest.mark.parametrize(
    ("values", "joins"),
    [
        (["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"], True),
        (["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"], False),
        (["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"] * 2, False),
    ],
    ids=["valid", "malformed", "repeated"],
)
def test_traceparent(server: TestClient, values: list[str], joins: bool) -> None:
    """OAI-PROBE-15, OAI-PROBE-16: a valid traceparent puts every result in its trace; a
    malformed or repeated one is ignored (a fresh id, the request served)."""
    headers = [("traceparent", v) for v in values]
    response = server.post(CHAT, json=chat(ENGLISH), headers=headers)
    traces = {r["trace_id"] for r in verdicts(response)}
    assert len(traces) == 1
    trace = traces.pop()
    assert (trace == "4bf92f3577b34da6a3ce929d0e0e4736") is joins and len(trace) == 32


def test_events_record_results_and_an_interrupted_stream(
    server: TestClient, data_dir: Path, saes_dir: Path, trained_probe: Path
) -> None:
    """OAI-PROBE-09: results are recorded and read back from GET /api/probes/events (by
    request); a stream the client leaves early records its results as `interrupted`, never
    sent. Over real HTTP, so the disconnect is a real one."""
    answered = server.post(CHAT, json=chat(FRENCH))
    sent = verdicts(answered)
    page = server.get("/api/probes/events", params={"request_id": answered.json()["id"]}).json()
    assert [e["result"] for e in page["data"]] == sent
    assert page["next"] == page["data"][-1]["seq"]
    app = Server(steering_settings(data_dir.parent / "live", saes_dir))
    with uvicorn_serving(app) as port:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=120) as http:
            imported = http.post(
                "/api/probes/import", json={"path": str(trained_probe), "armed": True}
            )
            assert imported.status_code == 201, imported.text
            body = chat(FRENCH, stream=True, max_tokens=400)
            with http.stream("POST", CHAT, json=body) as response:
                for line in response.iter_lines():
                    chunk = json.loads(line[6:]) if line.startswith("data: {") else {}
                    if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                        request_id = chunk["id"]  # some text came: the prompt ran
                        break
            found: list[dict[str, Any]] = []
            deadline = time.monotonic() + 60
            while not found and time.monotonic() < deadline:
                time.sleep(0.2)
                page = http.get("/api/probes/events", params={"request_id": request_id}).json()
                found = [e["result"] for e in page["data"]]
    assert {(r["window"], r["outcome"], r["reason"]) for r in found} == {
        ("last_user", "interrupted", "client_disconnected"),
        ("completion", "interrupted", "client_disconnected"),
    }
    assert by_window(found)["last_user"]["verdict"] == "flagged"


def test_probes_score_without_generating(server: TestClient) -> None:
    """OAI-HDR-19, issue 18 item 2: POST /api/probes/score reads a text (as one user message)
    or a conversation, answers the armed probes' results with no X-miLLM-Steering, records
    nothing; a probe it names that does not exist is 404 naming its place."""
    before = len(server.get("/api/probes/events", params={"limit": 1000}).json()["data"])
    french = server.post("/api/probes/score", json={"input": FRENCH})
    assert french.status_code == 200, french.text
    assert "x-millm-steering" not in french.headers
    results = by_window(french.json()["data"])
    assert results["last_user"]["verdict"] == "flagged"
    assert results["last_user"]["served"]["backend"] == "score"
    assert (results["completion"]["outcome"], results["completion"]["reason"]) == (
        "skipped",
        "empty_window",
    )
    english = server.post(
        "/api/probes/score",
        json={"messages": [{"role": "user", "content": ENGLISH}], "probes": ["french"]},
    )
    assert by_window(english.json()["data"])["last_user"]["verdict"] == "clear"
    unknown = server.post("/api/probes/score", json={"input": "x", "probes": ["nope"]})
    assert (unknown.status_code, unknown.json()["error"]["param"]) == (404, "probes[0]")
    both = server.post("/api/probes/score", json={"input": "x", "messages": []})
    assert both.status_code == 400
    after = len(server.get("/api/probes/events", params={"limit": 1000}).json()["data"])
    assert after == before


def test_sae_feature_detector_reads_before_this_layers_steering(
    server: TestClient, reference: TransformersEngine, trained_sae: SAE
) -> None:
    """Issue 18 item 2, OAI-INL-15: an SAE-feature detector is the weighted sum of chosen
    features of the attached SAE, equal to a direct forward's; it reads before its layer's
    own steering delta, so steering that layer leaves its prompt score unchanged, and
    `features: []` (explicitly unsteered) still monitors."""
    server.post("/api/steering/attachments", json={"sae_id": SAE_ID})
    features = [{"index": 5, "weight": 1.0}, {"index": 77, "weight": -0.5}]
    put = server.put(
        "/api/probes/sae-mix",
        json={
            "detector": {
                "kind": "sae_features",
                "sae_id": SAE_ID,
                "layer": LAYER,
                "features": features,
            },
            "aggregate": "max",
            "threshold": 1e9,
            "windows": ["prompt"],
            "armed": True,
        },
    )
    assert put.status_code == 201, put.text
    plain = server.post(CHAT, json=chat(ENGLISH))
    mixed = {r["probe"]: r for r in verdicts(plain)}["sae-mix"]
    ids = reference.render_chat(ChatPrompt(messages=[{"role": "user", "content": ENGLISH}]))
    acts = trained_sae.encode(direct(reference, ids, LAYER)).float()
    expected = (acts[:, 5] - 0.5 * acts[:, 77]).max().item()
    assert mixed["score"] == pytest.approx(expected, abs=1e-3)
    steered = server.post(
        CHAT, json=chat(ENGLISH, steering={"features": [{"index": 5, "strength": 80}]})
    )
    assert steered.headers["x-millm-steering"].startswith("inline")
    assert {r["probe"]: r for r in verdicts(steered)}["sae-mix"]["score"] == pytest.approx(
        mixed["score"], abs=1e-4
    )
    off = server.post(CHAT, json=chat(ENGLISH, steering={"features": []}))
    assert {r["probe"] for r in verdicts(off)} == {"french", "sae-mix"}


def test_last_user_in_the_render_with_tools(server: TestClient) -> None:
    """OAI-TOOLS-31: with tools, `last_user` is found in the render actually served (the
    tools shown): the same content tokens as without tools, and the same verdict."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_time",
                "description": "Time now",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    bare = by_window(verdicts(server.post(CHAT, json=chat(FRENCH))))["last_user"]
    shown = by_window(verdicts(server.post(CHAT, json=chat(FRENCH, tools=tools))))["last_user"]
    assert shown["tokens"] == bare["tokens"] and shown["verdict"] == "flagged"


def test_rows_of_a_batch_keep_their_own_verdicts_and_gguf_agrees(
    tmp_path: Path, saes_dir: Path, trained_probe: Path
) -> None:
    """Issue 18 (rows of #12), OAI-PROBE-12, OAI-ACT-25: with continuous batching, a French
    and an English request decoded as rows of one batch each get their own verdicts, served
    `batch`, while a request reading activations at the same time is served on the serial
    path with its own positions. Issue 46 (supersedes the GGUF `skipped`,
    `engine_unsupported`): the GGUF engine reads the probe's layer too, and its verdicts
    agree with the transformers engine's, their scores within 0.05."""
    app = Server(steering_settings(tmp_path / "data", saes_dir), preload=False)
    with (
        uvicorn_serving(app) as port,
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as http,
    ):
        assert (
            http.post(
                "/api/probes/import", json={"path": str(trained_probe), "armed": True}
            ).status_code
            == 201
        )
        assert http.put("/api/config", json={"values": {"parallel": 4}}).status_code == 200
        loaded = http.post("/api/session/load", json={"model": MODEL_ID})
        assert loaded.status_code in (200, 202), loaded.text
        deadline = time.monotonic() + 300
        while http.get("/api/health/inference").json()["model"] != MODEL_ID:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        attached = http.post("/api/steering/attachments", json={"sae_id": SAE_ID})
        assert attached.status_code in (200, 201), attached.text
        answers: dict[str, httpx.Response] = {}
        reading = {"return_sae_activations": {"positions": "all", "top_k": 2}}

        def ask(text: str) -> None:
            extra = reading if text == "reading" else {}
            answers[text] = http.post(CHAT, json=chat(text, max_tokens=24, **extra))

        asks = (FRENCH, ENGLISH, "reading")
        threads = [threading.Thread(target=ask, args=(t,)) for t in asks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        french = by_window(verdicts(answers[FRENCH]))
        english = by_window(verdicts(answers[ENGLISH]))
        assert french["last_user"]["verdict"] == "flagged"
        assert english["last_user"]["verdict"] == "clear"
        assert {r["served"]["backend"] for r in (*french.values(), *english.values())} == {"batch"}
        read = answers["reading"].json()
        fed = read["usage"]["prompt_tokens"] + read["usage"]["completion_tokens"] - 1
        assert len(read["millm"]["sae_activations"]["positions"]) == fed
        assert {r["served"]["backend"] for r in verdicts(answers["reading"])} == {"serial"}
        on_gguf = {
            text: by_window(verdicts(http.post(CHAT, json={**chat(text), "model": GGUF_ID})))
            for text in (FRENCH, ENGLISH)
        }
    assert not math.isnan(french["last_user"]["score"])
    for text, theirs in ((FRENCH, french), (ENGLISH, english)):
        for window, ours in on_gguf[text].items():
            assert ours["served"]["engine"] == "llama.cpp" and ours["outcome"] == "scored"
            assert ours["verdict"] == theirs[window]["verdict"], (text, window)
            assert abs(ours["score"] - theirs[window]["score"]) < 0.05, (text, window)


def test_user_span_is_the_last_user_messages_content(reference: TransformersEngine) -> None:
    """OAI-TOOLS-31, issue 18 item 2: `last_user` covers exactly the last user message's
    content in the render, past an earlier turn that says the same words, with content
    parts joined as the template renders them; a chat with no user text has none."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say: the cat sat."},
        {"role": "assistant", "content": "the cat sat."},
        {"role": "user", "content": [{"type": "text", "text": "the cat sat."}]},
    ]
    prompt = ChatPrompt(messages=messages)
    ids = reference.render_chat(prompt)
    span = reference.user_span(prompt)
    assert span is not None and span[1] < len(ids)
    assert reference.decode(ids[span[0] : span[1]]) == "the cat sat."
    earlier = reference.user_span(ChatPrompt(messages=messages[:2]))
    assert earlier is not None and earlier[0] < span[0]
    assert reference.user_span(ChatPrompt(messages=[messages[0]])) is None


def test_a_network_peer_imports_sidecars_only_from_the_model_folders(
    tmp_path: Path, trained_probe: Path
) -> None:
    """LOC-SEC-58, LOC-SEC-61 for the probe routes: a peer that is not loopback may not make
    the server read a sidecar outside the model folders (403 outside_models_dir naming
    `path`, before the file is read); a loopback peer may."""
    settings = steering_settings(tmp_path / "data", tmp_path)
    body = {"path": str(trained_probe)}
    remote = LocalClient(Server(settings, preload=False), client=("192.0.2.7", 40000))
    with remote:
        refused = remote.post("/api/probes/import", json=body)
        missing = remote.post("/api/probes/import", json={"path": "/etc/passwd"})
        assert remote.get("/api/probes").json()["data"] == []
    for response in (refused, missing):
        error = response.json()["error"]
        assert (response.status_code, error["code"], error["param"]) == (
            403,
            "outside_models_dir",
            "path",
        )
    with LocalClient(Server(settings, preload=False)) as local:
        assert local.post("/api/probes/import", json=body).status_code == 201


def test_every_choice_has_its_own_results(server: TestClient) -> None:
    """OAI-PROBE-02, OAI-PROBE-03 (open point 5): a response with several choices (`n`, or
    `extra_messages` rows) has one result per (probe, window, choice), each naming its choice
    in `index`, and the header names it too, sorted after the window."""
    rows = server.post(
        CHAT,
        json=chat(FRENCH, extra_messages=[[{"role": "user", "content": ENGLISH}]]),
    )
    results = verdicts(rows)
    assert sorted({r["index"] for r in results}) == [0, 1]
    last = {r["index"]: r for r in results if r["window"] == "last_user"}
    assert (last[0]["verdict"], last[1]["verdict"]) == ("flagged", "clear")
    assert [e["index"] for e in parse(rows.headers[HEADER])] == [0, 1, 0, 1]
    sampled = server.post(CHAT, json=chat(ENGLISH, n=2, temperature=0.8, seed=3))
    assert sorted({r["index"] for r in verdicts(sampled)}) == [0, 1]


def verdict_counts(server: TestClient) -> dict[tuple[str, str, str], float]:
    """`miserver_probe_verdicts_total` by (probe, outcome, verdict), from /metrics."""
    found = samples(server.get("/metrics").text, "miserver_probe_verdicts_total")
    return {(s.labels["probe"], s.labels["outcome"], s.labels["verdict"]): s.value for s in found}


def test_each_recorded_result_is_counted(server: TestClient) -> None:
    """Issue 47 item 1: every probe result a response records counts once in
    `miserver_probe_verdicts_total`, by probe, outcome and verdict."""
    before = verdict_counts(server)
    results = verdicts(server.post(CHAT, json=chat(FRENCH)))
    after = verdict_counts(server)
    expected: dict[tuple[str, str, str], int] = {}
    for r in results:
        key = (r["name"], r["outcome"], r["verdict"])
        expected[key] = expected.get(key, 0) + 1
    moved = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert {k: v for k, v in moved.items() if v} == expected
