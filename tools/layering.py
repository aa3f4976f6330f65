"""The layering, written down and checked (STYLE.md habit 2; issue 16 item 4).

generated/    imports nothing of ours but itself
impl/engines  imports nothing of ours but miserver.engines
web stack     connexion, starlette, uvicorn: only app, cli, handlers, http and cluster import them
ray           only miserver.cluster imports Ray, and only the cli imports miserver.cluster (its
              `cluster` command): the embedded server never loads Ray
core          serving, local, steering, models, store, engines never import http, handlers or app
serving       the top of serving/ (admission, scheduler, prompts, stops, ...) is shared by the
              folders under it and imports neither serving/chat, serving/completions nor local/
chat          serving/chat/ (templates, tools, formats, reasoning) imports neither
              serving/completions nor local/: it reads messages and replies, not requests
completions   serving/completions/ never imports local/: the control plane configures the
              request path (local/config builds its defaults), never the reverse
responses     serving/responses/ (the Responses API on the completion path) never imports local/
conformance/  speaks only HTTP: imports nothing of ours but itself (miserver.conformance)
tools/        never imports tests/: what both use lives in tools/ (fakehub, uvicorn_thread)
test modules  tests/**/test_*.py are imported by pytest alone, never by another module: what
              tests share lives in helper modules (tests/*.py, tests/<tier>/*.py) and conftests
cycles        no import cycle between packages anywhere in impl, generated, conformance, tools
              and tests (a package is the folder a module lives in; a subpackage is a node of
              its own, and so is each module at the top of miserver, conformance, tools, tests)
module cycles in impl, tools/ and tests/, no import cycle between modules either, within one
              package too (the circle concurrency <-> transformers_rows lay inside tools/bench)
dependencies  every third-party module of miserver is declared in pyproject.toml

Every import statement counts, also inside functions and under `if TYPE_CHECKING:`: a
lazy or type-only import is still a dependency. Violations the code has today are listed in
KNOWN below, and a KNOWN entry that no longer occurs fails the check: the list only shrinks.

python -m tools.layering   # exit 1 and name every violation
"""

from __future__ import annotations

import ast
import logging
import re
import sys
import tomllib
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Violations the code has today: (rule, module, imported) -> why, and what removes it. For
# "cycles" the module is the cycle and imported is ""; for "dependencies" imported is the
# distribution. Delete an entry when its fix lands; the check fails on a stale one.
KNOWN: dict[tuple[str, str, str], str] = {}

# source folder -> the module name it installs as (setup.py), or is imported as from the root
FOLDERS = {
    "impl": "miserver",
    "generated": "miserver.generated",
    "conformance": "miserver.conformance",
    "tools": "tools",
    "tests": "tests",
}
WEB = ("connexion", "starlette", "uvicorn")
CORE = (
    "miserver.serving",
    "miserver.local",
    "miserver.steering",
    "miserver.models",
    "miserver.store",
    "miserver.probes",
    "miserver.events",
)
CHAT = "miserver.serving.chat"
COMPLETIONS = "miserver.serving.completions"
TOKENIZER = "miserver.serving.tokenizer"
RESPONSES = "miserver.serving.responses"
MESSAGES = "miserver.serving.messages"
LOCAL = "miserver.local"
CLUSTER = "miserver.cluster"
FRONT = ("miserver.app", "miserver.cli", "miserver.handlers", "miserver.http", CLUSTER)
TESTS = "tests"


@dataclass(frozen=True, slots=True)
class Rule:
    """Modules within `modules` (but not within `exempt`) import nothing within `banned`
    unless it is also within `allowed`. Every field holds dotted prefixes."""

    name: str
    modules: tuple[str, ...]
    banned: tuple[str, ...]
    why: str
    exempt: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()


RULES = [
    Rule(
        "generated",
        ("miserver.generated",),
        ("miserver",),
        "generated/ is rebuilt from the spec and imports nothing of ours",
        allowed=("miserver.generated",),
    ),
    Rule(
        "engines",
        ("miserver.engines",),
        ("miserver",),
        "engines import only miserver.engines of ours: they know models, not requests",
        allowed=("miserver.engines",),
    ),
    Rule(
        "web",
        ("miserver",),
        WEB,
        "only app, cli, handlers, http and cluster import the web framework",
        exempt=FRONT,
    ),
    Rule(
        "ray",
        ("miserver",),
        ("ray",),
        "only miserver.cluster imports Ray: the embedded server never loads it",
        exempt=(CLUSTER,),
    ),
    Rule(
        "cluster",
        ("miserver",),
        (CLUSTER,),
        "only the cli's `cluster` command imports miserver.cluster",
        exempt=(CLUSTER, "miserver.cli"),
    ),
    Rule(
        "core",
        (*CORE, "miserver.engines"),
        ("miserver.http", "miserver.handlers", "miserver.app"),
        "the core never imports the HTTP front",
    ),
    Rule(
        "serving",
        ("miserver.serving",),
        (CHAT, COMPLETIONS, LOCAL),
        "the top of serving/ is shared by the folders under it and imports none of them",
        exempt=(CHAT, COMPLETIONS, TOKENIZER, RESPONSES, MESSAGES),
    ),
    Rule(
        "responses",
        (RESPONSES,),
        (LOCAL,),
        "serving/responses is a front end on the completion path, as a request is",
    ),
    Rule(
        "messages",
        (MESSAGES,),
        (LOCAL,),
        "serving/messages is a front end on the completion path, as a request is",
    ),
    Rule(
        "tokenizer",
        (TOKENIZER,),
        (LOCAL,),
        "serving/tokenizer takes a chat through the completion path's steps, as a request does",
    ),
    Rule(
        "chat",
        (CHAT,),
        (COMPLETIONS, LOCAL),
        "serving/chat reads messages and replies: it knows neither requests nor the control plane",
    ),
    Rule(
        "completions",
        (COMPLETIONS,),
        (LOCAL,),
        "the control plane configures the request path, never the reverse",
    ),
    Rule(
        "conformance",
        ("miserver.conformance",),
        ("miserver", "impl"),
        "conformance/ speaks only HTTP",
        allowed=("miserver.conformance",),
    ),
    Rule(
        "tools",
        ("tools",),
        (TESTS,),
        "tools never import the tests: what both use lives in tools/",
    ),
]
# folders whose modules are each a node of the package graph: the top of `miserver` holds both
# the entry points (app, cli) and the shared leaves (errors, headers, settings); the top of
# conformance/ both the kit's machinery (context, registry), which checks/ use, and the runner
# and cli, which use checks/; the top of tools/ both commands (check, layering) and what the
# benchmarks and tests share (sae_train, fakehub); the top of tests/ the conftest and the
# helper modules every tier uses
SPLIT = ("miserver", "miserver.conformance", "tools", TESTS)
# where the module graph, not only the package graph, has no cycle
MODULE_CYCLES = ("miserver", "tools", TESTS)
# module prefix -> the pyproject.toml lists that declare its third-party imports
DECLARED = {
    "miserver": ("dependencies",),
    "miserver.conformance": ("dependencies", "conformance"),
    CLUSTER: ("dependencies", "cluster"),
    "miserver.store.database": ("dependencies", "postgres"),  # psycopg, given a DSN only
}
# import name -> distribution name where they differ (case, `_` and `-` are normalised)
DISTRIBUTIONS = {
    "yaml": "pyyaml",
    "llama_cpp": "llama-cpp-python",
    "http_sfv": "http-sfv",
    "opentelemetry": "opentelemetry-api",
    "jinja2": "jinja2",
    "PIL": "pillow",
    "sklearn": "scikit-learn",
}

log = logging.getLogger("layering")


@dataclass(frozen=True, slots=True)
class Import:
    """One imported name: `import X` gives base X; `from X import a` gives base X, name X.a."""

    line: int
    base: str
    name: str | None = None

    @property
    def deepest(self) -> str:
        return self.name or self.base


@dataclass(frozen=True, slots=True)
class Module:
    name: str
    path: Path
    is_package: bool

    @property
    def package(self) -> str:
        """The package the module lives in: itself for an `__init__.py`."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    module: str
    imported: str
    line: int
    why: str
    detail: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.rule, self.module, self.imported)

    def __str__(self) -> str:
        line = f":{self.line}" if self.line else ""
        target = f" imports {self.imported}" if self.imported else ""
        head = f"[{self.rule}] {self.module}{line}{target}: {self.why}"
        return "\n    ".join((head, *self.detail))


def resolve(module: Module, level: int, name: str | None) -> str:
    """The absolute name of a relative import `from <level dots><name> import ...`."""
    parts = module.package.split(".")
    if level - 1 >= len(parts):
        raise ValueError(f"{module.path}: relative import beyond the top-level package")
    base = ".".join(parts[: len(parts) - (level - 1)])
    return f"{base}.{name}" if name else base


def imports(module: Module) -> Iterator[Import]:
    """Every name a file imports, absolute, with both `X` and `X.a` for `from X import a`."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (Import(node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve(module, node.level, node.module) if node.level else node.module or ""
            for alias in node.names:
                name = None if alias.name == "*" else f"{base}.{alias.name}"
                yield Import(node.lineno, base, name)


def modules(root: Path) -> list[Module]:
    """Every module under the mapped folders, by its installed name."""
    found = []
    for folder, top in FOLDERS.items():
        if not (root / folder).is_dir():
            continue
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join([top, *(parts[:-1] if is_package else parts)])
            found.append(Module(name, path, is_package))
    return found


@dataclass(frozen=True, slots=True)
class Tree:
    """The modules under a root, by name, each with what it imports (parsed once)."""

    modules: dict[str, Module]
    imports: dict[str, list[Import]]

    @classmethod
    def read(cls, root: Path) -> Tree:
        mods = {mod.name: mod for mod in modules(root)}
        by_line = {name: sorted(imports(mod), key=lambda i: i.line) for name, mod in mods.items()}
        return cls(mods, by_line)

    def target(self, imp: Import) -> str:
        """The module an import names: the longest module prefix of X.a we have, else X."""
        parts = imp.deepest.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in self.modules:
                return ".".join(parts[:end])
        return imp.base


def within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def rule_violations(tree: Tree) -> Iterator[Violation]:
    """The import rules. `X.a` decides for `from X import a`: it lies within X, so it is banned
    whenever X is, and `from miserver import engines` stays allowed inside an engine."""
    for rule in RULES:
        for mod in tree.modules.values():
            if not within(mod.name, rule.modules) or within(mod.name, rule.exempt):
                continue
            for imp in tree.imports[mod.name]:
                if within(imp.deepest, rule.banned) and not within(imp.deepest, rule.allowed):
                    yield Violation(rule.name, mod.name, tree.target(imp), imp.line, rule.why)


def is_test_module(name: str) -> bool:
    """A module pytest collects: tests/**/test_*.py."""
    return within(name, (TESTS,)) and name.rpartition(".")[2].startswith("test_")


def test_module_violations(tree: Tree) -> Iterator[Violation]:
    """No module imports a test module (a test module importing another one included)."""
    why = "a test module is pytest's alone: share helpers through tests/ helper modules"
    for mod in tree.modules.values():
        for imp in tree.imports[mod.name]:
            dest = tree.target(imp)
            if dest != mod.name and dest in tree.modules and is_test_module(dest):
                yield Violation("test modules", mod.name, dest, imp.line, why)


def node(mod: Module) -> str:
    """A module's node in the package graph: its package, or itself at the top of SPLIT."""
    return mod.name if mod.package in SPLIT and not mod.is_package else mod.package


Edge = tuple[str, int, str]  # importing module, line, imported module


def package_graph(tree: Tree) -> dict[tuple[str, str], set[Edge]]:
    """(package, package) -> the imports that make that edge."""
    edges: dict[tuple[str, str], set[Edge]] = defaultdict(set)
    for mod in tree.modules.values():
        for imp in tree.imports[mod.name]:
            dest = tree.modules.get(tree.target(imp))
            if dest is not None and node(dest) != node(mod):
                edges[node(mod), node(dest)].add((mod.name, imp.line, dest.name))
    return edges


def cycles(edges: Iterable[tuple[str, str]]) -> list[tuple[str, ...]]:
    """Every elementary cycle once, starting at its smallest node: a DFS from each node that
    visits only larger nodes."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    found = []
    for start in sorted(graph):
        stack: list[tuple[str, tuple[str, ...]]] = [(start, (start,))]
        while stack:
            here, path = stack.pop()
            for there in sorted(graph[here]):
                if there == start:
                    found.append(path)
                elif there > start and there not in path:
                    stack.append((there, (*path, there)))
    return sorted(found)


def edge_line(a: str, b: str, made_by: set[Edge], shown: int = 4) -> str:
    """`a -> b: m.x:3 imports b.y, ... (+n more)`."""
    found = [f"{m}:{line} imports {dest}" for m, line, dest in sorted(made_by)]
    more = f" (+{len(found) - shown} more)" if len(found) > shown else ""
    return f"{a} -> {b}: {', '.join(found[:shown])}{more}"


def module_graph(tree: Tree, scope: tuple[str, ...]) -> dict[tuple[str, str], set[Edge]]:
    """(module, module) -> the imports that make that edge, between modules within `scope`."""
    edges: dict[tuple[str, str], set[Edge]] = defaultdict(set)
    for mod in tree.modules.values():
        if not within(mod.name, scope):
            continue
        for imp in tree.imports[mod.name]:
            dest = tree.target(imp)
            if dest in tree.modules and dest != mod.name and within(dest, scope):
                edges[mod.name, dest].add((mod.name, imp.line, dest))
    return edges


def strongly_connected(edges: Iterable[tuple[str, str]]) -> list[set[str]]:
    """The graph's strongly connected components of more than one node (Kosaraju)."""
    forward: dict[str, set[str]] = defaultdict(set)
    backward: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        forward[a].add(b)
        backward[b].add(a)
    order: list[str] = []
    seen: set[str] = set()
    for start in sorted(forward):
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(sorted(forward[start])))]
        while stack:
            here, rest = stack[-1]
            there = next(rest, None)
            if there is None:
                stack.pop()
                order.append(here)
            elif there not in seen:
                seen.add(there)
                stack.append((there, iter(sorted(forward[there]))))
    found: list[set[str]] = []
    placed: set[str] = set()
    for start in reversed(order):
        if start in placed:
            continue
        component, todo = set(), [start]
        while todo:
            here = todo.pop()
            if here not in placed:
                placed.add(here)
                component.add(here)
                todo.extend(backward[here] - placed)
        if len(component) > 1:
            found.append(component)
    return found


def ring_violations(
    rule: str, edges: Mapping[tuple[str, str], set[Edge]], why: str
) -> Iterator[Violation]:
    """One violation per elementary cycle, each edge naming the imports that make it. Only
    the edges within a strongly connected component can be on a cycle."""
    components = strongly_connected(edges)
    inside = [(a, b) for a, b in edges if any(a in c and b in c for c in components)]
    for cycle in cycles(inside):
        ring = [*cycle, cycle[0]]
        detail = tuple(edge_line(a, b, edges[a, b]) for a, b in pairwise(ring))
        yield Violation(rule, " -> ".join(ring), "", 0, why, detail)


def cycle_violations(tree: Tree) -> Iterator[Violation]:
    why = "packages import each other (a subpackage is a package of its own)"
    yield from ring_violations("cycles", package_graph(tree), why)


def module_cycle_violations(tree: Tree) -> Iterator[Violation]:
    why = "modules import each other (directly or through others)"
    yield from ring_violations("module cycles", module_graph(tree, MODULE_CYCLES), why)


def distribution(requirement: str) -> str:
    """`connexion[uvicorn]>=3.3` -> `connexion`, normalised as PEP 503 does."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    return re.sub(r"[-_.]+", "-", match.group(0) if match else requirement).lower()


def declared(pyproject: Path) -> dict[str, set[str]]:
    """pyproject.toml list (`dependencies` or the name of an extra) -> the distributions in it."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    lists = {"dependencies": project.get("dependencies", [])}
    lists.update(project.get("optional-dependencies", {}))
    return {name: {distribution(r) for r in reqs} for name, reqs in lists.items()}


def third_party(imps: Iterable[Import]) -> dict[str, Import]:
    """Top-level name -> its first import, for the imports neither stdlib nor ours."""
    found: dict[str, Import] = {}
    for imp in imps:
        top = imp.base.partition(".")[0]
        if top not in sys.stdlib_module_names and top not in ("miserver", ""):
            found.setdefault(top, imp)
    return found


def dependency_violations(tree: Tree, pyproject: Path) -> Iterator[Violation]:
    """miserver's modules only: tools/ and tests/ run with the test extras installed."""
    lists = declared(pyproject)
    for mod in tree.modules.values():
        scopes = [p for p in DECLARED if within(mod.name, (p,))]
        if not scopes:
            continue
        scope = max(scopes, key=len)
        allowed = set().union(*(lists.get(name, set()) for name in DECLARED[scope]))
        for top, imp in third_party(tree.imports[mod.name]).items():
            dist = distribution(DISTRIBUTIONS.get(top, top))
            if dist not in allowed:
                why = f"not declared in pyproject.toml ({' or '.join(DECLARED[scope])})"
                yield Violation("dependencies", mod.name, dist, imp.line, why)


def violations(root: Path, pyproject: Path | None = None) -> list[Violation]:
    """Every violation under `root`, one per (rule, module, imported), its first line kept."""
    tree = Tree.read(root)
    found: dict[tuple[str, str, str], Violation] = {}
    for v in (
        *rule_violations(tree),
        *test_module_violations(tree),
        *cycle_violations(tree),
        *module_cycle_violations(tree),
        *dependency_violations(tree, pyproject or root / "pyproject.toml"),
    ):
        found.setdefault(v.key, v)
    return list(found.values())


def check(
    root: Path, known: Mapping[tuple[str, str, str], str], pyproject: Path | None = None
) -> tuple[list[str], int]:
    """What to report (violations not in `known`, stale `known` entries); how many were known."""
    found = violations(root, pyproject)
    keys = {v.key for v in found}
    problems = [str(v) for v in found if v.key not in known]
    problems += [
        f"stale known violation: {key}: delete it from KNOWN" for key in known if key not in keys
    ]
    return problems, sum(v.key in known for v in found)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    problems, tolerated = check(ROOT, KNOWN)
    for line in problems:
        log.error(line)
    summary = "ok" if not problems else f"{len(problems)} problem(s)"
    log.info("layering: %s, %d known violation(s) left", summary, tolerated)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
