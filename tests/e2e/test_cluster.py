"""miserver on Ray Serve (issue 49): `miserver cluster` on a local Ray head, over real HTTP.

One ingress and two engine replicas of the default model (the GGUF on
llama.cpp) on loopback, 2 CPUs, with the trained SAEs: every /v1 route through
the ingress, streams included, with the official SDKs; an operator change made
through the ingress seen in the next response from both replicas; a second turn
on the replica holding its prefix; a replica killed with `kill -9` during a
burst costs no 500, and the cluster serves from two replicas again within 60 s. The
operator's state is in PostgreSQL (`--database-url`).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import psutil
import pytest
from openai import OpenAI

from miserver.steering import steering_set_hash
from miserver.steering.header import ManualMember, parse
from tests import anthropic_reference
from tests.conftest import GGUF_ID, JSON, SAE_ID
from tests.e2e.conftest import LiveServer, checked_sdk, live_server
from tests.events import Events
from tests.openai_reference import Check
from tests.postgres import PostgresServer
from tests.prometheus import samples

pytestmark = pytest.mark.e2e

REPLICA = "x-millm-replica"
EPOCH = "x-millm-epoch"
LAYER = 12
LIVE = {5: 60.0, 11: -20.0}
BACK_WITHIN_S = 60.0
# a system prompt long enough that a second turn's cached prefix is worth restoring
SYSTEM = "You are a careful assistant for a museum. " * 12
APP_ORIGIN = "http://app.test"  # an origin the cluster allows (--allow-origin)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, saes_dir: Path, postgres: PostgresServer
) -> Iterator[LiveServer]:
    """The operator's state in PostgreSQL, as for replicas on several machines (the default,
    one SQLite file in the shared data dir, runs the same code on the store's other
    backend: tests/unit/test_profiles_store.py and the rest run on both)."""
    args = ["--engine-replicas", "2", "--engine-cpus", "0", "--saes-dir", str(saes_dir)]
    args += ["--allow-origin", APP_ORIGIN, "--database-url", postgres.fresh()]
    workdir = tmp_path_factory.mktemp("cluster")
    with live_server(workdir, model=None, args=args, command="cluster") as running:
        yield running


@pytest.fixture(scope="module")
def v1(cluster: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.base_url, timeout=120.0) as client:
        yield client


@pytest.fixture(scope="module")
def api(cluster: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.base_url.removesuffix("/v1") + "/api", timeout=120) as c:
        yield c


def chat(v1: httpx.Client, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    body = {"model": GGUF_ID, "messages": messages, "max_tokens": 8, "temperature": 0, **extra}
    response = v1.post("/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response


def from_both(send: Callable[[int], httpx.Response], tries: int = 24) -> dict[str, httpx.Response]:
    """Responses from both engine replicas (the router places fresh prompts at random)."""
    seen: dict[str, httpx.Response] = {}
    for i in range(tries):
        response = send(i)
        seen.setdefault(response.headers[REPLICA], response)
        if len(seen) == 2:
            return seen
    pytest.fail(f"only replicas {sorted(seen)} answered {tries} requests")


def test_every_v1_route_works_through_the_ingress(
    cluster: LiveServer, v1: httpx.Client, openai_check: Check, tmp_path: Path
) -> None:
    """Issue 49 acceptance 1: the /v1 routes through the ingress, streams included, each
    body checked against OpenAI's schemas by the SDK's client; every answer names its
    replica and epoch."""
    with checked_sdk(cluster.base_url, openai_check, timeout=120) as sdk:
        _every_openai_route(sdk, v1, tmp_path)
    with anthropic.Anthropic(
        base_url=cluster.base_url.removesuffix("/v1"),
        api_key="x",
        max_retries=0,
        http_client=anthropic_reference.client(anthropic_reference.AnthropicCheck()),
    ) as claude:
        _every_anthropic_route(claude)


def _every_openai_route(sdk: OpenAI, v1: httpx.Client, tmp_path: Path) -> None:
    hello = [{"role": "user", "content": "Say hello."}]
    reply = sdk.chat.completions.with_raw_response.create(
        model=GGUF_ID,
        messages=hello,
        max_tokens=6,  # type: ignore[arg-type]
    )
    assert reply.headers[REPLICA] and reply.headers[EPOCH].isdigit()
    assert reply.parse().choices[0].message.content
    chunks = list(
        sdk.chat.completions.create(
            model=GGUF_ID,
            messages=hello,
            max_tokens=6,
            stream=True,  # type: ignore[arg-type]
        )
    )
    assert [c for c in chunks if c.choices and c.choices[0].finish_reason == "length"]
    assert sdk.completions.create(model=GGUF_ID, prompt="Once upon", max_tokens=4).choices
    streamed = list(sdk.completions.create(model=GGUF_ID, prompt="Once", max_tokens=3, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices)
    assert len(sdk.embeddings.create(model=GGUF_ID, input=["a", "b"]).data) == 2
    assert GGUF_ID in [m.id for m in sdk.models.list()]
    assert sdk.models.retrieve(GGUF_ID).id == GGUF_ID

    made = sdk.responses.create(model=GGUF_ID, input="Name a colour.", max_output_tokens=8)
    assert sdk.responses.retrieve(made.id).id == made.id  # the shared store: any replica
    assert sdk.responses.input_items.list(made.id).data
    second = sdk.responses.create(
        model=GGUF_ID, input="Another.", previous_response_id=made.id, max_output_tokens=6
    )
    assert second.previous_response_id == made.id
    events = list(sdk.responses.create(model=GGUF_ID, input="Hi", max_output_tokens=4, stream=True))
    assert events[-1].type == "response.incomplete"  # max_output_tokens reached
    assert sdk.responses.delete(made.id) is None

    ids = v1.post("/tokenize", json={"model": GGUF_ID, "prompt": "Hello there"}).json()
    assert v1.post("/detokenize", json={"model": GGUF_ID, "tokens": ids["tokens"]}).json()
    assert v1.get("/tokenizer_info", params={"model": GGUF_ID}).status_code == 200
    for path in ("/health", "/health/ready", "/metrics", "/openapi.json"):
        assert v1.get(path).status_code == 200, path

    _a_batch(sdk, v1, tmp_path)


def _every_anthropic_route(claude: anthropic.Anthropic) -> None:
    hello = [{"role": "user", "content": "Say hello."}]
    said = claude.messages.create(model=GGUF_ID, max_tokens=6, messages=hello)  # type: ignore[arg-type]
    assert said.content
    with claude.messages.stream(model=GGUF_ID, max_tokens=4, messages=hello) as stream:  # type: ignore[arg-type]
        assert stream.get_final_message().stop_reason == "max_tokens"
    counted = claude.messages.count_tokens(model=GGUF_ID, messages=hello)  # type: ignore[arg-type]
    assert counted.input_tokens > 0


def _a_batch(sdk: OpenAI, v1: httpx.Client, tmp_path: Path) -> None:
    """A batch through the control's runner: its lines go to the engine replicas."""
    hello = [{"role": "user", "content": "Say hello."}]
    lines = "".join(
        json.dumps(
            {
                "custom_id": f"l{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": GGUF_ID, "messages": hello, "max_tokens": 4},
            }
        )
        + "\n"
        for i in range(4)
    )
    (tmp_path / "lines.jsonl").write_text(lines)
    with (tmp_path / "lines.jsonl").open("rb") as file:
        uploaded = sdk.files.create(file=file, purpose="batch")
    assert sdk.files.retrieve(uploaded.id).bytes == len(lines.encode())
    batch = sdk.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while (batch := sdk.batches.retrieve(batch.id)).status not in ("completed", "failed"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)
    assert batch.status == "completed" and batch.request_counts is not None
    assert batch.request_counts.completed == 4
    assert batch.output_file_id is not None
    content = v1.get(f"/files/{batch.output_file_id}/content")  # JSONL, not OpenAI's JSON
    output = [json.loads(x) for x in content.text.splitlines()]
    assert {o["response"]["status_code"] for o in output} == {200}
    assert batch.id in [b.id for b in sdk.batches.list()]
    assert sdk.files.delete(uploaded.id).deleted


def test_a_refusal_comes_from_the_ingress_in_the_routes_shape(v1: httpx.Client) -> None:
    """Issue 49 item 2: the ingress validates; a bad body never reaches a replica."""
    response = v1.post("/chat/completions", json={"model": GGUF_ID, "messages": "no"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages"
    assert REPLICA not in response.headers


def test_an_allowed_origin_is_judged_once_at_the_ingress(v1: httpx.Client) -> None:
    """The security model at the door (LOC-SEC): a browser request from an origin the
    cluster allows is served; the replica, reached from loopback, does not judge its
    Origin and Sec-Fetch-Site again. A foreign origin is refused at the ingress."""
    body = {"model": GGUF_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    browser = {"Origin": APP_ORIGIN, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"}
    allowed = v1.post("/chat/completions", json=body, headers=browser)
    assert allowed.status_code == 200, allowed.text
    foreign = v1.post(
        "/chat/completions", json=body, headers={**browser, "Origin": "http://evil.test"}
    )
    assert foreign.status_code == 403 and REPLICA not in foreign.headers


@pytest.mark.parametrize(("sent", "echoed"), [("mine-123", True), ("not sane!", False)])
def test_one_request_id_whatever_the_proxy_adds(v1: httpx.Client, sent: str, echoed: bool) -> None:
    """The ingress's X-Request-Id rule holds behind Serve's proxy, which appends its own
    copy (proxy.py): one header, the client's sane id echoed, else a fresh `req_` id, the
    same id the replica reported in the body."""
    body = {"model": GGUF_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    response = v1.post("/chat/completions", json=body, headers={"X-Request-Id": sent})
    [rid] = response.headers.get_list("x-request-id")
    assert (rid == sent) is echoed and (echoed or rid.startswith("req_"))
    assert response.json()["millm_summary"]["request_id"] == rid


def test_a_steering_change_is_in_the_next_response_of_both_replicas(
    api: httpx.Client, v1: httpx.Client
) -> None:
    """Issue 49 acceptance 2 (OAI-HDR-01): live values set through the ingress move the
    epoch, and the very next responses from either replica carry them in X-miLLM-Steering;
    cleared, neither does."""
    assert api.post("/steering/attachments", json={"sae_id": SAE_ID}).status_code in (200, 201)
    features = {"features": [{"index": i, "strength": s} for i, s in LIVE.items()]}
    changed = api.put(f"/steering/attachments/{SAE_ID}/{LAYER}/features", json=features)
    assert changed.status_code == 200, changed.text
    epoch = int(changed.headers[EPOCH])

    def ask(i: int) -> httpx.Response:
        return chat(v1, [{"role": "user", "content": f"Tell me about place {i}."}])

    for replica, response in from_both(ask).items():
        assert int(response.headers[EPOCH]) >= epoch, replica
        manual = [
            m for m in parse(response.headers["x-millm-steering"]) if isinstance(m, ManualMember)
        ]
        assert len(manual) == 1, (replica, response.headers["x-millm-steering"])
        assert manual[0].hash == steering_set_hash(SAE_ID, features["features"]), replica

    cleared = api.delete(f"/steering/attachments/{SAE_ID}/{LAYER}/features", headers=JSON)
    assert cleared.status_code == 200, cleared.text
    for replica, response in from_both(ask).items():
        members = parse(response.headers["x-millm-steering"])
        assert not [m for m in members if isinstance(m, ManualMember)], replica
    api.delete(f"/steering/attachments/{SAE_ID}/{LAYER}", headers=JSON)


def test_the_model_lock_holds_on_both_replicas(api: httpx.Client, v1: httpx.Client) -> None:
    """Issue 49 acceptance 2 (OAI-MODELS-05): the lock set through the ingress narrows
    /v1/models on both replicas at once; lifted, both list every model again."""
    everything = [m["id"] for m in v1.get("/models").json()["data"]]
    assert len(everything) > 1
    assert api.put("/steering/lock", json={"model": GGUF_ID}).status_code == 200
    try:
        for replica, response in from_both(lambda _: v1.get("/models")).items():
            assert [m["id"] for m in response.json()["data"]] == [GGUF_ID], replica
    finally:
        assert api.delete("/steering/lock", headers=JSON).status_code == 200
    for replica, response in from_both(lambda _: v1.get("/models")).items():
        assert [m["id"] for m in response.json()["data"]] == everything, replica


def test_the_metrics_are_every_replicas_each_labelled_with_it(v1: httpx.Client) -> None:
    """Issue 49 (the operations issue's /metrics for routing and scaling): /v1/metrics
    through the ingress holds every engine replica's metrics, each sample labelled with
    the replica that counted it; the counts grow on the replica that served a request."""

    def served(replica: str) -> float:
        text = v1.get("/metrics").text
        found = samples(text, "vllm:request_success_total")
        return sum(s.value for s in found if s.labels["replica"] == replica)

    replicas = from_both(lambda i: chat(v1, [{"role": "user", "content": f"Count {i}."}]))
    response = v1.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    running = samples(response.text, "vllm:num_requests_running")
    assert {s.labels["replica"] for s in running} == set(replicas)
    name = next(iter(replicas))
    before = served(name)
    again = from_both(lambda i: chat(v1, [{"role": "user", "content": f"Again {i}."}]))
    assert served(name) >= before + 1 and again[name].status_code == 200


def test_a_second_turn_lands_on_the_replica_holding_its_prefix(v1: httpx.Client) -> None:
    """Issue 49 acceptance 3: the router sends a conversation's next turn to the replica
    that served the one before, whose prompt cache restores the shared prefix."""
    for topic in ("vases", "coins", "maps", "masks"):
        first = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Tell me about the {topic}."},
        ]
        one = chat(v1, first)
        answer = one.json()["choices"][0]["message"]["content"]
        turn = [
            *first,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "More."},
        ]
        two = chat(v1, turn)
        assert two.headers[REPLICA] == one.headers[REPLICA], topic
        assert two.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, topic


def test_every_replicas_events_reach_the_ingress(cluster: LiveServer, v1: httpx.Client) -> None:
    """Issue 49 item 3 (LOC-EVENTS-01, -02, -13): the ingress's /api/events says `state` on
    connect (a replica's session: ready), then the `done` event of every request, whichever
    replica served it."""
    with Events(cluster.base_url.removesuffix("/v1")) as events:
        assert events.named("state")[0]["state"] == "ready"
        time.sleep(1.0)  # the replicas hear that someone listens, and start sending
        replicas: dict[str, str] = {}
        for i in range(24):
            response = chat(v1, [{"role": "user", "content": f"Events {i}"}], max_tokens=3)
            replicas[response.headers["x-request-id"]] = response.headers[REPLICA]
            if len(set(replicas.values())) == 2:
                break
        assert len(set(replicas.values())) == 2
        events.wait_for(lambda _: {d["request_id"] for d in events.named("done")} >= set(replicas))


def test_probe_results_of_every_replica_reach_the_ingress(
    api: httpx.Client, v1: httpx.Client, trained_probe: Path
) -> None:
    """Issue 49 item 3 (OAI-PROBE-01, OAI-PROBE-07): the French probe imported and armed
    through the ingress (an operator change) gives verdicts on both replicas at once, and the
    ingress's /api/probes/events lists each replica's results (rows of the shared
    database)."""
    imported = api.post("/probes/import", json={"path": str(trained_probe), "armed": True})
    assert imported.status_code in (200, 201), imported.text
    name = imported.json()["name"]
    try:

        def ask(i: int) -> httpx.Response:
            return chat(v1, [{"role": "user", "content": f"Où se trouve la gare {i} ?"}])

        for replica, response in from_both(ask).items():
            assert f'"{name}";' in response.headers["x-millm-probe-verdicts"], replica
            listed = api.get("/probes/events", params={"request_id": response.json()["id"]})
            results = [item["result"] for item in listed.json()["data"]]
            assert results and {r["probe"] for r in results} == {name}, replica  # each window
            assert {r["request_id"] for r in results} == {response.json()["id"]}
    finally:
        assert api.post(f"/probes/{name}/disarm", headers=JSON).status_code == 200


def _engine_replicas(cluster: LiveServer) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(cluster.process.pid).children(recursive=True):
        try:
            if "ServeReplica:miserver:EngineReplica" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def _one(v1: httpx.Client, i: int) -> tuple[int, str, dict[str, str]]:
    """A request of the burst: its status, its body or events, its headers."""
    body = {
        "model": GGUF_ID,
        "messages": [{"role": "user", "content": f"Count to twenty, attempt {i}."}],
        "max_tokens": 48,
        "stream": i % 2 == 0,
    }
    with v1.stream("POST", "/chat/completions", json=body) as response:
        text = response.read().decode()
        return response.status_code, text, dict(response.headers)


def _http_ports(process: psutil.Process) -> list[tuple[str, int]]:
    """The IPv4 ports `process` listens on that answer HTTP/1.1 (Ray's own speak gRPC)."""
    found = []
    for connection in process.net_connections(kind="tcp4"):
        if connection.status != psutil.CONN_LISTEN:
            continue
        host, port = connection.laddr
        host = "127.0.0.1" if host == "0.0.0.0" else host
        try:
            httpx.get(f"http://{host}:{port}/health", timeout=2.0)
        except httpx.HTTPError:
            continue
        found.append((host, port))
    return found


def test_a_replicas_own_port_refuses_a_request_without_the_clusters_key(
    cluster: LiveServer,
) -> None:
    """Issue 49 item 2: the ingress reaches each engine replica over HTTP, on a port of the
    replica's own (cluster/hop.py); that port is the cluster's, not the clients': without
    the key the ingress holds, or with another, a request gets 403 and reaches no model."""
    for replica in _engine_replicas(cluster):
        ports = _http_ports(replica)
        assert len(ports) == 1, (replica.pid, ports)
        host, port = ports[0]
        body = {"model": GGUF_ID, "messages": [{"role": "user", "content": "hi"}]}
        for headers in ({}, {"X-miLLM-Cluster-Key": "guess", "X-miLLM-Admitted-Epoch": "9"}):
            url = f"http://{host}:{port}/v1/chat/completions"
            refused = httpx.post(url, json=body, headers=headers, timeout=10.0)
            assert refused.status_code == 403, refused.text
            assert refused.content == b""


def test_a_replica_killed_during_a_burst_costs_no_500(
    cluster: LiveServer, v1: httpx.Client, api: httpx.Client
) -> None:
    """Issue 49 acceptance 4: `kill -9` of an engine replica during 16 requests (half
    streamed): no 500; each answer whole, or 503 replica_unavailable with Retry-After,
    or a stream ended by one error event. Ray restarts the replica, and within 60 s the
    cluster serves from two replicas again, the new one at the current epoch (the model
    lock set before the kill holds on it)."""
    before = _engine_replicas(cluster)
    assert len(before) == 2, before
    changed = api.put("/steering/lock", json={"model": GGUF_ID})  # the epoch moves
    assert changed.status_code == 200
    epoch = int(changed.headers[EPOCH])
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        burst = [pool.submit(_one, v1, i) for i in range(16)]
        time.sleep(1.5)  # the first rows are decoding
        victim = before[0]
        os.kill(victim.pid, signal.SIGKILL)
        answers = [f.result(timeout=300) for f in burst]
    for status, text, headers in answers:
        assert status in (200, 503), (status, text)
        if status == 503:
            assert json.loads(text)["error"]["code"] == "replica_unavailable"
            assert headers["retry-after"]
        elif headers["content-type"].startswith("text/event-stream"):
            assert text.endswith("data: [DONE]\n\n") or '"replica_unavailable"' in text, text
    assert sum(status == 200 for status, _, _ in answers) >= 8

    deadline = time.monotonic() + BACK_WITHIN_S
    while len(_engine_replicas(cluster)) < 2 or victim.is_running():
        assert time.monotonic() < deadline, "no second replica within 60 s"
        time.sleep(0.5)
    seen: set[str] = set()
    try:
        while len(seen) < 2:
            assert time.monotonic() < deadline, f"only {seen} answered within 60 s"
            with_prompt = [{"role": "user", "content": f"Back {len(seen)} {time.monotonic()}"}]
            response = v1.post(
                "/chat/completions",
                json={"model": GGUF_ID, "messages": with_prompt, "max_tokens": 2},
            )
            if response.status_code == 200:
                seen.add(response.headers[REPLICA])
                # the restarted replica caught up before it served: the lock holds there
                assert int(response.headers[EPOCH]) >= epoch
                assert [m["id"] for m in v1.get("/models").json()["data"]] == [GGUF_ID]
    finally:
        assert api.delete("/steering/lock", headers=JSON).status_code == 200


def test_cancel_stops_the_generation_on_whichever_replica_runs_it(
    cluster: LiveServer, v1: httpx.Client, api: httpx.Client
) -> None:
    """LOC-CANCEL-01..04 through the cluster: `/api/cancel` reaches every live replica, so
    the one running the generation stops it at its next token; idle, it answers false."""
    body = {
        "model": GGUF_ID,
        "messages": [{"role": "user", "content": "Count from one to a thousand."}],
        "max_tokens": 2000,
        "ignore_eos": True,  # long enough to be running when the cancel comes
        "stream": True,
    }
    with v1.stream("POST", "/chat/completions", json=body) as stream:
        lines = stream.iter_lines()
        chunks = [line for line in itertools.islice(lines, 12) if line.startswith("data: {")]
        assert chunks
        cancelled = api.post("/cancel", headers=JSON)
        assert cancelled.status_code == 200 and cancelled.json() == {"cancelled": True}
        rest = [line for line in lines if line.startswith("data: {")]
    reasons = [
        json.loads(line[6:])["choices"][0].get("finish_reason")
        for line in rest
        if '"choices": [{' in line
    ]
    assert "cancelled" in reasons
    idle = api.post("/cancel", headers=JSON)
    assert idle.status_code == 200 and idle.json() == {"cancelled": False}
