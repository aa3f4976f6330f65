"""Steering through the HTTP surface: /api management, and per-request profile, dial, inline.

One server (the transformers SmolLM2 with the trained SAE twice in its saes
dir) serves the whole module; every test starts and ends with nothing
attached, no active profile and no stored profile. Generation is real and
greedy, so "unsteered" outputs are compared byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient

from miserver.app import Server
from miserver.engines.base import ChatPrompt
from miserver.steering import steering_set_hash
from tests.conftest import (
    JSON,
    MODEL_ID,
    OTHER_SAE_ID,
    SAE_ID,
    LocalClient,
    steering_settings,
)
from tests.errors import error_of
from tests.events import data_of
from tests.prometheus import samples
from tests.steering_http import (
    LAYER,
    STEERING,
    STORED,
    USER,
    activate,
    activate_raw,
    attach,
    features,
    inline,
    inline_value,
    manual_value,
    profile_path,
    profile_value,
    put_profile,
    reset,
    set_values,
    state,
    steering_of,
    text,
    values_path,
)

pytestmark = pytest.mark.model

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
D_SAE = 2048
SINT = "X-miLLM-Steering-Intensity"
UNICODE_NAME = 'Häppy ☀ 100% "x"'
UNICODE_WIRE = "H%C3%A4ppy %E2%98%80 100%25 %22x%22"  # OAI-GRAM-18


# -- the server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, saes_dir: Path) -> Iterator[TestClient]:
    """One steering server for the module (as `steer_settings`, with a module data dir)."""
    settings = steering_settings(tmp_path_factory.mktemp("steer") / "data", saes_dir)
    with LocalClient(Server(settings), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(autouse=True)
def clean(server: TestClient) -> Iterator[None]:
    reset(server)
    yield
    reset(server)


@pytest.fixture(scope="module")
def plain_text(server: TestClient) -> str:
    """The greedy answer with no steering anywhere (the byte-for-byte baseline)."""
    reset(server)
    response = chat(server)
    assert response.headers[STEERING] == "none"
    return text(response)


@pytest.fixture(scope="module")
def strong(server: TestClient) -> int:
    """A feature that fires on the prompt, so steering along it changes the answer."""
    engine = server.app.state.manager.resident.engine  # type: ignore[attr-defined]
    sae = server.app.state.steering.saes.get(SAE_ID)  # type: ignore[attr-defined]
    captured: list[torch.Tensor] = []
    layer = engine.model.model.layers[sae.layer]
    handle = layer.register_forward_hook(lambda _m, _a, out: captured.append(out.detach()))
    try:
        with torch.inference_mode():
            engine.model(torch.tensor([engine.render_chat(ChatPrompt(tuple(USER)))]))
    finally:
        handle.remove()
    return int(sae.encode(captured[0][0]).sum(0).argmax())


# -- helpers -------------------------------------------------------------------------


def chat(client: TestClient, **extra: Any) -> Any:
    body = {"model": MODEL_ID, "messages": USER, "max_tokens": 8, "temperature": 0, **extra}
    return client.post(CHAT, json=body)


# -- management API ----------------------------------------------------------------------


def test_saes_are_listed_with_their_attachments(server: TestClient) -> None:
    """REQ-000 open point 1: GET /api/saes lists each SAE, its shape and its attachments."""
    listing = server.get("/api/saes").json()
    assert listing["object"] == "list"
    by_id = {s["id"]: s for s in listing["data"]}
    assert set(by_id) == {SAE_ID, OTHER_SAE_ID}
    for sae in by_id.values():
        assert (sae["d_in"], sae["d_sae"], sae["layer"]) == (576, D_SAE, LAYER)
        assert sae["attached"] == [] and sae["error"] is None
    attach(server)
    by_id = {s["id"]: s for s in server.get("/api/saes").json()["data"]}
    assert by_id[SAE_ID]["attached"] == [{"model": MODEL_ID, "layer": LAYER}]
    assert by_id[OTHER_SAE_ID]["attached"] == []


def test_attach_and_detach(server: TestClient) -> None:
    """REQ-000 open point 1: attach (201, then 200), at a second layer (29, the last); detach."""
    first = server.post("/api/steering/attachments", json={"sae_id": SAE_ID})
    assert first.status_code == 201, first.text
    change = first.json()
    assert change["attachment"] == {
        "model": MODEL_ID,
        "sae_id": SAE_ID,
        "layer": LAYER,
        "d_sae": D_SAE,
        "features": [],
        "live": False,
    }
    assert change["live"] is False and change["steering"] == "none"
    again = server.post("/api/steering/attachments", json={"sae_id": SAE_ID, "layer": LAYER})
    assert again.status_code == 200, again.text
    assert again.json()["epoch"] == change["epoch"]  # nothing changed
    second = server.post("/api/steering/attachments", json={"sae_id": SAE_ID, "layer": 29})
    assert second.status_code == 201 and second.json()["attachment"]["layer"] == 29
    pairs = [(a["sae_id"], a["layer"]) for a in state(server)["attachments"]]
    assert pairs == [(SAE_ID, LAYER), (SAE_ID, 29)]
    set_values(server, {1: 3.0}, layer=29)
    detached = server.delete(f"/api/steering/attachments/{SAE_ID}/29", headers=JSON)
    assert detached.status_code == 200, detached.text
    assert [(a["sae_id"], a["layer"]) for a in detached.json()["attachments"]] == [(SAE_ID, LAYER)]
    assert detached.json()["steering"] == "none"
    gone = server.delete(f"/api/steering/attachments/{SAE_ID}/29", headers=JSON)
    error_of(gone, 404, "not_found", "sae_id")
    assert attach(server, layer=29)["attachment"]["features"] == []  # the values went with it


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"sae_id": "no-such-sae"}, 404, "not_found", "sae_id"),
        ({"sae_id": SAE_ID, "layer": 30}, 400, "invalid_parameter", "layer"),
        ({"sae_id": SAE_ID, "layer": -1}, 400, "invalid_parameter", "layer"),
    ],
    ids=["unknown-sae", "layer-past-the-model", "negative-layer"],
)
def test_attach_refusals(
    server: TestClient, body: dict[str, Any], status: int, code: str, param: str
) -> None:
    """REQ-000 open point 1, OAI-ERR-01: unknown SAE 404, a layer outside 0..29 400."""
    error_of(server.post("/api/steering/attachments", json=body), status, code, param)
    assert state(server)["attachments"] == []


def test_live_values_are_manual_steering(server: TestClient) -> None:
    """OAI-CONC-03, OAI-GRAM-10, OAI-HASH-19: live values are live and reported as `manual`."""
    attach(server)
    pairs = {5: 12.0, 9: -3.5}
    change = set_values(server, pairs)
    assert change["live"] is True and change["attachment"]["live"] is True
    assert change["attachment"]["features"] == features(pairs)
    assert change["steering"] == manual_value(pairs)
    assert steering_of(chat(server)) == manual_value(pairs)
    edge = set_values(server, {1: 200.0, 2: -200.0, 3: 0.0})  # ±200 is allowed, 0 dropped
    assert edge["attachment"]["features"] == features({1: 200.0, 2: -200.0})
    assert edge["steering"] == manual_value({1: 200.0, 2: -200.0})
    cleared = server.delete(values_path(), headers=JSON)
    assert cleared.status_code == 200, cleared.text
    assert cleared.json()["live"] is False and cleared.json()["steering"] == "none"
    assert steering_of(chat(server)) == "none"


@pytest.mark.parametrize(
    ("pairs", "code", "param"),
    [
        ([(1, 250.0)], "invalid_parameter", "features"),
        ([(1, -200.5)], "invalid_parameter", "features"),
        ([(D_SAE, 1.0)], "INVALID_FEATURE_INDEX", "features"),
        ([(7, 1.0), (7, 2.0)], "invalid_parameter", "features[1].index"),
    ],
    ids=["strength-250", "strength-minus-200.5", "index-d_sae", "duplicate-index"],
)
def test_live_value_refusals(
    server: TestClient, pairs: list[tuple[int, float]], code: str, param: str
) -> None:
    """REQ-000 open point 1/9, OAI-ERR-01: live values within ±200 and the SAE, each once."""
    attach(server)
    before = state(server)
    body = {"features": [{"index": i, "strength": s} for i, s in pairs]}
    error = error_of(server.put(values_path(), json=body), 400, code, param)
    if param.endswith(".index"):
        assert "7" in error["message"]
    assert state(server) == before


def test_live_values_on_an_unattached_pair_are_404(server: TestClient) -> None:
    """REQ-000 open point 1, OAI-ERR-01: live values need the attachment (404 not_found)."""
    attach(server)
    response = server.put(values_path(layer=6), json={"features": features({1: 1.0})})
    error_of(response, 404, "not_found", "sae_id")


def test_the_epoch_moves_on_every_operator_change(server: TestClient) -> None:
    """REQ-000 open point 30, OAI-INL-04 (contrast): each operator change moves the epoch."""
    epochs = [state(server)["epoch"]]
    epochs.append(attach(server)["epoch"])
    epochs.append(attach(server, layer=6)["epoch"])
    epochs.append(set_values(server, {1: 2.0})["epoch"])
    epochs.append(server.delete(values_path(), headers=JSON).json()["epoch"])
    assert put_profile(server, "p").status_code == 201
    epochs.append(activate(server, "p")["epoch"])
    epochs.append(put_profile(server, "p", {1: 3.0}).json()["epoch"])  # the active one changed
    deleted = server.delete(profile_path("p"), headers=JSON)  # the active one is gone
    epochs.append(deleted.json()["epoch"])
    assert server.get("/api/steering/active-profile").json()["name"] is None
    epochs.append(
        server.delete(f"/api/steering/attachments/{SAE_ID}/6", headers=JSON).json()["epoch"]
    )
    assert epochs == sorted(set(epochs)), epochs  # strictly increasing


def test_profile_crud(server: TestClient) -> None:
    """REQ-000 open point 1, OAI-DIAL-02: profile CRUD, 201 then 200; unknown names 404."""
    created = put_profile(server, "calm", description="first", intensity_range=[0.5, 1.5])
    assert created.status_code == 201, created.text
    view = created.json()["profile"]
    assert view["name"] == "calm" and view["sae_id"] == SAE_ID and view["layer"] == LAYER
    assert view["features"] == features(dict(sorted(STORED.items())))
    assert view["description"] == "first"
    assert view["intensity"] == 1.0 and view["intensity_range"] == [0.5, 1.5]
    assert view["active"] is False and created.json()["live"] is False
    replaced = put_profile(server, "calm", {2: 1.0}, description="second", intensity=0.5)
    assert replaced.status_code == 200, replaced.text
    again = replaced.json()["profile"]
    assert again["created"] == view["created"]
    assert again["features"] == features({2: 1.0}) and again["description"] == "second"
    assert again["intensity"] == 0.5 and again["intensity_range"] is None
    assert server.get(profile_path("calm")).json() == again
    assert [p["name"] for p in server.get("/api/profiles").json()["data"]] == ["calm"]
    assert server.delete(profile_path("calm"), headers=JSON).status_code == 200
    error_of(server.get(profile_path("calm")), 404, "profile_not_found", "name")
    error_of(server.delete(profile_path("calm"), headers=JSON), 404, "profile_not_found", "name")
    assert server.get("/api/profiles").json()["data"] == []


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"intensity": 3}, "intensity"),
        ({"intensity": -0.5}, "intensity"),
        ({"intensity_range": [1.5, 0.5]}, "intensity_range"),
        ({"intensity_range": [0.5, 2.5]}, "intensity_range[1]"),
        (
            {"features": [{"index": 4, "strength": 1.0}, {"index": 4, "strength": 2.0}]},
            "features[1].index",
        ),
    ],
    ids=["intensity-3", "intensity-negative", "range-reversed", "range-past-2", "duplicate"],
)
def test_invalid_profiles_are_400(server: TestClient, extra: dict[str, Any], param: str) -> None:
    """OAI-DIAL-04/05: the dial and its declared range lie in [0, 2], low <= high."""
    error_of(put_profile(server, "bad", **extra), 400, "invalid_parameter", param)
    error_of(server.get(profile_path("bad")), 404, "profile_not_found", "name")


def test_active_profile(server: TestClient) -> None:
    """OAI-HDR-20, OAI-GRAM-29, OAI-CONC-03: an active profile steers plain requests."""
    error_of(activate_raw(server, "nobody"), 404, "profile_not_found", "name")
    attach(server)
    put_profile(server, "humor")
    change = activate(server, "humor")
    expected = profile_value("humor", "active", 1.0)
    assert change == {
        "name": "humor",
        "live": True,
        "epoch": change["epoch"],
        "steering": expected,
    }
    assert server.get("/api/steering/active-profile").json() == change
    assert state(server)["active_profile"] == "humor"
    assert server.get(profile_path("humor")).json()["active"] is True
    response = chat(server)
    assert steering_of(response) == expected
    assert SINT not in response.headers
    assert activate(server, None) == {
        "name": None,
        "live": False,
        "epoch": change["epoch"] + 1,
        "steering": "none",
    }


def test_an_active_profile_whose_sae_is_not_attached_is_not_live(server: TestClient) -> None:
    """OAI-CONC-03: the profile is active but steers nothing until its SAE is attached."""
    put_profile(server, "humor", sae_id=OTHER_SAE_ID)
    change = activate(server, "humor")
    assert change["live"] is False and change["steering"] == "none"
    attach(server)  # another SAE
    assert activate(server, "humor")["live"] is False
    assert steering_of(chat(server)) == "none"
    attach(server, OTHER_SAE_ID)
    assert server.get("/api/steering/active-profile").json()["live"] is True
    expected = profile_value("humor", "active", 1.0, sae_id=OTHER_SAE_ID)
    assert steering_of(chat(server)) == expected


def test_live_values_under_an_active_profile_are_not_live(server: TestClient) -> None:
    """OAI-CONC-03, OAI-GRAM-25: values on the pair the active profile claims wait behind it."""
    attach(server)
    attach(server, OTHER_SAE_ID)
    put_profile(server, "humor")
    activate(server, "humor")
    claimed = set_values(server, {1: 5.0})
    assert claimed["live"] is False
    assert claimed["steering"] == profile_value("humor", "active", 1.0)
    free = set_values(server, {2: 6.0}, OTHER_SAE_ID)
    assert free["live"] is True
    both = f"{profile_value('humor', 'active', 1.0)}, {manual_value({2: 6.0}, OTHER_SAE_ID)}"
    assert free["steering"] == both
    assert steering_of(chat(server)) == both
    activate(server, None)
    assert [a["live"] for a in state(server)["attachments"]] == [True, True]
    both_manual = f"{manual_value({1: 5.0})}, {manual_value({2: 6.0}, OTHER_SAE_ID)}"
    assert steering_of(chat(server)) == both_manual  # the waiting values are live now


# -- inline steering -----------------------------------------------------------------------


def test_inline_applies_to_one_request_only(server: TestClient) -> None:
    """OAI-INL-01..04, OAI-INL-06, OAI-INL-17, OAI-INL-29, OAI-HASH-19, OAI-CHAT-29."""
    attach(server)
    set_values(server, {1: 4.0})
    before = state(server)
    pairs = {10: 8.0, 3: -2.5}
    response = chat(server, steering=inline(pairs))
    assert steering_of(response) == inline_value(pairs)  # the live values are not applied
    assert SINT not in response.headers
    assert state(server) == before  # same epoch, same header, same values
    assert server.get("/api/profiles").json()["data"] == []  # OAI-INL-02
    assert steering_of(chat(server)) == manual_value({1: 4.0})
    nulls = chat(server, steering=inline(pairs), profile=None, steering_intensity=None)
    assert steering_of(nulls) == inline_value(pairs)  # null is "not sent" (OAI-CHAT-30/31)


def test_inline_clamps_and_reports_the_clamp(server: TestClient) -> None:
    """OAI-INL-12, OAI-INL-13, OAI-HASH-05, OAI-HASH-18, OAI-GRAM-17: ±200, clamped=N."""
    attach(server)
    one = steering_of(chat(server, steering=inline({3: 500.0}, SAE_ID)))
    assert one == inline_value({3: 200.0}, clamped=1)
    assert f'hash="{steering_set_hash(SAE_ID, [{"index": 3, "strength": 200.0}])}"' in one
    two = steering_of(chat(server, steering=inline({3: 500.0, 4: -201.0, 5: 200.0})))
    assert two == inline_value({3: 200.0, 4: -200.0, 5: 200.0}, clamped=2)


def test_empty_inline_features_mean_unsteered(server: TestClient, plain_text: str) -> None:
    """OAI-INL-14, OAI-INL-18: `features: []` turns off manual values and the active profile."""
    attach(server)
    attach(server, OTHER_SAE_ID)
    set_values(server, {1: 150.0})
    put_profile(server, "humor", sae_id=OTHER_SAE_ID)
    activate(server, "humor")
    assert steering_of(chat(server)) != "none"
    response = chat(server, steering={"features": []})
    assert steering_of(response) == "none"
    assert text(response) == plain_text


def test_inline_disables_every_other_sae(server: TestClient) -> None:
    """OAI-INL-05, OAI-INL-17, OAI-INL-18: only the named SAE steers, with only the given set."""
    attach(server)
    attach(server, OTHER_SAE_ID)
    set_values(server, {1: 5.0})
    set_values(server, {2: 6.0}, OTHER_SAE_ID)
    response = chat(server, steering=inline({9: 3.0}, OTHER_SAE_ID))
    assert steering_of(response) == inline_value({9: 3.0}, OTHER_SAE_ID)


def test_inline_steers_generation_and_strength_zero_changes_nothing(
    server: TestClient, plain_text: str, strong: int
) -> None:
    """OAI-INL-01, OAI-HASH-04: a strong feature changes the answer; strength 0 is a no-op."""
    attach(server)
    steered = chat(server, steering=inline({strong: 150.0}))
    assert steering_of(steered) == inline_value({strong: 150.0})
    assert text(steered) != plain_text
    zero = chat(server, steering=inline({strong: 0.0, strong + 1: -0.0}))
    assert steering_of(zero) == inline_value({})
    assert steering_of(zero).startswith(f'inline;sae="{SAE_ID}";layer={LAYER};features=0;hash=')
    assert text(zero) == plain_text
    assert text(chat(server)) == plain_text  # nothing left behind


@pytest.mark.parametrize(
    ("extra", "code", "param", "named"),
    [
        (
            {"steering": {"sae_id": SAE_ID, "features": []}},
            "invalid_parameter",
            "steering.sae_id",
            (),
        ),
        (
            {"steering": inline({1: 1.0}), "profile": "p"},
            "invalid_parameter",
            "steering",
            ("`steering`", "`profile`"),
        ),
        (
            {"steering": inline({1: 1.0}), "steering_intensity": 0.5},
            "invalid_parameter",
            "steering",
            ("`steering`", "`steering_intensity`"),
        ),
        (
            {"steering": inline({1: 1.0}), "steering_intensity": "off"},
            "invalid_parameter",
            "steering",
            ("`steering_intensity`",),
        ),
        ({"steering": inline({1: 1.0}, "no-such-sae")}, "SAE_NOT_ATTACHED", "steering.sae_id", ()),
        ({"steering": inline({1: 1.0}, OTHER_SAE_ID)}, "SAE_NOT_ATTACHED", "steering.sae_id", ()),
        (
            {"steering": inline({D_SAE: 1.0})},
            "INVALID_FEATURE_INDEX",
            "steering.features[0].index",
            (str(D_SAE),),
        ),
        (
            {"steering": inline({-1: 1.0})},
            "INVALID_FEATURE_INDEX",
            "steering.features[0].index",
            ("-1",),
        ),
        (
            {"steering": inline({5: 1.0, D_SAE + 7: 1.0})},
            "INVALID_FEATURE_INDEX",
            "steering.features[1].index",
            (str(D_SAE + 7),),
        ),
        (
            {
                "steering": {
                    "features": [{"index": 77, "strength": 1}, {"index": 77, "strength": 2}]
                }
            },
            "invalid_parameter",
            "steering.features[1].index",
            ("77",),
        ),
        (
            {"steering": {"features": [{"index": 1, "strength": True}]}},
            "invalid_parameter",
            "steering.features[0].strength",
            (),
        ),
        (
            {"steering": {"features": [{"index": 1, "strength": "1"}]}},
            "invalid_parameter",
            "steering.features[0].strength",
            (),
        ),
    ],
    ids=[
        "OAI-INL-16",
        "OAI-INL-19",
        "OAI-INL-20",
        "OAI-INL-20-off",
        "OAI-INL-21-unknown",
        "OAI-INL-21-not-attached",
        "OAI-INL-08-d_sae",
        "OAI-INL-08-negative",
        "OAI-INL-08-second",
        "OAI-INL-09",
        "OAI-INL-11",
        "OAI-INL-11-string",
    ],
)
def test_inline_refusals(
    server: TestClient, extra: dict[str, Any], code: str, param: str, named: tuple[str, ...]
) -> None:
    """OAI-INL-08/09/11/16/19/20/21, OAI-CHAT-30/31: 400 before generation, state unchanged."""
    attach(server)
    put_profile(server, "p")
    before = state(server)
    error = error_of(chat(server, **extra), 400, code, param)
    for text_ in named:
        assert text_ in error["message"], error["message"]
    assert state(server) == before


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_inline_strengths_are_refused(server: TestClient, literal: str) -> None:
    """OAI-INL-10: NaN and ±infinity (as Python's JSON reads them) are 400, naming the field."""
    attach(server)
    body = (
        f'{{"model": "{MODEL_ID}", "messages": [{{"role": "user", "content": "Hi"}}], '
        f'"max_tokens": 8, "steering": {{"features": [{{"index": 1, "strength": {literal}}}]}}}}'
    )
    response = server.post(CHAT, content=body, headers={"content-type": "application/json"})
    error_of(response, 400, "invalid_parameter", "steering.features[0].strength")


def test_inline_without_an_attached_sae(server: TestClient, plain_text: str) -> None:
    """OAI-INL-22: a non-empty set needs an attached SAE; `features: []` still runs."""
    error_of(chat(server, steering=inline({1: 1.0})), 400, "SAE_NOT_ATTACHED", "steering")
    response = chat(server, steering={"features": []})
    assert steering_of(response) == "none" and text(response) == plain_text


@pytest.mark.parametrize(
    "attachments",
    [[(SAE_ID, LAYER), (OTHER_SAE_ID, LAYER)], [(SAE_ID, 6), (SAE_ID, LAYER)]],
    ids=["two-saes", "one-sae-two-layers"],
)
def test_inline_without_sae_id_is_ambiguous(
    server: TestClient, attachments: list[tuple[str, int]]
) -> None:
    """OAI-INL-07: the refusal names each attached (sae_id, layer) pair."""
    for sae_id, layer in attachments:
        attach(server, sae_id, layer)
    error = error_of(
        chat(server, steering=inline({1: 1.0})), 400, "invalid_parameter", "steering.sae_id"
    )
    for sae_id, layer in attachments:
        assert f"({sae_id}, layer {layer})" in error["message"], error["message"]


def test_multi_prompt_completions_carry_one_steering_state(server: TestClient) -> None:
    """OAI-INL-27, OAI-INL-28, OAI-HDR-08, OAI-CHAT-27: one request, one header."""
    attach(server)
    put_profile(server, "p")
    prompts = ["Once upon a time", "The capital of France is"]
    base = {"model": MODEL_ID, "prompt": prompts, "max_tokens": 4, "temperature": 0}
    pairs = {11: 9.0}
    response = server.post(COMPLETIONS, json={**base, "steering": inline(pairs)})
    assert steering_of(response) == inline_value(pairs)
    assert len(response.json()["choices"]) == 2
    dialled = server.post(COMPLETIONS, json={**base, "profile": "p", "steering_intensity": 0.5})
    assert steering_of(dialled) == profile_value("p", "request", 0.5)
    assert dialled.headers.get_list(SINT) == ["0.5"]
    refused = server.post(COMPLETIONS, json={**base, "steering": inline({1: 1.0}), "profile": "p"})
    error_of(refused, 400, "invalid_parameter", "steering")


# -- profiles per request -------------------------------------------------------------


def test_request_profile_replaces_the_global_state_for_one_request(server: TestClient) -> None:
    """OAI-PROF-01..03, OAI-PROF-08, OAI-GRAM-18/19/20, OAI-SINT-02, OAI-CHAT-25."""
    attach(server)
    attach(server, OTHER_SAE_ID)
    set_values(server, {1: 4.0})
    set_values(server, {2: 5.0}, OTHER_SAE_ID)
    assert put_profile(server, UNICODE_NAME).status_code == 201
    before = state(server)
    plain = steering_of(chat(server))
    response = chat(server, profile=UNICODE_NAME)
    assert steering_of(response) == profile_value(UNICODE_WIRE, "request", 1.0)
    assert SINT not in response.headers
    assert state(server) == before
    assert steering_of(chat(server)) == plain


def test_unknown_request_profile_is_404(server: TestClient) -> None:
    """OAI-PROF-04, OAI-ERR-18: 404 profile_not_found, whether or not an SAE is attached."""
    error_of(chat(server, profile="nobody"), 404, "profile_not_found", "profile")
    attach(server)
    error_of(chat(server, profile="nobody"), 404, "profile_not_found", "profile")


@pytest.mark.parametrize(
    ("sae_id", "layer", "pairs"),
    [(OTHER_SAE_ID, LAYER, STORED), (SAE_ID, 6, STORED), (SAE_ID, LAYER, {D_SAE: 1.0})],
    ids=["other-sae", "other-layer", "index-past-d_sae"],
)
def test_a_profile_invalid_for_the_attached_sae_is_400(
    server: TestClient, sae_id: str, layer: int, pairs: dict[int, float]
) -> None:
    """OAI-PROF-05: its SAE and layer are not attached, or it names a feature outside the SAE."""
    attach(server)
    put_profile(server, "elsewhere", pairs, sae_id=sae_id, layer=layer)
    error_of(chat(server, profile="elsewhere"), 400, "invalid_parameter", "profile")


def test_a_request_profile_with_no_sae_attached_runs_unsteered(
    server: TestClient, plain_text: str
) -> None:
    """OAI-PROF-06, OAI-SINT-03: no error, `none`, and no intensity echo."""
    put_profile(server, "p")
    response = chat(server, profile="p", steering_intensity=0.5)
    assert steering_of(response) == "none" and SINT not in response.headers
    assert text(response) == plain_text


# -- the dial ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("intensity_range", "dial", "lam"),
    [
        (None, 0.5, 0.5),
        (None, 1, 1.0),
        ([0.5, 1.5], "max", 1.5),
        ([0.5, 1.5], 1.9, 1.5),
        ([0.5, 1.5], "min", 0.5),
        ([0.5, 1.5], 0.1, 0.1),
        (None, "min", 0.5),
        (None, "max", 2.0),
        (None, 1.9, 1.9),
        (None, 0.1, 0.1),
    ],
    ids=[
        "OAI-DIAL-01",
        "OAI-DIAL-01-int",
        "OAI-DIAL-05",
        "OAI-DIAL-06",
        "OAI-DIAL-04",
        "OAI-DIAL-08",
        "OAI-DIAL-09",
        "OAI-DIAL-07-max",
        "OAI-DIAL-07",
        "OAI-DIAL-08-no-range",
    ],
)
def test_request_dial_scales_the_request_profile(
    server: TestClient, intensity_range: list[float] | None, dial: float | str, lam: float
) -> None:
    """OAI-DIAL-01, OAI-DIAL-04..09, OAI-SINT-01, OAI-HASH-06: λ resolved, echoed, applied."""
    attach(server)
    put_profile(server, "p", intensity_range=intensity_range)
    response = chat(server, profile="p", steering_intensity=dial)
    assert steering_of(response) == profile_value("p", "request", lam)
    assert response.headers.get_list(SINT) == [repr(lam)]


@pytest.mark.parametrize("off", ["off", 0, 0.0])
def test_dial_off_turns_steering_off(server: TestClient, plain_text: str, off: Any) -> None:
    """OAI-DIAL-11, OAI-SINT-01, OAI-SINT-05: `none`, the unsteered answer byte for byte."""
    attach(server)
    set_values(server, {1: 150.0})
    put_profile(server, "p", {1: 150.0})
    with_profile = chat(server, profile="p", steering_intensity=off)
    assert steering_of(with_profile) == "none"
    assert with_profile.headers.get_list(SINT) == ["0.0"]
    assert text(with_profile) == plain_text
    dial_only = chat(server, steering_intensity=off)
    assert steering_of(dial_only) == "none" and SINT not in dial_only.headers  # OAI-SINT-05
    assert text(dial_only) == plain_text


def test_dial_off_does_not_validate_the_base(server: TestClient) -> None:
    """OAI-DIAL-12, OAI-SINT-04: an unknown or invalid profile at λ=0 runs, with no echo."""
    attach(server)
    put_profile(server, "elsewhere", sae_id=OTHER_SAE_ID)
    for name in ("nobody", "elsewhere"):
        response = chat(server, profile=name, steering_intensity="off")
        assert steering_of(response) == "none"
    assert SINT not in chat(server, profile="nobody", steering_intensity=0).headers
    error_of(
        chat(server, profile="elsewhere", steering_intensity=0.01),
        400,
        "invalid_parameter",
        "profile",
    )
    error_of(
        chat(server, profile="nobody", steering_intensity=0.01), 404, "profile_not_found", "profile"
    )


def test_dial_only_without_a_base_sends_no_echo(server: TestClient) -> None:
    """OAI-SINT-02, OAI-SINT-03, OAI-SINT-06: no SAE, or an empty base: no echo, `none`."""
    response = chat(server, steering_intensity=0.5)
    assert steering_of(response) == "none" and SINT not in response.headers
    attach(server)
    response = chat(server, steering_intensity="max")
    assert steering_of(response) == "none" and SINT not in response.headers
    assert SINT not in chat(server).headers


def test_dial_only_scales_the_live_values(server: TestClient) -> None:
    """OAI-DIAL-10: with no profile, the live values are the base."""
    attach(server)
    pairs = {1: 10.0, 2: -3.0}
    set_values(server, pairs)
    response = chat(server, steering_intensity=0.5)
    assert steering_of(response) == manual_value(pairs, scale=0.5)
    assert response.headers.get_list(SINT) == ["0.5"]
    assert steering_of(chat(server, steering_intensity="min")) == manual_value(pairs, scale=0.5)
    assert steering_of(chat(server)) == manual_value(pairs)


def test_the_persistent_dial(server: TestClient) -> None:
    """OAI-DIAL-02, OAI-DIAL-03, OAI-DIAL-10: the stored λ applies; a request's λ overrides it."""
    attach(server)
    attach(server, OTHER_SAE_ID)
    set_values(server, {2: 6.0}, OTHER_SAE_ID)
    put_profile(server, "p", intensity=0.5)
    change = activate(server, "p")
    other = manual_value({2: 6.0}, OTHER_SAE_ID)
    assert change["steering"] == f"{profile_value('p', 'active', 0.5)}, {other}"
    plain = chat(server)
    assert steering_of(plain) == change["steering"] and SINT not in plain.headers
    dialled = chat(server, steering_intensity=1.5)
    assert steering_of(dialled) == f"{profile_value('p', 'active', 1.5)}, {other}"
    assert dialled.headers.get_list(SINT) == ["1.5"]
    by_name = chat(server, profile="p")  # the stored λ, for the request's own profile too
    assert steering_of(by_name) == profile_value("p", "request", 0.5)
    assert server.get(profile_path("p")).json()["intensity"] == 0.5
    assert steering_of(chat(server)) == change["steering"]


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("dial", [3, 2.5, -0.1, "loud", "OFF", True])
def test_invalid_dials_are_400(server: TestClient, endpoint: str, dial: Any) -> None:
    """OAI-CHAT-26..28, OAI-ERR-19: λ outside 0–2 or an unknown symbol is invalid_parameter."""
    attach(server)
    prompt = {"messages": USER} if endpoint == CHAT else {"prompt": "Hello"}
    body = {"model": MODEL_ID, **prompt, "max_tokens": 8, "steering_intensity": dial}
    error_of(server.post(endpoint, json=body), 400, "invalid_parameter", "steering_intensity")


def test_a_nan_dial_names_the_field(server: TestClient) -> None:
    """OAI-CHAT-28, OAI-ERR-01: a NaN λ is 400 invalid_parameter naming `steering_intensity`."""
    body = (
        f'{{"model": "{MODEL_ID}", "messages": [{{"role": "user", "content": "Hi"}}], '
        '"max_tokens": 8, "steering_intensity": NaN}'
    )
    response = server.post(CHAT, content=body, headers={"content-type": "application/json"})
    error_of(response, 400, "invalid_parameter", "steering_intensity")


# -- streaming ---------------------------------------------------------------------------


def stream_events(client: TestClient, body: dict[str, Any]) -> tuple[Any, list[Any]]:
    with client.stream("POST", CHAT, json={**body, "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line]
    return response, data_of(lines)


def _manual(client: TestClient) -> dict[str, Any]:
    attach(client)
    set_values(client, {1: 4.0})
    return {}


def _inline(client: TestClient) -> dict[str, Any]:
    attach(client)
    return {"steering": inline({3: 500.0})}


def _request_profile(client: TestClient) -> dict[str, Any]:
    attach(client)
    put_profile(client, UNICODE_NAME)
    return {"profile": UNICODE_NAME, "steering_intensity": "max"}


def _active_profile(client: TestClient) -> dict[str, Any]:
    attach(client)
    put_profile(client, "p", intensity=0.5)
    activate(client, "p")
    return {}


def _unsteered(client: TestClient) -> dict[str, Any]:
    return {}


@pytest.mark.parametrize(
    "setup",
    [_unsteered, _manual, _inline, _request_profile, _active_profile],
    ids=["none", "manual", "inline", "request-profile", "active-profile"],
)
def test_streams_end_with_the_steering_chunk(
    server: TestClient, setup: Callable[[TestClient], dict[str, Any]]
) -> None:
    """OAI-HDR-12..16, OAI-STREAM-08, OAI-STREAM-10: no header; one chunk, as the header says."""
    extra = setup(server)
    body = {"model": MODEL_ID, "messages": USER, "max_tokens": 8, "temperature": 0, **extra}
    expected = steering_of(server.post(CHAT, json=body))
    response, events = stream_events(server, body)
    assert response.status_code == 200
    assert STEERING not in response.headers
    assert events[-1] == "[DONE]"
    chunk = events[-2]
    assert chunk == {
        "id": events[0]["id"],
        "object": "chat.completion.chunk",
        "created": events[0]["created"],
        "model": MODEL_ID,
        "system_fingerprint": events[0]["system_fingerprint"],
        "choices": [],
        "millm_steering": expected,
    }
    assert [e for e in events[:-1] if "millm_steering" in e] == [chunk]
    assert events[-3]["choices"][0]["finish_reason"] is not None  # after the final content


def test_completion_streams_end_with_the_steering_chunk(server: TestClient) -> None:
    """OAI-HDR-13..16, OAI-INL-27: the same chunk on /v1/completions."""
    attach(server)
    body = {
        "model": MODEL_ID,
        "prompt": "Once upon a time",
        "max_tokens": 4,
        "temperature": 0,
        "steering": inline({3: 7.0}),
    }
    assert steering_of(server.post(COMPLETIONS, json=body)) == inline_value({3: 7.0})
    with server.stream("POST", COMPLETIONS, json={**body, "stream": True}) as response:
        events = data_of([line for line in response.iter_lines() if line])
    assert response.status_code == 200 and STEERING not in response.headers
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"] == [] and events[-2]["created"] == events[0]["created"] > 0
    assert events[-2]["millm_steering"] == inline_value({3: 7.0})


@pytest.mark.parametrize(
    ("extra", "status", "code", "param"),
    [
        (
            {"steering": inline({D_SAE: 1.0})},
            400,
            "INVALID_FEATURE_INDEX",
            "steering.features[0].index",
        ),
        ({"profile": "nobody"}, 404, "profile_not_found", "profile"),
        ({"steering_intensity": "loud"}, 400, "invalid_parameter", "steering_intensity"),
    ],
    ids=["OAI-INL-08", "OAI-PROF-04", "OAI-CHAT-28"],
)
def test_steering_refusals_come_before_a_stream_starts(
    server: TestClient, extra: dict[str, Any], status: int, code: str, param: str
) -> None:
    """OAI-INL-08, OAI-PROF-04, OAI-CHAT-28 on `stream: true`: a plain error, no SSE body."""
    attach(server)
    body = {"model": MODEL_ID, "messages": USER, "max_tokens": 8, "stream": True, **extra}
    error_of(server.post(CHAT, json=body), status, code, param)


def steered_counts(client: TestClient) -> dict[str, float]:
    """`miserver_steered_requests_total` by source, from /metrics (issue 47)."""
    found = samples(client.get("/metrics").text, "miserver_steered_requests_total")
    return {s.labels["source"]: s.value for s in found}


def test_steered_requests_are_counted_by_source(server: TestClient) -> None:
    """Issue 47 item 1: a generation that ran steered counts once under where its steering
    came from (inline, the request's profile, the operator's live values); one that ran
    unsteered counts nowhere."""
    before = steered_counts(server)
    assert steering_of(chat(server)) == "none"
    attach(server)
    assert put_profile(server, "counted").status_code in (200, 201)
    assert steering_of(chat(server, steering=inline({10: 8.0}))) != "none"
    assert steering_of(chat(server, profile="counted")) != "none"
    set_values(server, {1: 4.0})
    assert steering_of(chat(server)) == manual_value({1: 4.0})
    after = steered_counts(server)
    moved = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    assert {k: v for k, v in moved.items() if v} == {"inline": 1, "profile": 1, "operator": 1}
