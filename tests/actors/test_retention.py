"""Retention's trim script (`coordinator/trim.lua`) on real Redis, held to the pure rules of
`rsc.events.retention`: the same entries removed, the same loss per group, counted once;
fenced; the cap producers check written as the policy says. On standalone Redis and the
3-primary cluster (checks through redis-py)."""

from __future__ import annotations

import redis as redis_py
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsc.actors.effects.trimming import RedisTrimming, TrimCall
from rsc.actors.errors import TermFenced
from rsc.actors.store_connection import RedisClient, open_redis
from rsc.events.retention import GroupPosition, Keep, Retention, WhenFull, lost_for, removed
from rsc.events.wire import TRIMMED_TOTAL_FIELD, cap_key, dead_letter_key, trimmed_key

NOW = 1_000_000


def key_of(prefix: str, n: int = 0) -> str:
    return f"{{{prefix}}}:{n}"


def fill(checker: redis_py.Redis, key: str, count: int) -> list[tuple[int, int]]:
    """`count` entries with ids 1-0, 2-0, ... (an entry's id is its time)."""
    pipe = checker.pipeline(transaction=False)
    for i in range(1, count + 1):
        pipe.xadd(key, {"n": str(i)}, id=f"{i}-0")
    pipe.execute()
    return [(i, 0) for i in range(1, count + 1)]


def position(checker: redis_py.Redis, key: str, group: str, read: int, acked: int) -> None:
    """Group `group` created at the start, `read` entries delivered, the first `acked` of them
    acknowledged (the rest pending)."""
    checker.xgroup_create(key, group, id="0-0")
    if read:
        got = checker.xreadgroup(group, "c", {key: ">"}, count=read)
        ids = [e[0] for e in got[0][1]]
        if acked:
            checker.xack(key, group, *ids[:acked])


def positions(checker: redis_py.Redis, key: str, released: set[str]) -> dict[str, GroupPosition]:
    out = {}
    for info in checker.xinfo_groups(key):
        ld = tuple(int(x) for x in info["last-delivered-id"].split("-"))
        oldest = None
        if info["pending"]:
            first = checker.xpending(key, info["name"])["min"]
            oldest = tuple(int(x) for x in first.split("-"))
        out[info["name"]] = GroupPosition(info["name"], ld, oldest, info["name"] not in released)  # type: ignore[arg-type]
    return out


def pending_ids(checker: redis_py.Redis, key: str, group: str) -> list[tuple[int, int]]:
    rows = checker.xpending_range(key, group, "-", "+", 10_000)
    return [tuple(int(x) for x in r["message_id"].split("-")) for r in rows]  # type: ignore[misc]


async def trim_all(
    redis: RedisClient, key: str, policy: Retention, released: tuple[str, ...] = ()
) -> tuple[int, dict[str, int]]:
    """Trim until nothing more goes (small limit: the script is called several times)."""
    effects = RedisTrimming(redis)
    removed_total, lost = 0, {}
    while True:
        (result,) = await effects.trim([TrimCall(key, policy, NOW, released)], limit=7)
        removed_total += result.removed
        for g, n in result.lost.items():
            lost[g] = lost.get(g, 0) + n
        if not result.more:
            return removed_total, lost


POLICIES = st.builds(
    Retention,
    keep=st.sampled_from(Keep),
    max_age_ms=st.one_of(st.none(), st.integers(NOW - 40, NOW)),
    max_entries_per_shard=st.one_of(st.none(), st.integers(1, 40)),
    when_full=st.sampled_from(WhenFull),
)
GROUPS = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.booleans()), min_size=0, max_size=3)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(policy=POLICIES, groups=GROUPS, count=st.integers(0, 40))
async def test_trim_removes_and_counts_as_the_rules_say(
    redis_url: str,
    checker: redis_py.Redis,
    prefix: str,
    policy: Retention,
    groups: list[tuple[int, int, bool]],
    count: int,
) -> None:
    async with open_redis(redis_url) as redis:  # each example is a trio run of its own
        await check_against_rules(redis, checker, key_of(prefix), policy, groups, count)


async def check_against_rules(
    redis: RedisClient,
    checker: redis_py.Redis,
    key: str,
    policy: Retention,
    groups: list[tuple[int, int, bool]],
    count: int,
) -> None:
    checker.delete(key, trimmed_key(key))
    entries = fill(checker, key, count) if count else []
    if not count:
        checker.xadd(key, {"n": "0"}, id="1-0")
        checker.xdel(key, "1-0")
    released = set()
    for n, (read, acked, holds) in enumerate(groups):
        position(checker, key, f"g{n}", min(read, count), min(acked, read, count))
        if not holds:
            released.add(f"g{n}")
    before = positions(checker, key, released)
    pending = {g: pending_ids(checker, key, g) for g in before}
    expected = removed(policy, entries, list(before.values()), NOW)
    expected_loss = {g: lost_for(expected, p, pending[g]) for g, p in before.items()}

    total, lost = await trim_all(redis, key, policy, tuple(sorted(released)))

    left = {tuple(int(x) for x in e[0].split("-")) for e in checker.xrange(key)}
    gone = [e for e in entries if e not in left]
    # An acknowledged cut that loses nothing may keep a macro node's margin (`XTRIM ... ~`), but
    # never an entry older than the age, nor under a refusing cap (producers wait for that
    # room); every other cut is exact: what the rules remove.
    cap = policy.max_entries_per_shard
    refusing = cap is not None and policy.when_full is WhenFull.REFUSE
    if policy.keep is Keep.ACKNOWLEDGED and not any(expected_loss.values()) and not refusing:
        assert set(gone) <= set(expected)
        if policy.max_age_ms is not None:
            assert not [e for e in left if e < (NOW - policy.max_age_ms, 0)]
        if cap is not None and policy.when_full is WhenFull.DROP_OLDEST:
            assert len(left) <= cap
    else:
        assert gone == expected, (policy, before, pending, total, lost)
    assert total == len(gone)
    # each group's loss is what the rules count on what actually went
    actual_loss = {g: lost_for(gone, p, pending[g]) for g, p in before.items()}
    assert lost == {g: n for g, n in actual_loss.items() if n}
    stored = checker.hgetall(trimmed_key(key))
    assert int(stored.get(TRIMMED_TOTAL_FIELD, 0)) == total
    for g in before:
        assert int(stored.get(g, 0)) == lost.get(g, 0)
        # a removed pending entry is acknowledged by the trim: never counted twice
        assert not [p for p in pending_ids(checker, key, g) if p in set(gone)]
    _, more_lost = await trim_all(redis, key, policy, tuple(sorted(released)))
    assert not more_lost


async def test_acknowledged_keeps_what_any_group_has_not_acknowledged(
    redis: RedisClient, checker: redis_py.Redis, prefix: str
) -> None:
    key = key_of(prefix)
    fill(checker, key, 500)
    position(checker, key, "fast", 500, 500)
    position(checker, key, "slow", 300, 250)  # 250 acknowledged, 50 pending, 200 unread
    total, lost = await trim_all(redis, key, Retention())
    first = checker.xrange(key, count=1)[0][0]
    assert first <= "251-0"  # the slow group's oldest pending stays
    assert 0 < total <= 250
    assert lost == {}
    checker.xack(key, "slow", *[f"{i}-0" for i in range(251, 301)])
    await trim_all(redis, key, Retention())
    assert checker.xrange(key, count=1)[0][0] <= "301-0"
    assert checker.hgetall(trimmed_key(key)).get("slow") is None


async def test_a_key_without_groups_keeps_everything_and_inactive_groups_stop_holding(
    redis: RedisClient, checker: redis_py.Redis, prefix: str
) -> None:
    key = key_of(prefix)
    fill(checker, key, 50)
    assert await trim_all(redis, key, Retention()) == (0, {})
    assert checker.xlen(key) == 50
    position(checker, key, "gone", 10, 10)
    total, lost = await trim_all(redis, key, Retention(), released=("gone",))
    assert (total, lost) == (50, {"gone": 40})
    assert checker.xlen(key) == 0


async def test_cap_drop_oldest_counts_each_lost_entry_once(
    redis: RedisClient, checker: redis_py.Redis, prefix: str
) -> None:
    key = key_of(prefix)
    fill(checker, key, 100)
    position(checker, key, "stopped", 30, 20)  # 10 pending, 70 unread
    policy = Retention(keep=Keep.ALL, max_entries_per_shard=25)
    total, lost = await trim_all(redis, key, policy)
    assert checker.xlen(key) == 25
    assert total == 75
    assert lost == {"stopped": 55}  # 10 pending + 45 unread of the 75 removed
    assert checker.xpending(key, "stopped")["pending"] == 0
    assert int(checker.hget(trimmed_key(key), "stopped")) == 55


async def test_refuse_writes_the_cap_and_dead_letters_are_capped(
    redis: RedisClient, checker: redis_py.Redis, prefix: str
) -> None:
    key = key_of(prefix)
    fill(checker, key, 10)
    for i in range(300):
        checker.xadd(dead_letter_key(key), {"n": str(i)})
    refuse = Retention(
        keep=Keep.ALL, max_entries_per_shard=5, when_full=WhenFull.REFUSE, dead_letter_max_entries=100
    )
    (result,) = await RedisTrimming(redis).trim([TrimCall(key, refuse, NOW)])
    assert result.removed == 0  # nothing unread goes for a refusing cap
    assert checker.xlen(key) == 10
    assert checker.get(cap_key(key)) == "5"
    assert 100 <= checker.xlen(dead_letter_key(key)) < 300
    await RedisTrimming(redis).trim([TrimCall(key, Retention(), NOW)])
    assert checker.get(cap_key(key)) is None


async def test_a_deposed_coordinator_trims_nothing(
    redis: RedisClient, checker: redis_py.Redis, prefix: str
) -> None:
    key = key_of(prefix)
    fill(checker, key, 10)
    position(checker, key, "g", 10, 10)
    await RedisTrimming(redis, fence_token=lambda: 7).trim([TrimCall(key, Retention(keep=Keep.ALL), NOW)])
    old = RedisTrimming(redis, fence_token=lambda: 6)
    try:
        await old.trim([TrimCall(key, Retention(), NOW)])
        raise AssertionError("a lower token trimmed")
    except TermFenced:
        pass
    assert checker.xlen(key) == 10
