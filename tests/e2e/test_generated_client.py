"""A client generated from spec/ with openapi-python-client, used against the real server (#9).

Sibling projects generate their clients from our contract; this test does the
same, from the files in spec/, into a temporary folder (never committed), and
drives `miserver serve` (the embedded GGUF) with it: chat, text completion, the
model list and one model, and the local API's config. The generator must read
both documents without dropping a schema or a response.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import GGUF_ID
from tests.e2e.conftest import LiveServer, live_server

ROOT = Path(__file__).resolve().parents[2]
DROPPED = ("Unable to parse", "Failure to process", "will be omitted", "Cannot parse")


def generate(document: str, package: str, into: Path) -> str:
    """Generate `package` from spec/openapi/<document>.yaml; the generator's output."""
    config = into / f"{package}.yaml"
    config.write_text(f"package_name_override: {package}\nproject_name_override: {package}\n")
    binary = Path(sys.executable).parent
    done = subprocess.run(
        [
            str(binary / "openapi-python-client"),
            "generate",
            "--path",
            str(ROOT / "spec" / "openapi" / f"{document}.yaml"),
            "--config",
            str(config),
            "--meta",
            "none",
            "--output-path",
            str(into / package),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{binary}{os.pathsep}{os.environ.get('PATH', '')}"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ModuleType]]:
    folder = tmp_path_factory.mktemp("generated-clients")
    outputs = {name: generate(name, f"miserver_{name}_client", folder) for name in ("v1", "api")}
    for name, output in outputs.items():
        dropped = [line for line in output.splitlines() if line.startswith(DROPPED)]
        assert not dropped, f"{name}: the generator dropped parts of the contract: {output}"
    sys.path.insert(0, str(folder))
    try:
        yield {name: importlib.import_module(f"miserver_{name}_client") for name in outputs}
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("generated-client-server"), model=None) as running:
        yield running


def api(package: ModuleType, module: str) -> Any:
    return importlib.import_module(f"{package.__name__}.{module}")


def test_the_generated_v1_client_chats_completes_and_lists(
    clients: dict[str, ModuleType], server: LiveServer
) -> None:
    """OAI-EP-01..03, OAI-MODELS-01, OAI-MODELS-07: chat and text completions, the model list
    and one model, each parsed into the generated models."""
    v1 = clients["v1"]
    models = api(v1, "models")
    with v1.Client(base_url=server.base_url, timeout=120.0) as client:
        listed = api(v1, "api.models.list_models").sync(client=client)
        assert isinstance(listed, models.ModelList)
        assert GGUF_ID in [model.id for model in listed.data]
        one = api(v1, "api.models.retrieve_model").sync(client=client, model_id=GGUF_ID)
        assert isinstance(one, models.Model) and one.id == GGUF_ID

        request = models.ChatCompletionRequest.from_dict(
            {
                "model": GGUF_ID,
                "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": 8,
                "temperature": 0,
            }
        )
        chat = api(v1, "api.chat.create_chat_completion").sync(client=client, body=request)
        assert isinstance(chat, models.ChatCompletion), chat
        assert chat.choices[0].message.content
        assert chat.usage.completion_tokens <= 8

        prompt = models.CompletionRequest.from_dict(
            {"model": GGUF_ID, "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}
        )
        text = api(v1, "api.completions.create_completion").sync(client=client, body=prompt)
        assert isinstance(text, models.Completion), text
        assert text.choices[0].text and text.usage.completion_tokens <= 5

        refused = api(v1, "api.chat.create_chat_completion").sync(
            client=client,
            body=models.ChatCompletionRequest.from_dict(
                {"model": GGUF_ID, "messages": [{"role": "user", "content": "x"}], "profile": "p"}
            ),
        )
        assert isinstance(refused, models.ErrorResponse)  # profile on GGUF: field_not_honoured
        assert refused.error.param == "profile"


def test_the_generated_api_client_manages_the_config(
    clients: dict[str, ModuleType], server: LiveServer
) -> None:
    """LOC-CONFIG-01, -10, -11, -14: a management call through the generated /api client."""
    local = clients["api"]
    models = api(local, "models")
    origin = server.base_url.removesuffix("/v1")
    with local.Client(
        base_url=f"{origin}/api", timeout=60.0, headers={"Content-Type": "application/json"}
    ) as client:
        before = api(local, "api.config.get_config").sync(client=client)
        assert isinstance(before, models.Config) and before.valid
        change = api(local, "api.config.put_config").sync(
            client=client, body=models.ConfigUpdate.from_dict({"values": {"n-predict": 64}})
        )
        assert isinstance(change, models.ConfigChange), change
        assert change.values["n-predict"] == 64 and "n-predict" in change.user_keys
        info = api(local, "api.session.info").sync(client=client)
        assert isinstance(info, models.Info) and info.state in ("empty", "ready", "loading")
