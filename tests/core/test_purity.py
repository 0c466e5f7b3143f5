"""The core stays pure: rsc/events imports no I/O, no clock, no trio; clients load no server side."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).parents[2] / "rsc" / "events"
FORBIDDEN = {
    "trio",
    "anyio",
    "asyncio",
    "redis",
    "coredis",
    "quart",
    "httpx",
    "time",
    "datetime",
    "socket",
    "os",
}
FORBIDDEN_RANDOM = {"random", "uuid", "secrets"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_imports_nothing_impure(path: Path) -> None:
    assert imported_roots(path).isdisjoint(FORBIDDEN | FORBIDDEN_RANDOM)


def test_only_codec_knows_cattrs() -> None:
    users = sorted(p.name for p in CORE.glob("*.py") if "cattrs" in imported_roots(p))
    assert users == ["codec.py"]


#: What a client process must never load: the aggregates and their rules, and the server.
SERVER_ONLY = (
    "rsc.events.group",
    "rsc.events.group_state",
    "rsc.events.group_holds",
    "rsc.events.reconcile",
    "rsc.events.stream",
    "rsc.events.stream_state",
    "rsc.events.migration",
    "rsc.events.assignor",
    "rsc.events.placement",
    "rsc.events.respond",
    "rsc.actors",
    "rsc.http",
)


@pytest.mark.parametrize(
    "module", ["rsc.client", "rsc.client.worker", "rsc.client.producer", "rsc.client.sync", "rsc.events.wire"]
)
def test_a_client_loads_no_aggregate_and_no_server(module: str) -> None:
    """Importing a client module (in a fresh interpreter) loads the wire schema, never the server side."""
    probe = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=CORE.parent.parent
    ).stdout.split()
    assert module in loaded
    leaked = sorted(
        m for m in loaded if m in SERVER_ONLY or m.startswith(tuple(f"{s}." for s in SERVER_ONLY))
    )
    assert leaked == []


def test_the_shard_book_is_pure() -> None:
    """The poller's per-shard lifecycle machine imports no I/O, no clock, no trio, nothing of rsc."""
    book = CORE.parent / "client" / "poller" / "book.py"
    assert imported_roots(book).isdisjoint(FORBIDDEN | FORBIDDEN_RANDOM | {"rsc"})


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The rsc modules `path` imports (anywhere in it, lazy imports too)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for imported in targets:
            module = imported
            while module and module not in known:
                module = module.rpartition(".")[0]
            if module and module != name:
                found.add(module)
    return found


def test_no_two_modules_import_each_other() -> None:
    """The import graph of rsc/ has no cycle (a package importing its own modules aside)."""
    root = CORE.parent
    paths = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph = {name: _imports(path, name, set(paths)) for name, path in paths.items()}
    # A package's __init__ may import its own modules (and they it): not a cycle between modules.
    graph = {
        name: {t for t in targets if not t.startswith(f"{name}.") and not name.startswith(f"{t}.")}
        for name, targets in graph.items()
    }
    cycles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for target in graph[node]:
                if target == start:
                    cycles.append(" -> ".join([*path, start]))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, [*path, target]))
    assert cycles == []


def test_the_module_map_names_every_module() -> None:
    """docs/development.md's map of the package has a line for every module (so a new one is
    placed, and a removed one leaves the map)."""
    page = (CORE.parents[1] / "docs" / "development.md").read_text()
    layout = page[page.index("## Layout") : page.index("## Setting up and testing")]
    named = set(re.findall(r"\b([a-z_][a-z0-9_]*)\.py\b", layout))
    modules = {p.stem for p in CORE.parent.rglob("*.py") if p.stem != "__init__"} | {
        p.parent.name for p in CORE.parent.rglob("__init__.py") if p.parent != CORE.parent
    }
    missing = sorted(m for m in modules if m not in named and f"{m}/" not in layout)
    assert missing == []
    gone = sorted(n for n in named if n not in modules and n != "__init__" and not n.startswith("test_"))
    assert gone == []


#: A module longer than this says at its top why it is one module (docs/development.md).
LONG_MODULE = 600


def test_a_long_module_says_why_it_is_one() -> None:
    long = {
        str(p.relative_to(CORE.parents[1])): p
        for p in CORE.parent.rglob("*.py")
        if len(p.read_text().splitlines()) > LONG_MODULE
    }
    unexplained = sorted(
        name
        for name, p in long.items()
        if "Why one module:" not in (ast.get_docstring(ast.parse(p.read_text())) or "")
    )
    assert unexplained == []
