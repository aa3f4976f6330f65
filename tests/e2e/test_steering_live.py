"""Steering over real HTTP: the SDK's `extra_body`, operator changes during a stream, disconnects.

A `miserver serve` subprocess with the trained SAEs attaches one through
/api, and the official `openai` SDK sends the steering fields the way its
users do (`extra_body`). Timing-dependent cases hold the generation long
(COUNTING continues for thousands of tokens) and act after the first chunks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai import OpenAI

from miserver.steering import steering_set_hash
from miserver.steering.header import InlineMember, ManualMember, NoneMember, parse
from tests import anthropic_reference, openai_reference
from tests.conftest import JSON, MODEL_ID, SAE_ID
from tests.e2e.conftest import LiveServer, live_server
from tests.openai_reference import Check

pytestmark = pytest.mark.e2e

HELLO: list[Any] = [{"role": "user", "content": "Tell me about your favourite place."}]
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"
GREEDY = {"temperature": 0}  # in the body: the anthropic SDK (2.17) sends no temperature
LAYER = 12


@pytest.fixture(scope="module")
def steer_server(tmp_path_factory: pytest.TempPathFactory, saes_dir: Path) -> Iterator[LiveServer]:
    env = {"MISERVER_SAES_DIR": str(saes_dir)}
    with live_server(tmp_path_factory.mktemp("e2e-steer"), env) as running:
        yield running


@pytest.fixture(scope="module")
def api(steer_server: LiveServer) -> Iterator[httpx.Client]:
    root = steer_server.base_url.removesuffix("/v1")
    with httpx.Client(base_url=f"{root}/api", timeout=60.0) as client:
        yield client


@pytest.fixture(scope="module")
def v1(steer_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=steer_server.base_url, timeout=120.0) as client:
        yield client


@pytest.fixture(scope="module")
def sdk(steer_server: LiveServer, openai_check: Check) -> Iterator[OpenAI]:
    with OpenAI(
        base_url=steer_server.base_url,
        api_key="x",
        max_retries=0,
        timeout=120,
        http_client=openai_reference.client(openai_check),
    ) as c:
        yield c


@pytest.fixture(scope="module")
def claude(steer_server: LiveServer) -> Iterator[anthropic.Anthropic]:
    """The official `anthropic` SDK on the same server, every body and event checked."""
    check = anthropic_reference.AnthropicCheck()
    with anthropic.Anthropic(
        base_url=steer_server.base_url.removesuffix("/v1"),
        api_key="x",
        max_retries=0,
        http_client=anthropic_reference.client(check),
    ) as c:
        yield c


@pytest.fixture(autouse=True)
def attached(api: httpx.Client) -> Iterator[None]:
    """Each test starts with the SAE attached at layer 12 and nothing live."""
    assert api.post("/steering/attachments", json={"sae_id": SAE_ID}).status_code in (200, 201)
    api.delete(f"/steering/attachments/{SAE_ID}/{LAYER}/features", headers=JSON)
    yield
    api.delete(f"/steering/attachments/{SAE_ID}/{LAYER}/features", headers=JSON)


def chat(v1: httpx.Client, **extra: Any) -> httpx.Response:
    body = {"model": MODEL_ID, "messages": HELLO, "max_tokens": 12, "temperature": 0, **extra}
    response = v1.post("/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response


def text_of(response: httpx.Response) -> str:
    content: str = response.json()["choices"][0]["message"]["content"]
    return content


def test_sdk_extra_body_inline_steering(sdk: OpenAI, v1: httpx.Client) -> None:
    """OAI-INL-01, OAI-INL-29, OAI-HASH-01: the SDK's extra_body carries `steering`;
    the header's hash is what a client recomputes from the set it sent."""
    features = [{"index": 5, "strength": 150.0}]
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL_ID,
        messages=HELLO,
        max_tokens=12,
        temperature=0,
        extra_body={"steering": {"sae_id": SAE_ID, "features": features}},
    )
    [member] = parse(raw.headers["X-miLLM-Steering"])
    assert isinstance(member, InlineMember)
    assert member.hash == steering_set_hash(SAE_ID, features)
    steered = raw.parse().choices[0].message.content
    assert steered != text_of(chat(v1))  # the same request unsteered


def _stream_lines(v1: httpx.Client, body: dict[str, Any]) -> Iterator[str]:
    with v1.stream("POST", "/completions", json=body) as response:
        assert response.status_code == 200
        yield from response.iter_lines()


def _events(lines: Iterator[str], act_after: int, act: Any) -> list[dict[str, Any]]:
    """Data events of a stream; `act()` runs once `act_after` content chunks have arrived."""
    events: list[dict[str, Any]] = []
    content = 0
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line.removeprefix("data: "))
        events.append(event)
        if event.get("choices"):
            content += 1
            if content == act_after:
                act()
    return events


def test_an_operator_change_during_a_request_wins(api: httpx.Client, v1: httpx.Client) -> None:
    """OAI-CONC-01/02/03, OAI-HDR-03, OAI-GRAM-23: an operator's change mid-request wins,
    nothing is restored over it, and the stream's header says what ran, flagged `changed`."""
    epoch = api.get("/steering").json()["epoch"]
    operator = {"features": [{"index": 9, "strength": 40.0}]}
    answers: list[dict[str, Any]] = []

    def change() -> None:
        answers.append(
            api.put(f"/steering/attachments/{SAE_ID}/{LAYER}/features", json=operator).json()
        )

    body = {
        "model": MODEL_ID,
        "prompt": COUNTING,
        "max_tokens": 60,
        "temperature": 0,
        "stream": True,
        "steering": {"features": [{"index": 5, "strength": 30.0}]},
    }
    events = _events(_stream_lines(v1, body), act_after=3, act=change)
    assert answers and answers[0]["live"] is True  # OAI-CONC-03
    [member] = parse(events[-1]["millm_steering"])
    assert isinstance(member, ManualMember) and member.changed
    assert member.hash == steering_set_hash(SAE_ID, operator["features"])
    state = api.get("/steering").json()
    assert state["epoch"] == epoch + 1  # the request itself moved nothing (OAI-INL-04)
    assert state["attachments"][0]["features"] == operator["features"]  # not reverted
    [after] = parse(chat(v1).headers["X-miLLM-Steering"])
    assert isinstance(after, ManualMember) and not after.changed


def test_a_disconnect_leaves_no_steering_behind(api: httpx.Client, v1: httpx.Client) -> None:
    """Issue #4 acceptance: a client leaving a steered stream leaves no hook: the next request
    is byte-identical to an unsteered one and says `none` (OAI-INL-03, OAI-PROF-03)."""
    plain = chat(v1)
    body = {
        "model": MODEL_ID,
        "messages": HELLO,
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
        "steering": {"features": [{"index": 5, "strength": 150.0}]},
    }
    with v1.stream("POST", "/chat/completions", json=body) as response:
        lines = response.iter_lines()
        received = [line for _, line in zip(range(6), lines, strict=False)]
    assert any(line.startswith("data: ") for line in received)
    again = chat(v1)
    assert parse(again.headers["X-miLLM-Steering"]) == [NoneMember()]
    assert text_of(again) == text_of(plain)


def test_activations_through_the_sdk(sdk: OpenAI) -> None:
    """OAI-ACT-01/02/12/14/15 through the official client: `extra_body` asks, `millm` comes
    back on the reply and, streamed, on one `choices: []` chunk before the steering chunk."""
    ask = {"return_sae_activations": {"positions": "completion", "top_k": 3}}
    messages: Any = [{"role": "user", "content": COUNTING}]
    reply = sdk.chat.completions.create(
        model=MODEL_ID, messages=messages, max_tokens=6, temperature=0, extra_body=ask
    )
    reading = (reply.model_extra or {})["millm"]["sae_activations"]
    assert reading["sae_id"] == SAE_ID and reading["layer"] == LAYER
    assert reply.usage is not None
    assert len(reading["positions"]) == reply.usage.completion_tokens - 1
    assert all(len(p["features"]) == 3 for p in reading["positions"])
    plain = sdk.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=2)
    assert "millm" not in (plain.model_extra or {})
    stream = sdk.chat.completions.create(
        model=MODEL_ID,
        messages=messages,
        max_tokens=6,
        temperature=0,
        stream=True,
        extra_body=ask,
    )
    chunks = [(c.model_extra or {}) for c in stream]
    carrying = [i for i, extra in enumerate(chunks) if "millm" in extra]
    assert len(carrying) == 1 and carrying[0] == len(chunks) - 2
    streamed = chunks[carrying[0]]["millm"]["sae_activations"]
    assert [p["token_id"] for p in streamed["positions"]] == [
        p["token_id"] for p in reading["positions"]
    ]
    for ours, theirs in zip(streamed["positions"], reading["positions"], strict=True):
        values = [f["value"] for f in theirs["features"]]
        assert [f["value"] for f in ours["features"]] == pytest.approx(values, rel=1e-4)
    assert "millm_steering" in chunks[-1]


def test_probe_verdicts_through_the_sdk(
    sdk: OpenAI, claude: anthropic.Anthropic, api: httpx.Client, trained_probe: Path
) -> None:
    """OAI-PROBE-01/02/05/08/15 through the official client: with the French probe armed,
    the raw reply carries X-miLLM-Probe-Verdicts and `millm_probe_verdicts` (in the trace
    `traceparent` names), a streamed reply carries them on one `choices: []` chunk before the
    steering chunk, and disarmed nothing is added."""
    imported = api.post("/probes/import", json={"path": str(trained_probe), "armed": True})
    assert imported.status_code in (200, 201), imported.text
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    messages: Any = [{"role": "user", "content": "Où se trouve la gare, s'il vous plaît ?"}]
    try:
        raw = sdk.chat.completions.with_raw_response.create(
            model=MODEL_ID,
            messages=messages,
            max_tokens=6,
            temperature=0,
            extra_headers={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"},
        )
        reply = raw.parse()
        results = (reply.model_extra or {})["millm_probe_verdicts"]
        header = raw.headers["X-miLLM-Probe-Verdicts"]
        assert '"french";window=last_user;verdict=flagged' in header
        assert {r["trace_id"] for r in results} == {trace}
        assert {r["request_id"] for r in results} == {reply.id}
        stream = sdk.completions.create(
            model=MODEL_ID, prompt="Il était une fois", max_tokens=4, temperature=0, stream=True
        )
        chunks = [(c.model_extra or {}) for c in stream]
        carrying = [i for i, extra in enumerate(chunks) if "millm_probe_verdicts" in extra]
        assert carrying == [len(chunks) - 2] and "millm_steering" in chunks[-1]
        # issue 44 item 5: a Response carries them as chat does, and so does a stream's end
        asked: Any = {"model": MODEL_ID, "input": messages, "max_output_tokens": 6}
        answered = sdk.responses.with_raw_response.create(**asked, temperature=0)
        judged = (answered.parse().model_extra or {})["millm_probe_verdicts"]
        assert (
            '"french";window=last_user;verdict=flagged'
            in answered.headers["X-miLLM-Probe-Verdicts"]
        )
        assert [r["verdict"] for r in judged] == [r["verdict"] for r in results]
        events = list(sdk.responses.create(**asked, temperature=0, stream=True))
        final: Any = events[-1]
        assert final.type == "response.incomplete"  # six tokens: cut at max_output_tokens
        streamed = final.response.model_extra["millm_probe_verdicts"]
        assert [r["verdict"] for r in streamed] == [r["verdict"] for r in judged]
        # issue 45 item 6: a Message carries them too, and so does a stream's message_delta
        said: Any = {"model": MODEL_ID, "max_tokens": 6, "messages": messages}
        message = claude.messages.with_raw_response.create(**said, extra_body=GREEDY)
        verdicts = (message.parse().model_extra or {})["millm_probe_verdicts"]
        assert '"french";window=last_user' in message.headers["X-miLLM-Probe-Verdicts"]
        assert [r["verdict"] for r in verdicts] == [r["verdict"] for r in judged]
        with claude.messages.stream(**said, extra_body=GREEDY) as stream:
            ended = [e for e in stream if e.type == "message_delta"]
        (delta,) = ended
        assert [r["verdict"] for r in (delta.model_extra or {})["millm_probe_verdicts"]] == [
            r["verdict"] for r in judged
        ]
    finally:
        assert api.delete("/probes/french", headers=JSON).status_code == 200
    plain = sdk.chat.completions.with_raw_response.create(
        model=MODEL_ID, messages=messages, max_tokens=2
    )
    assert "X-miLLM-Probe-Verdicts" not in plain.headers
    assert "millm_probe_verdicts" not in (plain.parse().model_extra or {})


def test_a_locked_server_shows_the_sdk_one_model(
    sdk: OpenAI, claude: anthropic.Anthropic, api: httpx.Client
) -> None:
    """OAI-MODELS-05 through the official client: locked for steering, `models.list()` gives
    the one locked id, and a chat naming another model raises the SDK's ConflictError
    (409 model_locked) naming the lock; unlocked, every model is listed again."""
    before = sorted(m.id for m in sdk.models.list())
    assert api.put("/steering/lock", json={"model": MODEL_ID}).json()["model"] == MODEL_ID
    try:
        assert [m.id for m in sdk.models.list()] == [MODEL_ID]
        other = next(m for m in before if m != MODEL_ID)
        with pytest.raises(openai.ConflictError) as caught:
            sdk.chat.completions.create(
                model=other, messages=[{"role": "user", "content": "Hi"}], max_tokens=1
            )
        assert caught.value.code == "model_locked" and MODEL_ID in caught.value.message
        with pytest.raises(openai.ConflictError) as answered:  # issue 44 item 5
            sdk.responses.create(model=other, input="Hi", max_output_tokens=1)
        assert answered.value.code == "model_locked"
        with pytest.raises(anthropic.ConflictError) as said:  # issue 45 item 6
            claude.messages.create(model=other, max_tokens=1, messages=HELLO)
        error: Any = said.value.body
        assert error["error"]["code"] == "model_locked"
        assert error["error"]["type"] == "invalid_request_error"
    finally:
        api.delete("/steering/lock", headers=JSON)
    assert sorted(m.id for m in sdk.models.list()) == before


def test_a_response_is_steered_through_extra_body_and_says_so(sdk: OpenAI) -> None:
    """Issue 44 item 5: `steering` in `extra_body` steers a Responses API response on
    transformers; the header says what steered, and so does the Response (`millm_steering`,
    on the stream's final `response.completed` too)."""
    steering = {"sae_id": SAE_ID, "features": [{"index": 3, "strength": 8.0}]}
    question = "Name three colours of the rainbow."
    asked: dict[str, Any] = {
        "model": MODEL_ID,
        "input": question,
        "max_output_tokens": 12,
        "temperature": 0,
    }
    plain = sdk.responses.create(**asked)
    raw = sdk.responses.with_raw_response.create(**asked, extra_body={"steering": steering})
    streamed = list(sdk.responses.create(**asked, stream=True, extra_body={"steering": steering}))
    steered = raw.parse()
    (member,) = parse(raw.headers["X-miLLM-Steering"])
    assert isinstance(member, InlineMember) and member.layer == LAYER
    assert steered.output_text != plain.output_text
    final: Any = streamed[-1]
    assert final.response.model_extra["millm_steering"] == raw.headers["X-miLLM-Steering"]
    assert final.response.output_text == steered.output_text


def test_a_message_is_steered_through_extra_body_and_says_so(claude: anthropic.Anthropic) -> None:
    """Issue 45 item 6: `steering` in `extra_body` steers a Messages API reply on
    transformers; the header says what steered (the inline member with its hash), and so
    does the Message (`millm_steering`) and a stream's `message_delta`."""
    steering = {"sae_id": SAE_ID, "features": [{"index": 3, "strength": 8.0}]}
    question: Any = [{"role": "user", "content": "Name three colours of the rainbow."}]
    said: dict[str, Any] = {"model": MODEL_ID, "max_tokens": 12, "messages": question}
    plain = claude.messages.create(**said, extra_body=GREEDY)
    raw = claude.messages.with_raw_response.create(
        **said, extra_body={**GREEDY, "steering": steering}
    )
    steered = raw.parse()
    (member,) = parse(raw.headers["X-miLLM-Steering"])
    assert isinstance(member, InlineMember) and member.layer == LAYER
    assert member.hash == steering_set_hash(SAE_ID, steering["features"])
    assert steered.content[0].text != plain.content[0].text  # type: ignore[union-attr]
    assert (steered.model_extra or {})["millm_steering"] == raw.headers["X-miLLM-Steering"]
    with claude.messages.stream(**said, extra_body={**GREEDY, "steering": steering}) as stream:
        deltas = [e for e in stream if e.type == "message_delta"]
        final = stream.get_final_message()
    assert (deltas[0].model_extra or {})["millm_steering"] == raw.headers["X-miLLM-Steering"]
    assert final.content[0].text == steered.content[0].text  # type: ignore[union-attr]
