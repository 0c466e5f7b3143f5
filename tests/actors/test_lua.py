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
from rsc.events.wire import owner_key

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


def test_claim_then_read_reads_the_first_new_entries_once_the_backlog_is_done(
    sync_redis: redis_py.Redis, prefix: str
) -> None:
    """`member/claim.lua` with its eighth argument: the backlog first, `count` at a time; the
    call that finds it done reads new entries too (up to `count` less those claimed) and their
    tail; without it, the reply is the two elements it always was."""
    key = f"{prefix}:s0"
    sync_redis.xgroup_create(key, "billing", "0", mkstream=True)
    sync_redis.hset(owner_key(key), "billing", '{"memberId":"new","incarnation":"i2","memberEpoch":2}')
    old = [sync_redis.xadd(key, {"n": str(i)}) for i in range(3)]
    sync_redis.xreadgroup("billing", "old", {key: ">"})  # pending under the old owner
    fresh = [sync_redis.xadd(key, {"n": str(i)}) for i in range(3, 5)]
    claim = sync_redis.register_script(lua.script("member/claim"))

    def call(count: int, cursor: str, *more: str) -> list:  # type: ignore[type-arg]
        return claim(
            keys=[key, owner_key(key)], args=["billing", "new", "i2", "new", 0, count, cursor, *more]
        )

    cursor, claimed, new, tail = call(2, "0-0", "1")
    assert cursor != "0-0"
    assert [e[0] for e in claimed] == old[:2]
    assert (new, tail) == ([], "")  # the backlog is not done: nothing new is read yet
    cursor, claimed, new, tail = call(2, cursor, "1")
    assert cursor == "0-0"
    assert [e[0] for e in claimed] == old[2:]
    assert [e[0] for e in new] == fresh[:1]
    assert tail == ""
    assert sync_redis.xpending(key, "billing")["consumers"] == [{"name": "new", "pending": 4}]
    done, claimed, new, tail = call(4, "0-0", "1")  # the backlog fills the count: no room to read
    assert done == "0-0"
    assert len(claimed) == 4
    assert (new, tail) == ([], "")  # more to read
    sync_redis.xreadgroup("billing", "new", {key: ">"})
    last = sync_redis.xadd(key, {"n": "5"})
    _, claimed, new, tail = call(100, "0-0", "1")
    assert [e[0] for e in new] == [last]
    assert tail == last
    assert len(call(100, "0-0")) == 2  # without the eighth argument: as before
    idle = f"{prefix}:s1"  # nothing to claim or read: the new owner's consumer exists all the same
    sync_redis.xgroup_create(idle, "billing", "0", mkstream=True)
    sync_redis.hset(owner_key(idle), "billing", '{"memberId":"new","incarnation":"i2","memberEpoch":2}')
    reply = claim(keys=[idle, owner_key(idle)], args=["billing", "new", "i2", "new", 0, 100, "0-0", "1"])
    assert reply == ["0-0", [], [], "0-0"]
    assert [c["name"] for c in sync_redis.xinfo_consumers(idle, "billing")] == ["new"]
    sync_redis.hset(owner_key(key), "billing", '{"memberId":"other","incarnation":"i3","memberEpoch":3}')
    with pytest.raises(redis_py.ResponseError, match="FENCED"):
        call(100, "0-0", "1")


def test_claim_then_read_where_an_acl_refuses_creating_a_consumer(
    sync_redis: redis_py.Redis, standalone_url: str, prefix: str
) -> None:
    """The consumer is then made by the first entry read, as a plain XREADGROUP makes it."""
    key = f"{prefix}:s0"
    sync_redis.xgroup_create(key, "billing", "0", mkstream=True)
    sync_redis.hset(owner_key(key), "billing", '{"memberId":"new","incarnation":"i2","memberEpoch":2}')
    user = f"member-{prefix}"
    sync_redis.acl_setuser(
        user, enabled=True, passwords=["+secret"], keys=["*"], commands=["+@all", "-xgroup|createconsumer"]
    )
    try:
        with redis_py.Redis.from_url(
            standalone_url, username=user, password="secret", decode_responses=True
        ) as r:
            claim = r.register_script(lua.script("member/claim"))
            args = ["billing", "new", "i2", "new", 0, 100, "0-0", "1"]
            assert claim(keys=[key, owner_key(key)], args=args) == ["0-0", [], [], "0-0"]
            assert sync_redis.xinfo_consumers(key, "billing") == []
            entry = sync_redis.xadd(key, {"n": "1"})
            _, _, new, tail = claim(keys=[key, owner_key(key)], args=args)
            assert [e[0] for e in new] == [entry]
            assert tail == entry
            assert [c["name"] for c in sync_redis.xinfo_consumers(key, "billing")] == ["new"]
    finally:
        sync_redis.acl_deluser(user)
