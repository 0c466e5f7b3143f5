"""The core stays pure: rsc/events imports no I/O, no clock, no trio; clients load no server side."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).parent.parent / "rsc" / "events"
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
    "rsc.events.stream",
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
