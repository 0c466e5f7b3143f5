"""The Lua scripts rsc runs in Redis, one `.lua` file each, in one place.

`rsc/lua/member/` holds the data-plane scripts a member runs (read, claim, reclaim, start,
ack, dead-letter: each checks the shard's owner token first), `rsc/lua/coordinator/` those
the coordinator runs (journal appends, its lease, feature levels, owner tokens, consumer
groups, drain evidence). Each file is complete in itself (no includes), so a client in another
language loads the same file and Redis knows it by the same SHA1 (docs/protocol.md lists them).
Shared fragments are repeated verbatim, and tests/actors/test_lua.py keeps the copies identical.

Imports nothing of rsc: the client and the actors both load from here.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib.resources import files

__all__ = ["names", "script", "sha1"]


@cache
def script(name: str) -> str:
    """The text of script `name` (e.g. `"member/read"`), as Redis is given it.

    Raises `FileNotFoundError` for a name that has no file."""
    return (files(__name__) / f"{name}.lua").read_text(encoding="utf-8")


def sha1(name: str) -> str:
    """The SHA1 Redis knows script `name` by (what `EVALSHA` takes)."""
    return hashlib.sha1(script(name).encode()).hexdigest()


def names() -> list[str]:
    """Every script's name, sorted (`"coordinator/append"`, ..., `"member/read"`, ...)."""
    root = files(__name__)
    return sorted(
        f"{side.name}/{f.name.removesuffix('.lua')}"
        for side in root.iterdir()
        if side.is_dir() and not side.name.startswith("_")
        for f in side.iterdir()
        if f.name.endswith(".lua")
    )
