"""The code's shape in figures, measured from the source with `ast` (issue 41).

    python -m tools.figures           # the figures, as Markdown tables
    python -m tools.figures --check   # exit 1 when a limit below is broken

What it measures, per source folder (impl, conformance, tools, tests): .py
files, lines, module median / p90 / max, functions, function median / p90 /
max, functions over 50 lines, the largest class. A function's length runs
from its `def` line (decorators excluded) to its last line, docstring
included; p90 is the nearest rank. Then the request path's own figures: the
completion service's size, the core `Engine` protocol's members and the
optional protocols beside it, the fields of the forms a request takes, the
`NotImplementedError`s under impl/engines, and the layering (tools/layering.py:
its rules, the folders they read, the import circles it finds).

The limits `--check` holds (docs/ARCHITECTURE.md):

    CompletionService           at most 300 lines
    a function in impl/         at most 50 lines
    NotImplementedError         none in impl/engines
    import circles              none anywhere in the tree
"""

from __future__ import annotations

import ast
import functools
import logging
import math
import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import layering

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("impl", "conformance", "tools", "tests")
SERVICE = ("impl/serving/completions/service.py", "CompletionService")
ENGINE = ("impl/engines/base.py", "Engine")
CAPABILITIES = "impl/engines/capabilities.py"
FORMS = (  # the forms a completion request takes, and where each is made
    ("impl/serving/completions/requests.py", "GenerationRequest"),
    ("impl/serving/admission.py", "Admission"),
    ("impl/serving/completions/accepted.py", "Accepted"),
    ("impl/serving/completions/prepared.py", "Prepared"),
    ("impl/serving/completions/generation.py", "ChoiceJob"),
    ("impl/engines/base.py", "Hooks"),
    ("impl/engines/base.py", "Joiner"),
)
log = logging.getLogger("figures")
MAX_SERVICE_LINES = 300
MAX_FUNCTION_LINES = 50


@dataclass(frozen=True, slots=True)
class Function:
    path: str
    name: str
    line: int
    length: int

    def __str__(self) -> str:
        return f"`{self.path}:{self.line} {self.name}` ({self.length})"


@dataclass(frozen=True, slots=True)
class Folder:
    name: str
    modules: list[int]  # line counts
    functions: list[Function]
    largest: tuple[str, int, int]  # (class, lines, methods)


def nearest_rank(values: Sequence[int], p: float) -> int:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)] if ordered else 0


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def functions(tree: ast.AST, path: str) -> Iterator[Function]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            end = node.end_lineno or node.lineno
            yield Function(path, node.name, node.lineno, end - node.lineno + 1)


def _classes(tree: ast.AST) -> Iterator[tuple[str, int, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            methods = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body)
            yield node.name, (node.end_lineno or node.lineno) - node.lineno + 1, methods


@functools.cache
def folder(name: str) -> Folder:
    modules, funcs, classes = [], [], []
    for path in sorted((ROOT / name).rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        modules.append(len(path.read_text(encoding="utf-8").splitlines()))
        tree = _parse(path)
        funcs.extend(functions(tree, rel))
        classes.extend(_classes(tree))
    largest = max(classes, key=lambda c: c[1], default=("-", 0, 0))
    return Folder(name, modules, funcs, largest)


def class_of(path: str, name: str) -> ast.ClassDef:
    for node in ast.walk(_parse(ROOT / path)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise LookupError(f"{name} is not in {path}")


def members(cls: ast.ClassDef) -> list[str]:
    """A class's public methods, properties and annotated fields."""
    names = []
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.append(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in names if not n.startswith("_")]


def fields(cls: ast.ClassDef) -> list[str]:
    """A class's annotated fields (a dataclass's)."""
    return [
        node.target.id
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    ]


def class_lines(path: str, name: str) -> int:
    cls = class_of(path, name)
    return (cls.end_lineno or cls.lineno) - cls.lineno + 1


def protocols() -> list[tuple[str, list[str]]]:
    """The optional engine protocols and their members."""
    tree = _parse(ROOT / CAPABILITIES)
    return [
        (node.name, members(node))
        for node in tree.body
        if isinstance(node, ast.ClassDef) and any(_named(b) == "Protocol" for b in node.bases)
    ]


def _named(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else ""


def not_implemented() -> list[str]:
    """Every `raise NotImplementedError` under impl/engines."""
    found = []
    for path in sorted((ROOT / "impl" / "engines").rglob("*.py")):
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if _named(exc) == "NotImplementedError":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


@functools.cache
def circles() -> tuple[str, ...]:
    """The import circles tools/layering.py finds, anywhere it reads."""
    rules = ("cycles", "module cycles")
    return tuple(str(v) for v in layering.violations(ROOT) if v.rule in rules)


def long_functions(name: str = "impl") -> list[Function]:
    return [f for f in folder(name).functions if f.length > MAX_FUNCTION_LINES]


def broken() -> list[str]:
    """The limits broken now (none: the shape holds)."""
    out = []
    lines = class_lines(*SERVICE)
    if lines > MAX_SERVICE_LINES:
        out.append(f"CompletionService is {lines} lines (at most {MAX_SERVICE_LINES})")
    out.extend(f"{f} is over {MAX_FUNCTION_LINES} lines" for f in long_functions())
    out.extend(f"NotImplementedError at {where}" for where in not_implemented())
    out.extend(f"import circle: {c}" for c in circles())
    return out


def _folder_rows(folders: list[Folder]) -> list[str]:
    rows = [
        "| Folder | .py files | lines | module median / p90 / max | functions "
        "| function median / p90 / max | over 50 lines | largest class |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for f in folders:
        lengths = [fn.length for fn in f.functions]
        cls, cls_lines, methods = f.largest
        rows.append(
            f"| {f.name}/ | {len(f.modules)} | {sum(f.modules):,} "
            f"| {statistics.median(f.modules):g} / {nearest_rank(f.modules, 0.9)} / "
            f"{max(f.modules, default=0)} | {len(lengths)} "
            f"| {statistics.median(lengths):g} / {nearest_rank(lengths, 0.9)} / "
            f"{max(lengths, default=0)} | {sum(n > MAX_FUNCTION_LINES for n in lengths)} "
            f"| `{cls}` {cls_lines} lines / {methods} methods |"
        )
    return rows


def report() -> str:
    rows = ["## Figures (python -m tools.figures)", "", *_folder_rows(list(map(folder, FOLDERS)))]
    service = class_of(*SERVICE)
    methods = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in service.body)
    engine = members(class_of(*ENGINE))
    rows += [
        "",
        "| Request path | Figure |",
        "|---|---|",
        f"| `CompletionService` | {class_lines(*SERVICE)} lines, {methods} methods "
        f"(its module {len((ROOT / SERVICE[0]).read_text().splitlines())} lines) |",
        f"| core `Engine` protocol | {len(engine)} members: {', '.join(engine)} |",
    ]
    for name, names in protocols():
        rows.append(f"| optional `{name}` | {', '.join(names)} |")
    for path, name in FORMS:
        cls = class_of(path, name)
        count, total = len(fields(cls)), len(members(cls))
        rows.append(f"| `{name}` ({path}) | {count} fields, {total - count} methods |")
    long = long_functions()
    rows += [
        f"| functions in impl/ over {MAX_FUNCTION_LINES} lines | "
        f"{', '.join(map(str, long)) or 'none'} |",
        f"| `NotImplementedError` in impl/engines | {', '.join(not_implemented()) or 'none'} |",
        f"| layering rules | {len(layering.RULES)} named, plus cycles and dependencies, over "
        f"{', '.join(f'{k}/' for k in layering.FOLDERS)} |",
        f"| import circles | {', '.join(circles()) or 'none'} |",
    ]
    return "\n".join(rows)


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if "--check" in argv:
        failures = broken()
        for failure in failures:
            log.error(failure)
        log.info("figures: %d limit(s) broken", len(failures))
        return 1 if failures else 0
    log.info("%s", report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
