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

A member that rejoins soon after it left (no previous target, but a
`remembered` one: what it was targeted when it left) gets its remembered
shards back where that costs no extra move: members above their quota give
up the shards someone remembers first, and a member takes the ones it
remembers from what is given up first. So a restart moves its shards away
and back, not anyone else's, and the number of moves stays the minimum.

The only shards that move between members are those above a member's quota,
so a join takes shards only from members above the new quota, a leave moves
only the leaver's shards, and a shard-count change moves only what balance
needs. `minimal_moves` states that lower bound independently, for tests and
the simulator.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from collections.abc import Set as AbstractSet

Assignment = Mapping[str, frozenset[int]]


def assign(
    members: Iterable[str],
    shards: Iterable[int],
    previous: Assignment,
    remembered: Assignment | None = None,
) -> dict[str, frozenset[int]]:
    """Return the new target assignment: member id -> shard indexes.

    `previous` is the last target; entries for members or shards that no
    longer exist are ignored. `remembered`: for members without a previous
    target, what they were targeted before they left: given back where no extra move results.
    Every member in `members` appears in the result, possibly with an empty set.
    """
    member_ids = sorted(set(members))
    if not member_ids:
        return {}
    shard_set: frozenset[int] = shards if isinstance(shards, frozenset) else frozenset(shards)
    base, extra = divmod(len(shard_set), len(member_ids))
    kept, pool = _retained(member_ids, shard_set, previous)
    memory = _memory(member_ids, shard_set, previous, remembered)
    wanted = frozenset().union(*memory.values()) if memory else frozenset()
    plus = _extra_slots(member_ids, base, extra, kept, wanted)
    for member, mine in kept.items():
        quota = base + 1 if member in plus else base
        if len(mine) > quota:
            # keep the lowest indexes, give up the rest: first those someone rejoining remembers
            ordered = sorted(mine, key=lambda s: (s in wanted, s)) if wanted else sorted(mine)
            pool.update(ordered[quota:])
            kept[member] = set(ordered[:quota])
    for member, mine_again in memory.items():  # what it remembers, of what is free, first
        room = (base + 1 if member in plus else base) - len(kept.get(member, ()))
        back = sorted(pool.intersection(mine_again))[: max(room, 0)]
        if back:
            kept[member] = frozenset(back).union(kept.get(member, ()))
            pool.difference_update(back)
    free = sorted(pool)
    at = 0  # the next free shard to give (lowest index first)
    empty: frozenset[int] = frozenset()
    result: dict[str, frozenset[int]] = {}
    for member in member_ids:
        held = kept.get(member)
        need = (base + 1 if member in plus else base) - (len(held) if held else 0)
        if need > 0:
            given = frozenset(free[at : at + need])
            at += need
            result[member] = given.union(held) if held else given
        else:  # (a frozenset kept as it was is not copied)
            result[member] = frozenset(held) if held else empty
    return result


def _memory(
    member_ids: list[str], shard_set: frozenset[int], previous: Assignment, remembered: Assignment | None
) -> dict[str, frozenset[int]]:
    """Rejoining members (no previous target) -> the existing shards they remember; a shard
    remembered twice goes to the first member."""
    if not remembered:
        return {}
    out: dict[str, frozenset[int]] = {}
    taken: set[int] = set()
    for member in member_ids:
        mine = remembered.get(member)
        if not mine or previous.get(member):
            continue
        claim = frozenset(shard_set.intersection(mine) - taken)
        if claim:
            taken |= claim
            out[member] = claim
    return out


def _retained(
    member_ids: list[str], shard_set: frozenset[int], previous: Assignment
) -> tuple[dict[str, AbstractSet[int]], set[int]]:
    """Members that keep something: their previous shards that still exist; and the shards
    nobody keeps.

    In member order; a shard claimed twice goes to the first member. The sets returned are
    never changed in place (the previous ones are returned as they are when none of them is
    gone or claimed twice: a steady group costs one set difference, not a set per member).
    """
    before = [(member, prev) for member in member_ids if (prev := previous.get(member))]
    pool = set(shard_set)
    pool.difference_update(*(prev for _, prev in before))
    if sum(map(len, (prev for _, prev in before))) == len(shard_set) - len(pool):
        # What they keep covers len(shard_set) - len(pool) existing shards with exactly that
        # many entries: no shard is gone, none is claimed twice.
        return dict(before), pool
    taken: set[int] = set()
    kept: dict[str, AbstractSet[int]] = {}
    for member in member_ids:
        prev = previous.get(member)
        if not prev:
            continue
        mine = shard_set.intersection(prev)
        if not taken.isdisjoint(mine):
            mine -= taken
        if mine:
            taken |= mine
            kept[member] = mine
    return kept, set(shard_set.difference(taken))


def _extra_slots(
    member_ids: list[str],
    base: int,
    extra: int,
    kept: Mapping[str, AbstractSet[int]],
    wanted: frozenset[int] = frozenset(),
) -> set[str]:
    """The `extra` members whose quota is base + 1: first those already holding more than base
    (of those, first the ones whose surplus no rejoining member remembers: the others give
    their surplus back to whoever remembers it)."""
    if not extra:
        return set()
    above = [m for m, mine in kept.items() if len(mine) > base]
    if wanted:
        above.sort(key=lambda m: bool(kept[m] & wanted))  # stable: member order within
    chosen = above[:extra]
    if len(chosen) < extra:
        holders = set(chosen)
        chosen += [m for m in member_ids if m not in holders][: extra - len(chosen)]
    return set(chosen)


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
    kept, _ = _retained(member_ids, frozenset(shards), previous)
    base, extra = divmod(len(set(shards)), len(member_ids))
    excess = sum(max(0, len(k) - base) for k in kept.values())
    above = sum(1 for k in kept.values() if len(k) > base)
    return excess - min(extra, above)
