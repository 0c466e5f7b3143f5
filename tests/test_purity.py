"""The core stays pure: rsc/events imports no I/O, no clock, no trio."""

from __future__ import annotations

import ast
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
