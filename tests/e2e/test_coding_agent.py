"""A coding agent drives the server with tools (issue 45 item 7, LOC-CHAT-76): opencode,
installed from the npm registry here, pointed at `miserver serve` (the embedded GGUF, greedy)
as an OpenAI-compatible provider, reads a file with its `read` tool and answers.

opencode talks to the server through a recording proxy (tests/wire_tap.py) that checks every
body and stream event against OpenAI's schemas and keeps the exchanges, so the test sees the
loop on the wire: the tool offered, the call streamed back, opencode running it and sending
its result as a `tool` message, and a final answer, streamed.

The agent is opencode's own configuration, sized for a 135M model with an 8k window: a
primary agent with a one-line prompt and the `read` tool only (opencode's stock prompt and
ten tools are about 30 KB), and `steps: 2`, opencode's step limit. At the limit opencode
appends an assistant message "respond with text only" and the server continues it as text
(a partial answer begun as text, OAI-CONT-01: the generic call format's documents begin a
reply). The model is too small to stop calling `read` by itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GGUF_ID
from tests.e2e.conftest import live_server
from tests.openai_reference import Check
from tests.wire_tap import Exchange, Tap
from tools.uvicorn_thread import uvicorn_serving

pytestmark = pytest.mark.e2e

OPENCODE = "opencode-ai@1.18.33"
INSTALL_TIMEOUT_S = 300
RUN_TIMEOUT_S = 300
NOTE = "The launch code is 7741."
TASK = "Read the file note.txt and tell me what it says."
CHAT = "/v1/chat/completions"


def agent_config(base_url: str) -> dict[str, Any]:
    """opencode.json: miserver as an OpenAI-compatible provider and a one-tool agent."""
    off = ["bash", "edit", "glob", "grep", "skill", "task", "todowrite", "webfetch", "write"]
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "provider": {
            "miserver": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "miserver",
                "options": {"baseURL": base_url, "apiKey": "not-needed"},
                "models": {
                    GGUF_ID: {
                        "name": "SmolLM2",
                        "limit": {"context": 8192, "output": 64},
                        "tool_call": True,
                    }
                },
            }
        },
        "model": f"miserver/{GGUF_ID}",
        "agent": {
            "reader": {
                "description": "Reads one file",
                "mode": "primary",
                "prompt": "You read files. To read a file, call the read tool with its path.",
                "tools": {"read": True, **dict.fromkeys(off, False)},
                "steps": 2,
            }
        },
    }


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Tap, str]]:
    """opencode from the npm registry (installed while the server starts), `miserver serve
    --temp 0` as a user starts it, and the recording proxy before it."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not installed: the coding-agent test installs opencode with it")
    prefix = tmp_path_factory.mktemp("opencode")
    log = prefix / "npm.log"
    with log.open("wb") as out:  # a file, not a pipe: nothing blocks on a full one
        install = subprocess.Popen(
            [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", OPENCODE],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        workdir = tmp_path_factory.mktemp("agent-server")
        with live_server(workdir, model=None, args=["--temp", "0"]) as server:
            recording = Tap(upstream=server.base_url.removesuffix("/v1"), check=Check())
            with uvicorn_serving(recording) as port:
                code = install.wait(timeout=INSTALL_TIMEOUT_S)
                assert code == 0, f"npm install failed:\n{log.read_text()[-2000:]}"
                opencode = prefix / "node_modules" / ".bin" / "opencode"
                yield opencode, recording, f"http://127.0.0.1:{port}/v1"
    finally:
        if install.poll() is None:
            install.kill()
            install.wait()


def run_agent(opencode: Path, base_url: str, workdir: Path) -> list[dict[str, Any]]:
    """`opencode run` on the task in a project holding note.txt; its JSON events."""
    project, home = workdir / "project", workdir / "home"
    project.mkdir()
    home.mkdir()
    (project / "note.txt").write_text(NOTE + "\n")
    (project / "opencode.json").write_text(json.dumps(agent_config(base_url), indent=1))
    env = {
        **os.environ,
        "HOME": str(home),
        "npm_config_cache": str(Path.home() / ".npm"),  # its provider package, from cache
        "PWD": str(project),  # opencode takes its project from PWD before its cwd
        **{f"XDG_{d}_HOME": str(home / d.lower()) for d in ("CONFIG", "DATA", "CACHE", "STATE")},
        **dict.fromkeys(
            [
                "OPENCODE_DISABLE_AUTOUPDATE",
                "OPENCODE_DISABLE_MODELS_FETCH",
                "OPENCODE_DISABLE_SHARE",
                "OPENCODE_DISABLE_LSP_DOWNLOAD",
                "OPENCODE_DISABLE_CLAUDE_CODE",
                "OPENCODE_DISABLE_DEFAULT_PLUGINS",
            ],
            "1",
        ),
    }
    done = subprocess.run(
        [str(opencode), "run", "--agent", "reader", "--format", "json", "--title", "note", TASK],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        logs = "".join(p.read_text() for p in sorted(home.rglob("opencode.log")))
        pytest.fail(f"opencode exited {done.returncode}:\n{done.stdout[-2000:]}\n{logs[-4000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def deltas(exchange: Exchange) -> tuple[str, list[dict[str, Any]], str | None]:
    """A streamed chat reply: its content, its calls (name and arguments joined), and its
    finish reason."""
    content, calls, finish = "", {}, None
    for event in exchange.events():
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                made = calls.setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
                made["id"] = call.get("id") or made["id"]
                made["name"] += call.get("function", {}).get("name") or ""
                made["arguments"] += call.get("function", {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return content, [calls[i] for i in sorted(calls)], finish


def test_opencode_reads_a_file_and_answers(agent: tuple[Path, Tap, str], tmp_path: Path) -> None:
    """LOC-CHAT-76, OAI-TOOLS-01, OAI-TOOLS-05, OAI-CONT-01, OAI-CONT-04: opencode offers its
    tool, the model's call streams back, opencode runs it and sends the file's text as a
    `tool` message, and the final answer streams as text; every body is OpenAI's shape."""
    opencode, recording, base_url = agent
    events = run_agent(opencode, base_url, tmp_path)

    turns = [e for e in recording.exchanges if e.path == CHAT and (e.request or {}).get("tools")]
    assert len(turns) == 2, [e.request for e in recording.exchanges]
    call_turn, answer_turn = turns
    for turn in turns:
        assert turn.status == 200 and turn.request["stream"] is True and turn.streamed
        assert [t["function"]["name"] for t in turn.request["tools"]] == ["read"]

    # the call, streamed back in OpenAI's shape
    assert call_turn.headers["x-millm-tool-format"] == "generic"
    _, (call,), finish = deltas(call_turn)
    assert finish == "tool_calls" and call["name"] == "read" and call["id"]
    assert Path(json.loads(call["arguments"])["filePath"]).name == "note.txt"

    # opencode ran it and sent its result back as a `tool` message
    tool_messages = [m for m in answer_turn.request["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [call["id"]]
    assert NOTE in tool_messages[0]["content"]

    # the final answer: streamed text, no call
    text, calls, finish = deltas(answer_turn)
    assert text.strip() and calls == [] and finish in ("stop", "length")
    assert "x-millm-tool-format" not in answer_turn.headers  # continued as a plain chat

    # and opencode saw the same loop
    (used,) = [e["part"] for e in events if e["type"] == "tool_use"]
    assert used["tool"] == "read" and used["state"]["status"] == "completed"
    assert NOTE in used["state"]["output"]
    said = "".join(e["part"]["text"] for e in events if e["type"] == "text")
    assert said.strip() and said.strip() in text.strip()
    assert recording.check.problems == []
