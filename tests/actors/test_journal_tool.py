"""`rsc journal show | replay | verify` against aggregates written by real actors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator

import attrs
import pytest
import trio
from click.testing import CliRunner

from rsc import journal
from rsc.actors.actor import ActorSettings
from rsc.actors.effects.redis_effects import RedisEffects
from rsc.actors.redis_store import RedisStore
from rsc.actors.registry import Registry
from rsc.actors.store import JournalEntry
from rsc.actors.store_connection import RedisClient
from rsc.cli import main
from tests.actorkit import SETTINGS, Member, registry_on


@pytest.fixture
async def registry(redis: RedisClient) -> AsyncIterator[Registry]:
    settings = attrs.evolve(SETTINGS, actor=ActorSettings(checkpoint_every=5))
    async with registry_on(RedisStore(redis, retention=1_000), RedisEffects(redis), settings) as reg:
        yield reg


def rsc(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


async def handoff(registry: Registry, prefix: str) -> None:
    """a holds 0-5; b joins; a acks the revoke of 3-5; b takes them."""
    a = Member(registry, prefix, "billing", "a")
    b = Member(registry, prefix, "billing", "b")
    await a.heartbeat()
    await b.heartbeat()
    await a.heartbeat()  # told to revoke 3, 4, 5
    await a.heartbeat()  # acks
    await b.heartbeat()  # installed


async def test_show_a_handoff_in_order(registry: Registry, redis_url: str, prefix: str) -> None:
    await handoff(registry, prefix)
    code, out = await trio.to_thread.run_sync(
        rsc, "journal", "show", prefix, "billing", "--shard", "4", "--redis-url", redis_url
    )
    assert code == 0
    kinds = [line.split()[2] for line in out.splitlines()]
    handoff_kinds = [k for k in kinds if k in ("ShardsRevokeAcked", "ShardsReleased", "ShardsInstalled")]
    assert handoff_kinds == ["ShardsInstalled", "ShardsRevokeAcked", "ShardsReleased", "ShardsInstalled"]
    lines = [line for line in out.splitlines() if "ShardsInstalled" in line]
    assert "memberId=a" in lines[0]
    assert "memberId=b" in lines[-1]
    code, out = await trio.to_thread.run_sync(
        rsc, "journal", "show", prefix, "billing", "--member", "b", "--redis-url", redis_url
    )
    assert "memberId=a" not in out
    assert "MemberJoined" in out


async def test_replay_until_an_entry(registry: Registry, redis_url: str, prefix: str) -> None:
    await handoff(registry, prefix)
    _, out = await trio.to_thread.run_sync(
        rsc, "journal", "show", prefix, "billing", "--kind", "ShardsReleased", "--redis-url", redis_url
    )
    release_id = out.split()[0]
    code, out = await trio.to_thread.run_sync(
        rsc, "journal", "replay", prefix, "billing", "--until", release_id, "--redis-url", redis_url
    )
    assert code == 0
    state = json.loads(out)
    assert state["owners"] == {"0": "a", "1": "a", "2": "a"}  # released, not yet installed to b
    _, out = await trio.to_thread.run_sync(
        rsc, "journal", "replay", prefix, "billing", "--redis-url", redis_url
    )
    assert json.loads(out)["owners"] == {"0": "a", "1": "a", "2": "a", "3": "b", "4": "b", "5": "b"}


async def test_verify_passes_and_catches_a_damaged_snapshot(
    registry: Registry, redis: RedisClient, redis_url: str, prefix: str
) -> None:
    await handoff(registry, prefix)
    for _ in range(3):
        await Member(registry, prefix, "billing", "b").heartbeat()
    code, out = await trio.to_thread.run_sync(
        rsc, "journal", "verify", prefix, "billing", "--redis-url", redis_url
    )
    assert code == 0, out
    code, out = await trio.to_thread.run_sync(rsc, "journal", "verify", prefix, "--redis-url", redis_url)
    assert code == 0, out
    assert out.startswith("feature level ")  # the deployment's, then per aggregate what was seen
    assert re.search(r"journal schema [12], event versions v1 x\d+", out), out
    snapshot_key = f"rsc:v1:{{g/{prefix}/billing}}:snapshot"
    original = await redis.hget(snapshot_key, "state")
    state = json.loads(original)
    state["createdAtMs"] += 7  # no later event sets it: the replay cannot repair it
    await redis.hset(snapshot_key, {"state": json.dumps(state)})
    code, out = await trio.to_thread.run_sync(
        rsc, "journal", "verify", prefix, "billing", "--redis-url", redis_url
    )
    assert code == 1
    assert "snapshot state differs" in out
    await redis.hset(snapshot_key, {"state": original})  # leave it whole for the session-end check


def test_unreachable_redis_is_a_clear_error() -> None:
    """In a real process: the command says what is wrong and exits 1, no traceback."""
    args = [sys.executable, "-m", "rsc", "journal", "verify", "--redis-url", "redis://127.0.0.1:1"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert "cannot reach Redis at 127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr


def test_describe_escapes_what_could_disturb_a_terminal() -> None:
    """A journal written before the text limits may hold control characters: shown escaped."""
    data = json.dumps({"type": "ProducersPaused", "reason": "evil\x1b[2J\u202eline", "sinceMs": 1})
    line = journal.describe(JournalEntry("1-0", "ProducersPaused", 3, data))
    assert "\x1b" not in line
    assert "\u202e" not in line
    assert 'reason="evil\\u001b[2J\\u202eline"' in line


async def test_show_of_an_aggregate_that_does_not_exist_is_an_error(redis_url: str, prefix: str) -> None:
    code, out = await trio.to_thread.run_sync(
        rsc, "journal", "show", f"{prefix}-nope", "--redis-url", redis_url
    )
    assert code == 1
    assert f"no journal for stream '{prefix}-nope' in this Redis" in out
    code, out = await trio.to_thread.run_sync(
        rsc, "journal", "show", f"{prefix}-nope", "billing", "--redis-url", redis_url
    )
    assert code == 1
    assert "no journal for group 'billing'" in out


def test_a_checkpoint_a_baseline_writer_made_is_compared_without_the_fields_it_did_not_know() -> None:
    """At journal schema 1 a 0.1.0 coordinator may write checkpoints: it drops a member's
    `client.featureLevel` (it does not know it), so the replay by this release differs in that
    field alone. Verify compares those without it; any other difference still counts."""
    from rsc.events import codec
    from rsc.events.commands import CreateGroup, Heartbeat
    from rsc.events.group import GroupState, execute
    from rsc.events.model import EMPTY_LAYOUT, ClientInfo

    state, _ = execute(None, CreateGroup("orders", "billing", EMPTY_LAYOUT))
    state, _ = execute(state, Heartbeat("a", "i", 0, now_ms=1, client=ClientInfo("rsc-python", "0.2.0", 3)))
    raw = json.loads(codec.to_json(state))
    assert raw["members"]["a"]["client"].pop("featureLevel") == 3  # what 0.1.0 would write
    written_by_baseline = codec.from_json(json.dumps(raw), GroupState)
    assert written_by_baseline != state
    assert journal._same_for_baseline(written_by_baseline, state)
    assert not journal._same(written_by_baseline, state)
    raw["groupEpoch"] += 1
    assert not journal._same_for_baseline(codec.from_json(json.dumps(raw), GroupState), state)


def test_verify_of_a_redis_without_any_rsc_data_fails_unless_allowed(standalone_url: str) -> None:
    """Nothing to check is not a pass: Redis that lost everything looks exactly like this until
    a coordinator notices, so an empty Redis fails (exit 1, saying why) unless --allow-empty."""
    where = ["--redis-url", standalone_url, "--key-prefix", f"never{uuid.uuid4().hex[:8]}"]
    code, out = rsc("journal", "verify", *where)
    assert code == 1, out
    assert "no rsc data in this Redis" in out
    assert "Redis lost everything" in out
    code, out = rsc("journal", "verify", "--allow-empty", *where)
    assert code == 0, out
