"""The watermark rule of `rsc.events.retention`, as a model: a stream with groups that read,
acknowledge, stall and appear at any time, trimmed at any time under `keep: acknowledged`
with no limit. No entry a holding group has not acknowledged is ever removed; what is
removed is counted as lost only for groups that had not acknowledged it (none, here)."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rsc.events.retention import (
    GroupPosition,
    Keep,
    Retention,
    WhenFull,
    cut,
    lost_for,
    next_id,
    removed,
)

NOW = 10_000


class Stream(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.entries: list[tuple[int, int]] = []
        self.next_ms = 1
        #: group -> (last delivered, pending ids, acknowledged ids)
        self.groups: dict[str, tuple[tuple[int, int], set[tuple[int, int]], set[tuple[int, int]]]] = {}
        self.trimmed: set[tuple[int, int]] = set()

    @rule(n=st.integers(1, 5))
    def append(self, n: int) -> None:
        for _ in range(n):
            self.entries.append((self.next_ms, 0))
            self.next_ms += 1

    @rule(name=st.sampled_from(["a", "b", "c"]), at_end=st.booleans())
    def create_group(self, name: str, at_end: bool) -> None:
        if name not in self.groups:
            start = self.entries[-1] if at_end and self.entries else (0, 0)
            self.groups[name] = (start, set(), set())

    @rule(name=st.sampled_from(["a", "b", "c"]), n=st.integers(1, 4))
    def read(self, name: str, n: int) -> None:
        if name in self.groups:
            ld, pending, acked = self.groups[name]
            new = [e for e in self.entries if e > ld][:n]
            if new:
                self.groups[name] = (new[-1], pending | set(new), acked)

    @rule(name=st.sampled_from(["a", "b", "c"]), data=st.data())
    def ack(self, name: str, data: st.DataObject) -> None:
        if name in self.groups and self.groups[name][1]:
            ld, pending, acked = self.groups[name]
            some = data.draw(st.sets(st.sampled_from(sorted(pending)), min_size=1))
            self.groups[name] = (ld, pending - some, acked | some)

    def positions(self) -> list[GroupPosition]:
        return [GroupPosition(g, ld, min(p) if p else None) for g, (ld, p, _) in sorted(self.groups.items())]

    @rule()
    def trim(self) -> None:
        gone = removed(Retention(), self.entries, self.positions(), NOW)
        for g, (ld, pending, acked) in self.groups.items():
            position = GroupPosition(g, ld, min(pending) if pending else None)
            assert lost_for(gone, position, pending) == 0
            assert all(e in acked or (e <= ld and e not in pending) for e in gone)
        self.trimmed |= set(gone)
        self.entries = [e for e in self.entries if e not in set(gone)]

    @invariant()
    def a_stream_without_groups_keeps_everything(self) -> None:
        if not self.groups:
            assert not self.trimmed

    @invariant()
    def nothing_pending_was_removed(self) -> None:
        for _, pending, _ in self.groups.values():
            assert not (pending & self.trimmed)


TestWatermark = Stream.TestCase


def test_watermark_is_oldest_pending_or_first_after_last_delivered() -> None:
    assert GroupPosition("g", (5, 0)).watermark == (5, 1)
    assert GroupPosition("g", (5, 0), (3, 0)).watermark == (3, 0)
    assert next_id((5, 2**64 - 1)) == (6, 0)


def test_age_and_cap_cut_whatever_groups_hold_and_count_the_loss() -> None:
    entries = [(i, 0) for i in range(1, 11)]
    stopped = GroupPosition("stopped", (3, 0), (2, 0))  # 1 acknowledged, 2..3 pending? 2 pending
    by_age = Retention(keep=Keep.ALL, max_age_ms=NOW - 6)  # entries 1..5 are older
    gone = removed(by_age, entries, [stopped], NOW)
    assert gone == entries[:5]
    assert lost_for(gone, stopped, [(2, 0), (3, 0)]) == 4  # 2, 3 pending; 4, 5 never delivered
    capped = Retention(keep=Keep.ALL, max_entries_per_shard=4)
    assert removed(capped, entries, [stopped], NOW) == entries[:6]
    refusing = Retention(keep=Keep.ALL, max_entries_per_shard=4, when_full=WhenFull.REFUSE)
    assert removed(refusing, entries, [stopped], NOW) == []


def test_no_group_keeps_everything_and_released_groups_do_not_hold() -> None:
    entries = [(i, 0) for i in range(1, 6)]
    assert removed(Retention(), entries, [], NOW) == []
    assert cut(Retention(), [], NOW, (6, 0)) is None
    idle = GroupPosition("idle", (2, 0), holds=False)
    assert removed(Retention(), entries, [idle], NOW) == entries
    assert lost_for(entries, idle, []) == 3
