"""The sticky, balanced assignor.

Rules, in order of priority:

1. **Balanced**: with S readable shards and M members every member gets
   floor(S/M) or ceil(S/M) shards; exactly S mod M members get the larger
   quota.
2. **Sticky**: a member keeps the shards it was targeted before, up to its
   quota. The S mod M "extra" slots go first to members that already hold more
   than floor(S/M): any of them may keep its extra shard (not, say, the first
   members in sorted order; see KAFKA-18688, where pinning the extra slots
   forced needless moves).
3. **Deterministic**: the result depends only on the inputs; ties break by
   member id and shard index.

The only shards that move between members are those above a member's quota,
so a join takes shards only from members above the new quota, a leave moves
only the leaver's shards, and a shard-count change moves only what balance
needs. `minimal_moves` states that lower bound independently, for tests and
the simulator.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

Assignment = Mapping[str, frozenset[int]]


def assign(
    members: Iterable[str],
    shards: Iterable[int],
    previous: Assignment,
) -> dict[str, frozenset[int]]:
    """Return the new target assignment: member id -> shard indexes.

    `previous` is the last target; entries for members or shards that no
    longer exist are ignored. Every member in `members` appears in the result,
    possibly with an empty set.
    """
    member_ids = sorted(set(members))
    if not member_ids:
        return {}
    shard_set = set(shards)
    kept = _retained(member_ids, shard_set, previous)
    quota = _quotas(member_ids, len(shard_set), kept)
    pool = shard_set.difference(*kept.values())
    for member in member_ids:
        mine = kept[member]
        if len(mine) > quota[member]:
            ordered = sorted(mine)  # keep the lowest indexes, give up the rest
            pool.update(ordered[quota[member] :])
            kept[member] = set(ordered[: quota[member]])
    free = sorted(pool, reverse=True)
    result: dict[str, frozenset[int]] = {}
    for member in member_ids:
        mine = kept[member]
        need = quota[member] - len(mine)
        if need > 0:
            mine.update(free[-need:])
            del free[-need:]
        result[member] = frozenset(mine)
    return result


def _retained(member_ids: list[str], shard_set: set[int], previous: Assignment) -> dict[str, set[int]]:
    """Each member's previous shards that still exist (a shard claimed twice goes to the first)."""
    taken: set[int] = set()
    kept: dict[str, set[int]] = {}
    for member in member_ids:
        prev = previous.get(member)
        mine = shard_set.intersection(prev) if prev else set()
        if not taken.isdisjoint(mine):
            mine -= taken
        taken |= mine
        kept[member] = mine
    return kept


def _quotas(member_ids: list[str], shard_count: int, kept: Mapping[str, set[int]]) -> dict[str, int]:
    """Give each member its quota, extra slots first to members already above the base."""
    base, extra = divmod(shard_count, len(member_ids))
    quota = dict.fromkeys(member_ids, base)
    if extra:
        holders = [m for m in member_ids if len(kept[m]) > base]
        others = [m for m in member_ids if len(kept[m]) <= base]
        for member in (holders + others)[:extra]:
            quota[member] = base + 1
    return quota


def moves(previous: Assignment, target: Assignment) -> int:
    """Count shards taken from a member that is still in `target`.

    A shard whose previous member left, or that was not assigned before, is
    a free assignment, not a move.
    """
    owner = {s: m for m, shards in target.items() for s in shards}
    return sum(
        1
        for member, shards in previous.items()
        if member in target
        for s in shards
        if s in owner and owner[s] != member
    )


def minimal_moves(members: Collection[str], shards: Collection[int], previous: Assignment) -> int:
    """Return the fewest moves any balanced assignment needs from `previous`.

    A member keeping k still-valid shards must give up k - quota of them; the
    S mod M extra slots can save one shard each, for members with k > base.
    """
    member_ids = sorted(set(members))
    if not member_ids:
        return 0
    shard_set = set(shards)
    kept = _retained(member_ids, shard_set, previous)
    base, extra = divmod(len(shard_set), len(member_ids))
    excess = sum(max(0, len(k) - base) for k in kept.values())
    above = sum(1 for k in kept.values() if len(k) > base)
    return excess - min(extra, above)
