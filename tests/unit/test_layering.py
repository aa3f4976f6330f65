"""tools/layering.py catches what each rule forbids, on small fake trees (issue 16 item 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.layering import (
    KNOWN,
    RULES,
    Import,
    Module,
    check,
    cycles,
    imports,
    violations,
)

PYPROJECT = """\
[project]
name = "fake"
dependencies = ["pyyaml>=6", "connexion[uvicorn]>=3.3", "starlette", "llama-cpp-python"]

[project.optional-dependencies]
conformance = ["httpx>=0.27"]
"""

Key = tuple[str, str, str]


def tree(root: Path, files: dict[str, str]) -> Path:
    """Write `files` (path -> source) under `root`, with every package's `__init__.py`."""
    (root / "pyproject.toml").write_text(PYPROJECT, encoding="utf-8")
    for name, source in files.items():
        path = root / name
        for folder in reversed(path.relative_to(root).parents):
            if folder != Path("."):
                (root / folder).mkdir(exist_ok=True)
                (root / folder / "__init__.py").touch()
        path.write_text(source, encoding="utf-8")
    return root


def keys(root: Path) -> set[Key]:
    return {v.key for v in violations(root)}


def test_from_import_names_both_the_package_and_the_name(tmp_path: Path) -> None:
    """Issue 16 item 4: `from X import a` gives X and X.a, relative levels resolved."""
    tree(tmp_path, {"impl/serving/sub/m.py": "from ...engines import base\nfrom . import a\n"})
    mod = Module("miserver.serving.sub.m", tmp_path / "impl/serving/sub/m.py", False)
    assert list(imports(mod)) == [
        Import(1, "miserver.engines", "miserver.engines.base"),
        Import(2, "miserver.serving.sub", "miserver.serving.sub.a"),
    ]


def test_from_dot_in_a_package_init_is_the_package_itself(tmp_path: Path) -> None:
    """Issue 16 item 4: `from . import a` in an `__init__.py` means the package, not its parent."""
    tree(tmp_path, {"impl/serving/__init__.py": "from . import a\nfrom .. import errors\n"})
    mod = Module("miserver.serving", tmp_path / "impl/serving/__init__.py", True)
    assert list(imports(mod)) == [
        Import(1, "miserver.serving", "miserver.serving.a"),
        Import(2, "miserver", "miserver.errors"),
    ]


def test_relative_import_beyond_the_top_is_refused(tmp_path: Path) -> None:
    """Issue 16 item 4: a relative import past `miserver` is an error, not a silent guess."""
    tree(tmp_path, {"impl/m.py": "from .. import x\n"})
    with pytest.raises(ValueError, match="beyond the top-level package"):
        list(imports(Module("miserver.m", tmp_path / "impl/m.py", False)))


def test_engines_import_only_engines(tmp_path: Path) -> None:
    """Issue 16 item 4: `from ... import serving` in an engine is caught (it used to resolve to
    `miserver` and pass); importing another engine module stays allowed."""
    tree(
        tmp_path,
        {
            "impl/serving/service.py": "",
            "impl/settings.py": "",
            "impl/engines/base.py": "",
            "impl/engines/x.py": "from .. import settings\nfrom miserver import engines\n",
            "impl/engines/llamacpp/y.py": "from ... import serving\nfrom .. import base\n",
        },
    )
    found = keys(tmp_path)
    assert ("engines", "miserver.engines.llamacpp.y", "miserver.serving") in found
    assert ("engines", "miserver.engines.x", "miserver.settings") in found
    assert {k for k in found if k[0] == "engines"} == {
        ("engines", "miserver.engines.llamacpp.y", "miserver.serving"),
        ("engines", "miserver.engines.x", "miserver.settings"),
    }


def test_only_the_front_imports_the_web_framework(tmp_path: Path) -> None:
    """Issue 16 item 4: starlette in serving is caught; in http, handlers, app and cli it is not."""
    tree(
        tmp_path,
        {
            "impl/serving/y.py": "from starlette.responses import Response\n",
            "impl/steering/z.py": "def f():\n    import uvicorn\n",
            "impl/http/sse.py": "import starlette\n",
            "impl/handlers/chat.py": "from connexion import request\n",
            "impl/app.py": "import connexion\n",
            "impl/cli.py": "import uvicorn\n",
        },
    )
    assert {k for k in keys(tmp_path) if k[0] == "web"} == {
        ("web", "miserver.serving.y", "starlette.responses"),
        ("web", "miserver.steering.z", "uvicorn"),
    }


def test_the_core_never_imports_the_front(tmp_path: Path) -> None:
    """Issue 16 item 4: serving, local, steering, models, store and engines never import http,
    handlers or app; the shared leaves at the top (errors) are fine."""
    tree(
        tmp_path,
        {
            "impl/errors.py": "",
            "impl/app.py": "",
            "impl/http/errors.py": "",
            "impl/handlers/chat.py": "",
            "impl/serving/s.py": "from ..http.errors import ApiError\nfrom ..errors import X\n",
            "impl/steering/t.py": "from miserver import handlers\n",
            "impl/store/u.py": "from ..app import ServerState\n",
            "impl/handlers/v.py": "from ..http.errors import ApiError\n",
            "impl/local/w.py": "from ..handlers import chat\n",
        },
    )
    assert {k for k in keys(tmp_path) if k[0] == "core"} == {
        ("core", "miserver.local.w", "miserver.handlers.chat"),
        ("core", "miserver.serving.s", "miserver.http.errors"),
        ("core", "miserver.steering.t", "miserver.handlers"),
        ("core", "miserver.store.u", "miserver.app"),
    }


def test_the_serving_folders_import_downwards_only(tmp_path: Path) -> None:
    """Issue 16 item 8: serving's top imports none of chat, completions or local; chat imports
    neither completions nor local; completions never imports local. The allowed directions
    (local -> completions -> chat -> serving's top) are not reported."""
    tree(
        tmp_path,
        {
            "impl/serving/stops.py": "",
            "impl/serving/admission.py": "from .chat import tools\nfrom ..local import params\n",
            "impl/serving/scheduler.py": "from .completions.requests import GenerationRequest\n",
            "impl/serving/chat/tools.py": "from ..stops import held_tail\n",
            "impl/serving/chat/reasoning.py": "from ..completions import requests\n",
            "impl/serving/chat/thinking.py": "from miserver.local.config import X\n",
            "impl/serving/completions/requests.py": "from ..chat import tools\n"
            "from .. import stops\n",
            "impl/serving/completions/service.py": "from ...local.session import Session\n",
            "impl/local/config.py": "from ..serving.completions import requests\n",
            "impl/local/session.py": "from ..serving.chat import thinking\n"
            "from ..serving import stops\n",
        },
    )
    rules = {"serving", "chat", "completions"}
    assert {k for k in keys(tmp_path) if k[0] in rules} == {
        ("serving", "miserver.serving.admission", "miserver.serving.chat.tools"),
        ("serving", "miserver.serving.admission", "miserver.local"),
        ("serving", "miserver.serving.scheduler", "miserver.serving.completions.requests"),
        ("chat", "miserver.serving.chat.reasoning", "miserver.serving.completions.requests"),
        ("chat", "miserver.serving.chat.thinking", "miserver.local.config"),
        ("completions", "miserver.serving.completions.service", "miserver.local.session"),
    }


def test_generated_and_conformance_import_only_themselves(tmp_path: Path) -> None:
    """Issue 16 item 4: generated/ imports nothing of ours; conformance/ speaks only HTTP."""
    tree(
        tmp_path,
        {
            "impl/errors.py": "",
            "generated/v1.py": "from miserver import errors\nfrom . import api\n",
            "generated/api.py": "",
            "conformance/cli.py": "import miserver.errors\nfrom .checks import a\n",
            "conformance/checks/a.py": "",
        },
    )
    found = keys(tmp_path)
    assert ("generated", "miserver.generated.v1", "miserver.errors") in found
    assert ("conformance", "miserver.conformance.cli", "miserver.errors") in found
    assert {k for k in found if k[0] in ("generated", "conformance")} == {
        ("generated", "miserver.generated.v1", "miserver.errors"),
        ("conformance", "miserver.conformance.cli", "miserver.errors"),
    }


def test_a_cycle_between_packages_names_the_modules_that_make_it(tmp_path: Path) -> None:
    """Issue 16 item 4: http -> serving -> http is one cycle, and each edge names its imports."""
    tree(
        tmp_path,
        {
            "impl/http/sse.py": "from ..serving.results import Comment\n",
            "impl/serving/results.py": "",
            "impl/serving/telemetry.py": "\nfrom ..http import sse\n",
        },
    )
    [cycle] = [v for v in violations(tmp_path) if v.rule == "cycles"]
    assert cycle.key == ("cycles", "miserver.http -> miserver.serving -> miserver.http", "")
    assert cycle.detail == (
        "miserver.http -> miserver.serving: miserver.http.sse:1 imports miserver.serving.results",
        "miserver.serving -> miserver.http: miserver.serving.telemetry:2 imports miserver.http.sse",
    )


def test_subpackages_are_nodes_and_top_modules_are_nodes(tmp_path: Path) -> None:
    """Issue 16 item 4: serving.chat <-> serving is a cycle (a subpackage is its own node);
    app -> serving -> errors is not (each module at the top of miserver is its own node)."""
    tree(
        tmp_path,
        {
            "impl/app.py": "from .serving import service\n",
            "impl/errors.py": "",
            "impl/serving/service.py": "from ..errors import ApiError\nfrom .chat import tools\n",
            "impl/serving/chat/tools.py": "from .. import stops\n",
            "impl/serving/stops.py": "",
        },
    )
    assert {k for k in keys(tmp_path) if k[0] == "cycles"} == {
        ("cycles", "miserver.serving -> miserver.serving.chat -> miserver.serving", ""),
    }


def test_every_cycle_is_reported_once() -> None:
    """Issue 16 item 4: two cycles through one node are both found, each from its smallest node."""
    edges = [("a", "b"), ("b", "a"), ("b", "c"), ("c", "d"), ("d", "b"), ("d", "e")]
    assert cycles(edges) == [("a", "b"), ("b", "c", "d")]


def test_third_party_imports_are_declared(tmp_path: Path) -> None:
    """Issue 16 item 4: an undeclared package is caught; stdlib, ours, and packages declared
    under another distribution name (yaml -> pyyaml, llama_cpp -> llama-cpp-python) pass;
    conformance/ may also use its extra."""
    tree(
        tmp_path,
        {
            "impl/serving/y.py": (
                "import json\nimport yaml\nfrom llama_cpp import Llama\nimport numpy.linalg\n"
            ),
            "impl/http/z.py": "from connexion import request\nimport httpx\n",
            "conformance/c.py": "import httpx\nimport hypothesis\n",
        },
    )
    assert {k for k in keys(tmp_path) if k[0] == "dependencies"} == {
        ("dependencies", "miserver.serving.y", "numpy"),
        ("dependencies", "miserver.http.z", "httpx"),
        ("dependencies", "miserver.conformance.c", "hypothesis"),
    }


def test_tools_never_import_the_tests(tmp_path: Path) -> None:
    """Issue 41 item 7: a tool importing a test helper (tools/bench/fuzz.py took tests.fakehub)
    is caught; tools importing tools and miserver, and tests importing tools, are not."""
    tree(
        tmp_path,
        {
            "impl/settings.py": "",
            "tools/fakehub.py": "",
            "tools/bench/fuzz.py": "from tests.fakehub import Hub\nfrom tools import fakehub\n",
            "tools/bench/peer.py": "def f():\n    import tests.conftest\n",
            "tools/check.py": "from miserver import settings\n",
            "tests/fakehub.py": "",
            "tests/conftest.py": "from tools.fakehub import Hub\n",
        },
    )
    assert {k for k in keys(tmp_path) if k[0] == "tools"} == {
        ("tools", "tools.bench.fuzz", "tests.fakehub"),
        ("tools", "tools.bench.peer", "tests.conftest"),
    }


def test_no_module_imports_a_test_module(tmp_path: Path) -> None:
    """Issue 41 item 7: a test module importing another one, in any tier and in any form, is
    caught, and so is a helper importing one; test modules importing helper modules,
    conftests and tools are not."""
    tree(
        tmp_path,
        {
            "tools/fakehub.py": "",
            "tests/conftest.py": "",
            "tests/errors.py": "",
            "tests/events.py": "from tests.e2e.test_session_events import Listener\n",
            "tests/e2e/conftest.py": "",
            "tests/e2e/documents.py": "",
            "tests/e2e/test_session_events.py": "from tests.e2e.conftest import LiveServer\n",
            "tests/e2e/test_ui.py": "from tests.unit.test_model_listing import write_gguf\n",
            "tests/unit/test_model_listing.py": "from tests import errors\n",
            "tests/integration/test_refusals.py": "from tests.errors import error_of\n",
            "tests/integration/test_chat.py": (
                "from tests.integration.test_refusals import error_of\n"
                "from . import test_refusals\n"
                "from tests.conftest import X\nfrom tests.e2e import documents\n"
                "from tools.fakehub import Hub\n"
            ),
        },
    )
    assert {k for k in keys(tmp_path) if k[0] == "test modules"} == {
        ("test modules", "tests.events", "tests.e2e.test_session_events"),
        ("test modules", "tests.e2e.test_ui", "tests.unit.test_model_listing"),
        ("test modules", "tests.integration.test_chat", "tests.integration.test_refusals"),
    }


def test_a_circle_in_tools_is_caught_between_packages_and_between_modules(
    tmp_path: Path,
) -> None:
    """Issue 41 item 7: tools/ and tests/ are in the cycle rule (tools/a <-> tools/b), and in
    tools/ and tests/ two modules of one package that import each other are a cycle too (the
    concurrency <-> transformers_rows circle, through a lazy import). The modules at the top
    of tools/ and tests/ are each a node: e2e importing the top's conftest while a helper at
    the top imports an e2e module is no cycle, but e2e importing a helper that imports an e2e
    module is. Inside impl, two modules of one package that import each other are a cycle
    too (serving/a <-> serving/b)."""
    tree(
        tmp_path,
        {
            "tools/a/x.py": "from tools.b import y\n",
            "tools/b/y.py": "def f():\n    from tools.a.x import g\n",
            "tools/bench/concurrency.py": "def main():\n    from tools.bench import rows2\n",
            "tools/bench/rows2.py": "from tools.bench.concurrency import messages\n",
            "tools/bench/rows.py": "",
            "tools/bench/peer.py": "from tools.bench import rows\nfrom tools import sae_train\n",
            "tools/sae_train.py": "",
            "tests/conftest.py": "from tools import sae_train\n",
            "tests/events.py": "from tests.e2e import documents\n",
            "tests/servers.py": "from tests.e2e.conftest import free_port\n",
            "tests/e2e/documents.py": "",
            "tests/e2e/conftest.py": "from tests.conftest import MODEL_ID\n",
            "tests/e2e/test_x.py": "from tests.servers import serving\n",
            "impl/serving/a.py": "from . import b\n",
            "impl/serving/b.py": "from . import a\n",
        },
    )
    found = {k for k in keys(tmp_path) if k[0] in ("cycles", "module cycles")}
    assert found == {
        ("cycles", "tools.a -> tools.b -> tools.a", ""),
        ("cycles", "tests.e2e -> tests.servers -> tests.e2e", ""),
        ("module cycles", "tools.a.x -> tools.b.y -> tools.a.x", ""),
        (
            "module cycles",
            "tools.bench.concurrency -> tools.bench.rows2 -> tools.bench.concurrency",
            "",
        ),
        ("module cycles", "miserver.serving.a -> miserver.serving.b -> miserver.serving.a", ""),
    }


def test_third_party_imports_of_tools_and_tests_are_not_checked(tmp_path: Path) -> None:
    """Issue 41 item 7: tools/ and tests/ run with the test extras: the dependency rule reads
    miserver's modules only."""
    tree(tmp_path, {"tools/t.py": "import numpy\n", "tests/conftest.py": "import pytest\n"})
    assert not {k for k in keys(tmp_path) if k[0] == "dependencies"}


def test_known_violations_are_tolerated_and_stale_ones_reported(tmp_path: Path) -> None:
    """Issue 16 item 4: a KNOWN violation passes; a KNOWN entry that no longer occurs fails the
    check, so the list can only shrink."""
    tree(tmp_path, {"impl/serving/y.py": "import starlette\n"})
    present = ("web", "miserver.serving.y", "starlette")
    gone = ("core", "miserver.serving.y", "miserver.http.errors")
    assert check(tmp_path, {present: "moving"}) == ([], 1)
    problems, tolerated = check(tmp_path, {present: "moving", gone: "moved already"})
    assert tolerated == 1
    assert problems == [f"stale known violation: {gone}: delete it from KNOWN"]
    problems, _ = check(tmp_path, {})
    assert problems == [
        "[web] miserver.serving.y:1 imports starlette: "
        "only app, cli, handlers, http and cluster import the web framework"
    ]


def test_known_entries_name_a_rule() -> None:
    """Issue 16 item 4: every KNOWN entry belongs to a rule the checker has."""
    rules = {rule.name for rule in RULES} | {"test modules", "cycles", "module cycles"}
    rules |= {"dependencies"}
    assert {rule for rule, _, _ in KNOWN} <= rules
    assert all(KNOWN.values())


def test_only_the_cluster_loads_ray(tmp_path: Path) -> None:
    """Issue 49 item 1: Ray is imported by miserver.cluster alone, and miserver.cluster by
    the cli alone, so the embedded server never loads it."""
    tree(
        tmp_path,
        {
            "impl/serving/y.py": "import ray\n",
            "impl/cluster/z.py": "import ray.serve\nfrom ..serving import y\n",
            "impl/app.py": "from .cluster import z\n",
            "impl/cli.py": "from .cluster import z\n",
        },
    )
    found = {k for k in keys(tmp_path) if k[0] in ("ray", "cluster")}
    assert found == {
        ("ray", "miserver.serving.y", "ray"),
        ("cluster", "miserver.app", "miserver.cluster.z"),
    }
