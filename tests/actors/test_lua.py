"""Every Lua script in `rsc/lua/` (the coordinator's and the members', whoever wrote them).

Each file is complete in itself and says first, in `--` lines, what it does, its KEYS, ARGV
and reply; Redis accepts it (`SCRIPT LOAD`, through redis-py: independent of the coredis code
that runs it) and knows it by `rsc.lua.sha1(name)`; and a fragment repeated across files,
written out between `-- begin <name>` and `-- end <name>`, is byte-identical in each copy.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest
import redis as redis_py

from rsc import lua
from rsc.actors.effects.owners import OWNER_FENCE_FIELD

NAMES = lua.names()
#: A shared fragment: `-- begin <name>` ... `-- end <name>`, each marker on a line of its own.
FRAGMENT = re.compile(r"^-- begin (?P<name>\S+)\n(?P<body>.*?)^-- end (?P=name)$", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"^-- (begin|end) (\S+)$", re.MULTILINE)
ACTORS = Path(__file__).parents[2] / "rsc" / "actors"


def test_there_are_scripts_and_each_file_is_found_by_its_name() -> None:
    assert any(name.startswith("coordinator/") for name in NAMES)
    assert len(set(NAMES)) == len(NAMES)
    for name in NAMES:
        side, _, base = name.partition("/")
        assert side in ("coordinator", "member"), name
        assert re.fullmatch(r"[a-z][a-z0-9_]*", base), f"{name}: file names are lowercase with underscores"


@pytest.mark.parametrize("name", NAMES)
def test_redis_accepts_each_script_under_its_sha1(name: str, sync_redis: redis_py.Redis) -> None:
    assert sync_redis.script_load(lua.script(name)) == lua.sha1(name)


@pytest.mark.parametrize("name", NAMES)
def test_each_script_says_what_it_does_with_its_keys_argv_and_reply(name: str) -> None:
    lines = lua.script(name).splitlines()
    header = []
    for line in lines:
        if not line.startswith("--") or MARKER.fullmatch(line):
            break
        header.append(line)
    assert len(header) >= 4, f"{name}: starts with `--` lines saying what it does"
    for part in ("KEYS", "ARGV", "Reply"):
        assert any(line.startswith(f"-- {part}") for line in header), f"{name}: no `-- {part}` line"


def test_fragments_repeated_across_files_are_byte_identical() -> None:
    copies: dict[str, dict[str, str]] = defaultdict(dict)
    for name in NAMES:
        text = lua.script(name)
        markers = MARKER.findall(text)
        found = FRAGMENT.findall(text)
        assert len(markers) == 2 * len(found), f"{name}: a `-- begin`/`-- end` marker without its pair"
        for fragment, body in found:
            assert fragment not in copies or name not in copies[fragment], f"{name}: {fragment} twice"
            copies[fragment][name] = body
    for fragment, bodies in copies.items():
        assert len(set(bodies.values())) == 1, f"fragment {fragment} differs between {sorted(bodies)}"


def test_the_coordinator_keeps_no_lua_in_python_and_no_owner_fence_field_in_lua() -> None:
    """The scripts live in `rsc/lua/coordinator/`; the owner tokens' fence field is given to
    them by `rsc.actors.effects.owners` (ARGV), never written beside it in Lua."""
    for path in sorted(ACTORS.rglob("*.py")):
        assert "redis.call(" not in path.read_text(), f"{path}: Lua belongs in rsc/lua/coordinator/"
    for name in NAMES:
        assert OWNER_FENCE_FIELD not in lua.script(name), f"{name}: pass the fence field in ARGV"


def test_docs_protocol_lists_every_script_with_its_sha1() -> None:
    """docs/protocol.md ("Data-plane scripts") names each file with the SHA1 Redis knows it by:
    what a client in another language checks its copy against."""
    page = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    listed = dict(re.findall(r"^\| `([a-z]+/[a-z0-9_]+)\.lua` \|.*`([0-9a-f]{40})` \|$", page, re.MULTILINE))
    assert listed == {name: lua.sha1(name) for name in NAMES}
