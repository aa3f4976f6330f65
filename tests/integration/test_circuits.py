"""Circuits through HTTP (REQ-000 CIRCUIT, RUNG, DIAL; issue 19 items 2-4): import, dial,
activate, apply at every layer of the circuit, X-miLLM-Circuit-Rung and its omissions.

The circuit spans two SAEs over two layers: the trained SAE attached as
OTHER_SAE_ID at layer 6 and as SAE_ID at layer 12. Generation is real and
greedy, so "steered the same way" is compared byte for byte against the same
strengths set as live values.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.steering import steering_set_hash
from miserver.steering.header import CircuitMember, ProfileMember, parse
from miserver.steering.rung import parse as parse_rung
from tests.conftest import JSON, MODEL_ID, OTHER_SAE_ID, SAE_ID, LocalClient, steering_settings

CHAT = "/v1/chat/completions"
RUNG = "X-miLLM-Circuit-Rung"
STEERING = "X-miLLM-Steering"
SINT = "X-miLLM-Steering-Intensity"
USER = [{"role": "user", "content": "Tell me about your favourite place."}]
MEMBERS = [  # 3 members over 2 layers, each through the SAE attached at its own layer
    {"sae_id": OTHER_SAE_ID, "layer": 6, "index": 5, "strength": 60.0},
    {"sae_id": SAE_ID, "layer": 12, "index": 9, "strength": -80.0},
    {"sae_id": SAE_ID, "layer": 12, "index": 5, "strength": 40.0},
]


def circuit_doc(circuit_id: str = "crc_two_layer", **fields: Any) -> dict[str, Any]:
    return {
        "schema": "mi.circuit/v1",
        "id": circuit_id,
        "name": "two layers",
        "members": MEMBERS,
        "evidence": {
            "rung": 2,
            "ladder": [{"rung": 2, "method": "edge patching", "summary": "each edge"}],
        },
        **fields,
    }


# -- management, no model ----------------------------------------------------------------


def test_circuits_are_imported_listed_dialled_activated_and_persist(
    tmp_path: Path, saes_dir: Path
) -> None:
    """Issue 19 item 2, OAI-CIRCUIT-08: POST /api/circuits stores a mi.circuit/v1 document
    (201, then 200 replacing it), refusals name the JSON pointer or the field and store
    nothing; the dial and the active flag are set alone and survive a restart with the
    document; every change moves the steering epoch; an unknown id is 404
    circuit_not_found."""
    settings = steering_settings(tmp_path / "data", saes_dir)
    with LocalClient(Server(settings, preload=False)) as client:
        epoch = client.get("/api/steering").json()["epoch"]
        created = client.post("/api/circuits", json=circuit_doc(intensity=0.8))
        assert created.status_code == 201, created.text
        view = created.json()["circuit"]
        assert (view["rung"], view["language"], view["layers"]) == (
            2,
            "causally validated (edge)",
            [6, 12],
        )
        assert (view["intensity"], view["members"], view["active"]) == (0.8, 3, False)
        assert created.json()["epoch"] > epoch
        assert client.post("/api/circuits", json=circuit_doc(intensity=0.8)).status_code == 200
        refusals = {
            "members[1].strength": {
                **circuit_doc("x"),
                "members": [MEMBERS[0], {**MEMBERS[1], "strength": "big"}],
            },
            "evidence.rung": {**circuit_doc("x"), "evidence": {"rung": 4}},
            "members[0].sae_id": {
                **circuit_doc("x"),
                "members": [{**MEMBERS[0], "sae_id": "nope"}],
            },
            "members[0].index": {**circuit_doc("x"), "members": [{**MEMBERS[0], "index": 2048}]},
            "backing_cluster": circuit_doc("x", mode="slice_fallback", backing_cluster="none"),
            "id": circuit_doc("active"),
            "members[1].index": {**circuit_doc("x"), "members": [MEMBERS[0], MEMBERS[0]]},
        }
        for param, doc in refusals.items():
            refused = client.post("/api/circuits", json=doc)
            assert refused.status_code == 400, (param, refused.text)
            assert refused.json()["error"]["param"] == param
        assert [c["id"] for c in client.get("/api/circuits").json()["data"]] == ["crc_two_layer"]
        dialled = client.put("/api/circuits/crc_two_layer/dial", json={"intensity": 1.4})
        assert dialled.status_code == 200, dialled.text
        assert dialled.json()["circuit"]["intensity"] == 1.4
        assert dialled.json()["epoch"] > created.json()["epoch"]
        assert (
            client.put("/api/circuits/crc_two_layer/dial", json={"intensity": 2.5}).status_code
            == 400
        )
        active = client.put("/api/circuits/crc_two_layer/active", headers=JSON)
        assert active.status_code == 200, active.text
        assert [c["id"] for c in active.json()["circuits"]] == ["crc_two_layer"]
        assert active.json()["steering"] is None  # no model: nothing steers
        assert client.get("/api/steering").json()["active_circuits"] == ["crc_two_layer"]
        for method, path in (
            ("GET", "/api/circuits/nope"),
            ("DELETE", "/api/circuits/nope"),
            ("PUT", "/api/circuits/nope/active"),
        ):
            missing = client.request(method, path, headers=JSON)
            assert (missing.status_code, missing.json()["error"]["code"]) == (
                404,
                "circuit_not_found",
            )
    with LocalClient(Server(settings, preload=False)) as client:
        again = client.get("/api/circuits/crc_two_layer").json()
        assert (again["intensity"], again["active"], again["document"]["intensity"]) == (
            1.4,
            True,
            0.8,
        )
        gone = client.delete("/api/circuits/crc_two_layer", headers=JSON)
        assert (gone.status_code, gone.json()["circuits"]) == (200, [])
        assert client.get("/api/circuits").json()["data"] == []


# -- with the model ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("circuits") / "data"


@pytest.fixture(scope="module")
def circuit_db(data_dir: Path, saes_dir: Path) -> Path:
    return steering_settings(data_dir, saes_dir).database_path


@pytest.fixture(scope="module")
def server(data_dir: Path, saes_dir: Path) -> Iterator[TestClient]:
    settings = steering_settings(data_dir, saes_dir)
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        yield client


def reset(client: TestClient) -> None:
    """No circuit, no profile, nothing attached."""
    for c in client.get("/api/circuits").json()["data"]:
        assert client.delete(f"/api/circuits/{c['id']}", headers=JSON).status_code == 200
    assert client.put("/api/steering/active-profile", json={"name": None}).status_code == 200
    for p in client.get("/api/profiles").json()["data"]:
        assert client.delete(f"/api/profiles/{p['name']}", headers=JSON).status_code == 200
    for a in client.get("/api/steering").json()["attachments"]:
        path = f"/api/steering/attachments/{a['sae_id']}/{a['layer']}"
        assert client.delete(path, headers=JSON).is_success


@pytest.fixture
def clean(server: TestClient) -> Iterator[TestClient]:
    reset(server)
    yield server
    reset(server)


def attach_both(client: TestClient) -> None:
    for sae_id, layer in ((OTHER_SAE_ID, 6), (SAE_ID, 12)):
        attached = client.post("/api/steering/attachments", json={"sae_id": sae_id, "layer": layer})
        assert attached.status_code in (200, 201), attached.text


def activate(client: TestClient, doc: dict[str, Any]) -> None:
    assert client.post("/api/circuits", json=doc).status_code in (200, 201)
    assert client.put(f"/api/circuits/{doc['id']}/active", headers=JSON).status_code == 200


def chat(client: TestClient, **extra: Any) -> tuple[str, dict[str, str]]:
    body = {"model": MODEL_ID, "messages": USER, "max_tokens": 16, "temperature": 0, **extra}
    response = client.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"], dict(response.headers)


def live_values(client: TestClient, sae_id: str, layer: int, values: dict[int, float]) -> None:
    features = [{"index": i, "strength": s} for i, s in values.items()]
    path = f"/api/steering/attachments/{sae_id}/{layer}/features"
    assert client.put(path, json={"features": features}).status_code == 200


def circuit_member(headers: dict[str, str]) -> CircuitMember:
    [member] = [m for m in parse(headers[STEERING.lower()]) if isinstance(m, CircuitMember)]
    return member


@pytest.mark.model
def test_a_two_layer_circuit_steers_through_each_layers_sae(clean: TestClient) -> None:
    """OAI-CIRCUIT-01, OAI-CIRCUIT-02, OAI-GRAM-11, OAI-GRAM-12, OAI-RUNG-01, OAI-RUNG-02,
    OAI-RUNG-07, OAI-RUNG-18: an active circuit over layers 6 and 12 changes the greedy text;
    the text is exactly the one the same strengths give as live values on both attachments,
    and differs from either layer alone, so both layers applied; the response carries one
    `circuit` member and `X-miLLM-Circuit-Rung: 2;language="causally validated (edge)"`,
    which GET /api/circuits/active states too, with each layer's applied-set hash. Live
    values on an attachment the circuit claims are not applied (OAI-GRAM-10). Embeddings are
    the same with the circuit active and not: no layer of it steers them (OAI-EMB-35)."""
    client = clean
    attach_both(client)
    plain, plain_headers = chat(client)
    assert RUNG.lower() not in plain_headers  # OAI-RUNG-09
    activate(client, circuit_doc())
    steered, headers = chat(client)
    assert steered != plain
    assert circuit_member(headers) == CircuitMember("crc_two_layer", 1.0)
    assert headers[RUNG.lower()] == '2;language="causally validated (edge)"'
    assert parse_rung(headers[RUNG.lower()]) == (2, "causally validated (edge)")
    active = client.get("/api/circuits/active").json()
    assert active["steering"] == {
        "rung": 2,
        "language": "causally validated (edge)",
        "header": headers[RUNG.lower()],
    }
    [state] = active["circuits"]
    assert state["steering"] and state["resolved_intensity"] == 1.0
    assert [(layer["sae_id"], layer["layer"], layer["hash"]) for layer in state["layers"]] == [
        (OTHER_SAE_ID, 6, steering_set_hash(OTHER_SAE_ID, [(5, 60.0)])),
        (SAE_ID, 12, steering_set_hash(SAE_ID, [(9, -80.0), (5, 40.0)])),
    ]
    live_values(client, SAE_ID, 12, {3: 90.0})  # claimed by the circuit: not applied
    assert chat(client)[0] == steered
    embed = {"model": MODEL_ID, "input": ["the sea", "a mountain"]}
    steered_vectors = client.post("/v1/embeddings", json=embed).json()["data"]
    assert client.delete("/api/circuits/crc_two_layer/active", headers=JSON).status_code == 200
    assert client.post("/v1/embeddings", json=embed).json()["data"] == steered_vectors
    live_values(client, OTHER_SAE_ID, 6, {5: 60.0})
    only_six, _ = chat(client)
    live_values(client, SAE_ID, 12, {9: -80.0, 5: 40.0})
    both, _ = chat(client)
    live_values(client, OTHER_SAE_ID, 6, {})
    only_twelve, _ = chat(client)
    assert both == steered
    assert steered not in (only_six, only_twelve)


@pytest.mark.model
def test_the_circuit_dial_clamps_from_both_sides_and_re_derives_members(
    clean: TestClient,
) -> None:
    """OAI-CIRCUIT-03, OAI-CIRCUIT-04, OAI-CIRCUIT-05, OAI-CIRCUIT-07, OAI-CIRCUIT-08,
    OAI-DIAL-08, OAI-SINT-01, OAI-RUNG-13: against an authored [0.5, 1.5], λ 0.1 runs at 0.5
    (a cluster with the same range runs at 0.1), 1.9 at 1.5, "max" at 1.5; 0 and "off" turn
    it off (no circuit member, no rung); without a range "min" is off; the persistent dial
    is absolute, never compounding: a request at 1.0 after the dial moved to 1.5 runs what
    1.0 runs."""
    client = clean
    attach_both(client)
    activate(client, circuit_doc(intensity_range=[0.5, 1.5]))
    for sent, runs in ((0.1, 0.5), (1.9, 1.5), ("max", 1.5), ("min", 0.5), (1.2, 1.2)):
        _, headers = chat(client, steering_intensity=sent)
        assert circuit_member(headers).intensity == runs, sent
        assert headers[SINT.lower()] == repr(runs)
    at_one, _ = chat(client, steering_intensity=1.0)
    client.put("/api/circuits/crc_two_layer/dial", json={"intensity": 1.5})
    assert chat(client, steering_intensity=1.0)[0] == at_one
    plain_text = chat(client, steering_intensity="off")[0]
    for off in (0, "off"):
        text, headers = chat(client, steering_intensity=off)
        assert headers[STEERING.lower()] == "none" and RUNG.lower() not in headers
        assert text == plain_text
    activate(client, circuit_doc())  # replaced: no declared range now
    _, headers = chat(client, steering_intensity="min")
    assert headers[STEERING.lower()] == "none" and RUNG.lower() not in headers
    _, headers = chat(client, steering_intensity=0.1)  # CIRCUIT_INTENSITY_MIN 0: as sent
    assert circuit_member(headers).intensity == 0.1
    cluster = {
        "schema": "mi.cluster/v1",
        "name": "c",
        "sae_id": SAE_ID,
        "layer": 12,
        "features": [{"index": 9, "strength": -80.0}],
        "intensity_range": [0.5, 1.5],
    }
    assert client.post("/api/clusters", json=cluster).status_code == 201
    _, headers = chat(client, profile="c", steering_intensity=0.1)
    [member] = parse(headers[STEERING.lower()])
    assert isinstance(member, ProfileMember) and member.intensity == 0.1


@pytest.mark.model
def test_strong_members_saturate_while_weak_ones_keep_scaling(clean: TestClient) -> None:
    """OAI-CIRCUIT-09, OAI-HASH-06: at λ 2 a member authored at 150 applies 200 (clamped)
    while one at 10 applies 20: the layer's hash is over {200, 20}, `clamped` counts one,
    and the greedy text is the one those live values give."""
    client = clean
    attach_both(client)
    members = [
        {"sae_id": SAE_ID, "layer": 12, "index": 9, "strength": 150.0},
        {"sae_id": SAE_ID, "layer": 12, "index": 5, "strength": 10.0},
    ]
    activate(client, {**circuit_doc("crc_sat"), "members": members, "intensity": 2.0})
    [state] = client.get("/api/circuits/active").json()["circuits"]
    [layer] = state["layers"]
    assert (layer["clamped"], layer["features"]) == (1, 2)
    assert layer["hash"] == steering_set_hash(SAE_ID, [(9, 200.0), (5, 20.0)])
    steered, _ = chat(client)
    assert client.delete("/api/circuits/crc_sat/active", headers=JSON).status_code == 200
    live_values(client, SAE_ID, 12, {9: 200.0, 5: 20.0})
    assert chat(client)[0] == steered


@pytest.mark.model
def test_slice_fallback_steers_by_its_cluster_without_a_rung(clean: TestClient) -> None:
    """OAI-CIRCUIT-10, OAI-RUNG-10, OAI-RUNG-16: a slice-fallback circuit steers by its
    backing cluster as a `profile` member (source=active), by the cluster rule: its own
    dial, a numeric λ below the floor honoured, "min" at CLUSTER_INTENSITY_MIN 0.5; no
    X-miLLM-Circuit-Rung, and GET /api/circuits/active's `steering` is null. Changing the
    backing cluster moves the epoch and steers the next request."""
    client = clean
    attach_both(client)
    cluster = {
        "schema": "mi.cluster/v1",
        "name": "backing",
        "sae_id": SAE_ID,
        "layer": 12,
        "features": [{"index": 9, "strength": -80.0}],
    }
    assert client.post("/api/clusters", json=cluster).status_code == 201
    doc = circuit_doc("crc_slice", mode="slice_fallback", backing_cluster="backing")
    activate(client, {**doc, "intensity": 0.8})
    for sent, runs in ((None, 0.8), (0.1, 0.1), ("min", 0.5)):
        extra = {} if sent is None else {"steering_intensity": sent}
        _, headers = chat(client, **extra)
        [member] = parse(headers[STEERING.lower()])
        assert isinstance(member, ProfileMember), headers[STEERING.lower()]
        assert (member.name, member.source, member.intensity) == ("backing", "active", runs)
        assert member.hash == steering_set_hash(SAE_ID, [(9, -80.0 * runs)])
        assert RUNG.lower() not in headers
    active = client.get("/api/circuits/active").json()
    assert active["steering"] is None and active["circuits"][0]["steering"] is True
    [layer] = active["circuits"][0]["layers"]  # what the backing cluster applies
    assert (layer["sae_id"], layer["layer"], layer["hash"]) == (
        SAE_ID,
        12,
        steering_set_hash(SAE_ID, [(9, -80.0 * 0.8)]),
    )
    epoch = active["epoch"]
    cluster["features"] = [{"index": 9, "strength": -40.0}]  # the backing cluster changes
    assert client.post("/api/clusters", json=cluster).json()["epoch"] > epoch
    [member] = parse(chat(client)[1][STEERING.lower()])
    assert isinstance(member, ProfileMember)
    assert member.hash == steering_set_hash(SAE_ID, [(9, -40.0 * 0.8)])


@pytest.mark.model
def test_the_rung_header_omissions_and_the_lowest_rung(clean: TestClient) -> None:
    """OAI-RUNG-05, OAI-RUNG-06, OAI-RUNG-12, OAI-RUNG-14, OAI-RUNG-15, OAI-RUNG-17,
    OAI-GRAM-22, OAI-GRAM-25: no SAE on the circuit's layers, no rung; inline steering and
    scoring, no rung; two circuits on one layer are both `composed` and the header gives the
    lower rung (0 is still sent: "associated"); a stream carries no rung header."""
    client = clean
    activate(client, circuit_doc())
    _, headers = chat(client)
    assert headers[STEERING.lower()] == "none" and RUNG.lower() not in headers
    attach_both(client)
    inline = {"sae_id": SAE_ID, "features": [{"index": 3, "strength": 20.0}]}
    _, headers = chat(client, steering=inline)
    assert RUNG.lower() not in headers
    scoring = client.post(
        CHAT,
        json={"model": MODEL_ID, "messages": USER, "max_tokens": 1, "logprobs": True},
    )
    assert scoring.status_code == 200 and RUNG not in scoring.headers
    low = {**circuit_doc("crc_low"), "members": [MEMBERS[2]], "evidence": {"rung": 0}}
    activate(client, low)
    _, headers = chat(client)
    members = [m for m in parse(headers[STEERING.lower()]) if isinstance(m, CircuitMember)]
    assert [(m.id, m.composed) for m in members] == [("crc_low", True), ("crc_two_layer", True)]
    assert headers[RUNG.lower()] == '0;language="associated"'
    one = {**circuit_doc("crc_one"), "members": [MEMBERS[0]], "evidence": {"rung": 1}}
    assert client.delete("/api/circuits/crc_low", headers=JSON).status_code == 200
    activate(client, one)
    _, headers = chat(client)
    assert headers[RUNG.lower()] == '1;language="suggested (attribution-supported)"'
    body = {"model": MODEL_ID, "messages": USER, "max_tokens": 4, "stream": True}
    with client.stream("POST", CHAT, json=body) as streamed:
        assert streamed.status_code == 200 and RUNG not in streamed.headers
        lines = [line for line in streamed.iter_lines() if line]
    assert any("millm_steering" in line and "circuit;" in line for line in lines)


@pytest.mark.model
def test_an_unreadable_circuit_claims_no_rung(clean: TestClient, circuit_db: Path) -> None:
    """OAI-RUNG-11: an active circuit whose stored definition no longer parses is listed with
    its `error`, steers nothing, and keeps the rung header off while another circuit steers
    (its rung might be the lowest); replacing it makes it readable again."""
    client = clean
    attach_both(client)
    for doc in (circuit_doc(), circuit_doc("crc_broken")):
        activate(client, doc)
    assert RUNG.lower() in chat(client)[1]
    with sqlite3.connect(circuit_db) as db:
        db.execute("UPDATE circuits SET document = '{\"id\": 3}' WHERE id = 'crc_broken'")
    client.put("/api/circuits/crc_two_layer/dial", json={"intensity": 1.0})  # re-reads them
    broken = client.get("/api/circuits/crc_broken").json()
    assert broken["error"] and broken["rung"] is None and broken["live"] is False
    _, headers = chat(client)
    assert circuit_member(headers).id == "crc_two_layer" and RUNG.lower() not in headers
    active = client.get("/api/circuits/active").json()
    assert active["steering"] is None
    assert {c["id"]: c["error"] is None for c in active["circuits"]} == {
        "crc_broken": False,
        "crc_two_layer": True,
    }
    activate(client, circuit_doc("crc_broken"))
    assert RUNG.lower() in chat(client)[1]
