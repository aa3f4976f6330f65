"""Circuits over real HTTP with the official `openai` SDK: `miserver serve --parallel 4`.

The trained SAE is attached twice (as OTHER_SAE_ID at layer 6 and SAE_ID at
layer 12) and a two-layer circuit over both is active. The SDK dials it the
way its users do (`extra_body`); rows dialled different ways decode in one
batch, each under its own λ.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from miserver.steering.header import CircuitMember, NoneMember, ProfileMember, parse
from tests.conftest import JSON, MODEL_ID, OTHER_SAE_ID, SAE_ID
from tests.e2e.conftest import LiveServer, async_sdk, live_server
from tests.e2e.documents import CIRCUIT, CLUSTER
from tests.events import RowWatch
from tests.openai_reference import Check

pytestmark = pytest.mark.e2e

HELLO: list[Any] = [{"role": "user", "content": "Tell me about your favourite place."}]
RUNG = "X-miLLM-Circuit-Rung"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, saes_dir: Path) -> Iterator[LiveServer]:
    env = {"MISERVER_SAES_DIR": str(saes_dir)}
    workdir = tmp_path_factory.mktemp("e2e-circuits")
    with live_server(workdir, env, args=["--parallel", "4"]) as running:
        root = running.base_url.removesuffix("/v1")
        with httpx.Client(base_url=f"{root}/api", timeout=60.0) as api:
            for sae_id, layer in ((OTHER_SAE_ID, 6), (SAE_ID, 12)):
                attached = api.post(
                    "/steering/attachments", json={"sae_id": sae_id, "layer": layer}
                )
                assert attached.status_code in (200, 201), attached.text
            assert api.post("/circuits", json=CIRCUIT).status_code == 201
            assert api.post("/clusters", json=CLUSTER).status_code == 201
            assert api.put("/circuits/crc_live/active", headers=JSON).status_code == 200
        yield running


async def dialled(client: AsyncOpenAI, **extra: Any) -> tuple[str, httpx.Headers]:
    """A greedy chat with `extra` in `extra_body`: its text and its response headers."""
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL_ID, messages=HELLO, max_tokens=20, temperature=0, extra_body=extra
    )
    return raw.parse().choices[0].message.content or "", raw.headers


async def test_the_sdk_dials_a_circuit_by_the_circuit_rule(
    server: LiveServer, openai_check: Check
) -> None:
    """OAI-CIRCUIT-03, OAI-CIRCUIT-04, OAI-CIRCUIT-05, OAI-DIAL-08, OAI-SINT-01, OAI-RUNG-08,
    OAI-RUNG-13, OAI-PROF-01: through the SDK's extra_body, 0.1 against the circuit's
    [0.5, 1.5] runs at 0.5 and 1.9 at 1.5 (both echoed), each response carrying rung 3; the
    same 0.1 on a cluster with the same range runs at 0.1; "off" is unsteered, no rung."""
    async with async_sdk(server.base_url, openai_check) as client:
        for sent, runs in ((0.1, 0.5), (1.9, 1.5), ("max", 1.5)):
            _, headers = await dialled(client, steering_intensity=sent)
            [member] = parse(headers["X-miLLM-Steering"])
            assert member == CircuitMember("crc_live", runs), sent
            assert headers["X-miLLM-Steering-Intensity"] == repr(runs)
            assert headers[RUNG] == '3;language="faithfulness-tested (circuit)"'
        _, headers = await dialled(client, profile="live-cluster", steering_intensity=0.1)
        [member] = parse(headers["X-miLLM-Steering"])
        assert isinstance(member, ProfileMember) and member.intensity == 0.1
        assert RUNG not in headers
        _, headers = await dialled(client, steering_intensity="off")
        assert parse(headers["X-miLLM-Steering"]) == [NoneMember()] and RUNG not in headers


async def test_rows_dialled_differently_decode_together_each_at_its_own_lambda(
    server: LiveServer, openai_check: Check
) -> None:
    """Issue 19 item 3 (the whole circuit applied per row), OAI-CBM-15, OAI-HDR-09,
    OAI-CIRCUIT-01: three requests at λ 1 (the dial), 0.5 and "off" decode as rows of one
    batch; each gets the text it gets alone, and its header names its own row's circuit λ."""
    asks: list[dict[str, Any]] = [{}, {"steering_intensity": 0.5}, {"steering_intensity": "off"}]
    async with async_sdk(server.base_url, openai_check) as client:
        alone = [await dialled(client, **ask) for ask in asks]
        with RowWatch(server) as watch:
            together = await asyncio.gather(*(dialled(client, **ask) for ask in asks))
    assert watch.backend == "continuous_batching" and watch.most == len(asks)
    assert [text for text, _ in together] == [text for text, _ in alone]
    assert alone[0][0] != alone[2][0]  # the circuit changes the text
    members = [parse(headers["X-miLLM-Steering"]) for _, headers in together]
    assert members == [
        [CircuitMember("crc_live", 1.0)],
        [CircuitMember("crc_live", 0.5)],
        [NoneMember()],
    ]
    assert [RUNG in headers for _, headers in together] == [True, True, False]
