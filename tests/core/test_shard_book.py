"""The poller's per-shard lifecycle machine alone (`rsc.client.poller.book`): the transition
table, read selection, exclusivity and identity, with plain inputs and times (no trio, no Redis).
A `RuleBasedStateMachine` drives it with any outcome in any order, stale entries included, and
checks its invariants after every step."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from rsc.client.poller.book import TRANSITIONS, ReadState, ShardBook, ShardBookError, ShardEntry, Step

Entry = ShardEntry[None]


def book_of(n: int, now: float = 0.0) -> tuple[ShardBook[None], list[Entry]]:
    book: ShardBook[None] = ShardBook()
    return book, [book.assign(i, f"s:{i}", 0, None, now) for i in range(n)]


def test_a_shard_claims_its_backlog_reads_catches_up_and_is_woken() -> None:
    book, [shard] = book_of(1)
    assert shard.state is ReadState.CLAIMING
    assert book.readable(shard, 0.0)
    book.claimed(shard, "5-0")  # more to claim
    assert shard.state is ReadState.CLAIMING
    assert shard.claim_cursor == "5-0"
    book.claimed(shard, "0-0")
    assert shard.state is ReadState.READING
    assert book.read(shard, "9-0") is False
    assert (shard.state, shard.tail) == (ReadState.CAUGHT_UP, "9-0")
    assert not book.readable(shard, 0.0)  # waits for its wake-up
    assert book.woken(shard) is True
    assert (shard.state, shard.tail) == (ReadState.READING, None)
    assert book.woken(shard) is False  # woken again: nothing changes


def test_a_failed_read_backs_off_and_is_due_again() -> None:
    book, [shard] = book_of(1)
    book.claimed(shard, "0-0")
    book.read(shard, "1-0")
    book.read_failed(shard, 10.0, 2.0)  # e.g. refused behind a wake-up read
    assert shard.state is ReadState.READING
    assert shard.tail is None
    assert not book.readable(shard, 11.0)
    assert book.next_retry(11.0) == 12.0
    assert book.readable(shard, 12.0)
    assert book.next_retry(12.0) == math.inf
    assert book.to_read(12.0, room=10, batch=5) == [(shard, 5)]


def test_a_trouble_is_reported_until_a_read_succeeds() -> None:
    book, [shard] = book_of(1)
    assert book.troubled(shard, "FENCED no owner") is True
    assert book.troubled(shard, "FENCED no owner") is False  # reported once in the log
    assert book.troubles() == {0}
    assert book.fine(shard, 5.0) is True
    assert book.troubles() == frozenset()
    assert shard.read_at == 5.0
    book.stalled(shard, "to be read and not read for 10 s")
    assert book.troubles() == {0}
    assert shard.trouble == "stalled: to be read and not read for 10 s"


def test_a_stopped_shard_ignores_late_outcomes_and_is_never_read_or_handled() -> None:
    book, [shard] = book_of(1)
    book.claimed(shard, "0-0")
    book.stop(shard)
    for late in (
        lambda: book.read(shard, "3-0"),
        lambda: book.read(shard, None),
        lambda: book.woken(shard),
        lambda: book.read_failed(shard, 0.0, 1.0),
        lambda: book.claimed(shard, "0-0"),
        lambda: book.stalled(shard, "late"),
        lambda: book.troubled(shard, "late"),
    ):
        late()
        assert shard.state is ReadState.STOPPED
        assert shard.tail is None
        assert shard.trouble is None
    assert not book.readable(shard, math.inf)
    assert book.to_read(0.0, 10, 10) == []
    assert not book.may_handle(shard, 0.0, math.inf)
    with pytest.raises(ShardBookError):
        book.begin_turn(shard)
    assert book.troubles() == frozenset()


def test_steps_the_table_does_not_list_are_bugs() -> None:
    book, [shard] = book_of(1)
    with pytest.raises(ShardBookError):
        book.read(shard, None)  # a read result while it still claims its backlog
    book.claimed(shard, "0-0")
    with pytest.raises(ShardBookError):
        book.claimed(shard, "0-0")  # a backlog claim once reading
    assert shard.state is ReadState.READING


def test_one_turn_at_a_time_and_none_after_the_lease() -> None:
    book, [shard] = book_of(1)
    book.begin_turn(shard)
    with pytest.raises(ShardBookError):
        book.begin_turn(shard)
    assert book.may_handle(shard, 1.0, 2.0)
    assert not book.may_handle(shard, 2.0, 2.0)
    book.end_turn(shard)
    with pytest.raises(ShardBookError):
        book.end_turn(shard)


def test_a_reassigned_index_is_a_new_entry_and_the_old_one_is_stopped() -> None:
    book, [old] = book_of(1)
    new = book.assign(0, "s:0", 0, None, 1.0)
    assert old.stopped
    assert not book.holds(old)
    assert book.holds(new)
    book.forget(old)  # a late forget of the old one leaves the new one alone
    assert book.get(0) is new


@given(st.lists(st.booleans(), min_size=1, max_size=12), st.integers(1, 5))
def test_read_selection_serves_every_readable_shard_within_one_rotation(
    readable: list[bool], batch: int
) -> None:
    book, shards = book_of(len(readable))
    for shard, can in zip(shards, readable, strict=True):
        if not can:
            book.claimed(shard, "0-0")
            book.read(shard, "1-0")  # caught up: waits for a wake-up
    served: set[int] = set()
    for _ in range(len(shards)):
        reads = book.to_read(0.0, room=batch, batch=batch)  # room for one shard's batch
        assert len(reads) <= 1
        assert all(count == batch for _, count in reads)
        served |= {shard.index for shard, _ in reads}
    assert served == {i for i, can in enumerate(readable) if can}


class ShardBookMachine(RuleBasedStateMachine):
    """Any outcome, in any order, on current and stale entries."""

    entries = Bundle("entries")

    def __init__(self) -> None:
        super().__init__()
        self.book: ShardBook[None] = ShardBook()
        self.now = 0.0
        self.lease_until = 5.0
        self.seen: list[Entry] = []

    @rule(target=entries, index=st.integers(0, 3))
    def assign(self, index: int) -> Entry:
        old = self.book.get(index)
        entry = self.book.assign(index, f"s:{index}", index % 2, None, self.now)
        assert old is None or old.stopped
        self.seen.append(entry)
        return entry

    def _try(self, entry: Entry, step: Step, call: object) -> None:
        before = entry.state
        legal = (before, step) in TRANSITIONS
        try:
            call()  # type: ignore[operator]
        except ShardBookError:
            assert not legal
            assert entry.state is before  # a refused step changes nothing
            return
        assert entry.state is TRANSITIONS[before, step] or not legal

    @rule(entry=entries, done=st.booleans())
    def claimed(self, entry: Entry, done: bool) -> None:
        step = Step.BACKLOG_DONE if done else Step.BACKLOG_PART
        self._try(entry, step, lambda: self.book.claimed(entry, "0-0" if done else "7-0"))

    @rule(entry=entries, tail=st.none() | st.sampled_from(["0-0", "9-1"]))
    def read(self, entry: Entry, tail: str | None) -> None:
        step = Step.READ_MORE if tail is None else Step.CAUGHT_UP
        self._try(entry, step, lambda: self.book.read(entry, tail))
        if tail is not None and entry.state is ReadState.CAUGHT_UP:
            assert entry.tail == tail

    @rule(entry=entries)
    def woken(self, entry: Entry) -> None:
        was = entry.state
        assert self.book.woken(entry) is (was is ReadState.CAUGHT_UP)
        assert entry.state is (ReadState.READING if was is ReadState.CAUGHT_UP else was)

    @rule(entry=entries, delay=st.floats(0, 3))
    def read_failed(self, entry: Entry, delay: float) -> None:
        self.book.read_failed(entry, self.now, delay)
        if not entry.stopped:
            assert entry.retry_at == self.now + delay
            assert entry.state in (ReadState.CLAIMING, ReadState.READING)

    @rule(entry=entries)
    def stalled(self, entry: Entry) -> None:
        self.book.stalled(entry, "x")
        assert entry.stopped or (entry.trouble == "stalled: x" and self.book.readable(entry, self.now))

    @rule(entry=entries)
    def troubled_then_fine(self, entry: Entry) -> None:
        first = self.book.troubled(entry, "FENCED no owner")
        if self.book.holds(entry):
            assert entry.index in self.book.troubles()
        else:
            assert first is False  # a stopped entry's trouble is nobody's: not logged, not reported
        self.book.fine(entry, self.now)
        assert entry.stopped or entry.trouble is None

    @rule(entry=entries)
    def stop(self, entry: Entry) -> None:
        self.book.stop(entry)
        assert entry.stopped
        assert not self.book.holds(entry)

    @rule(entry=consumes(entries))
    def forget(self, entry: Entry) -> None:
        current = self.book.get(entry.index)
        self.book.forget(entry)
        assert entry.stopped
        assert self.book.get(entry.index) is (None if current is entry else current)

    @rule(entry=entries)
    def turn(self, entry: Entry) -> None:
        if entry.stopped or entry.in_turn:
            with pytest.raises(ShardBookError):
                self.book.begin_turn(entry)
            return
        self.book.begin_turn(entry)
        assert entry.in_turn
        self.book.end_turn(entry)

    @rule(seconds=st.floats(0, 2))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule(room=st.integers(0, 50), batch=st.integers(1, 20))
    def select(self, room: int, batch: int) -> None:
        reads = self.book.to_read(self.now, room, batch)
        chosen = [entry for entry, _ in reads]
        assert len({id(e) for e in chosen}) == len(chosen)
        assert all(self.book.readable(e, self.now) and self.book.holds(e) for e in chosen)
        assert all(0 < count <= batch for _, count in reads)
        assert sum(c for _, c in reads) <= room
        if sum(c for _, c in reads) < room:  # room left: every readable shard was chosen
            assert {id(e) for e in self.book if self.book.readable(e, self.now)} == {id(e) for e in chosen}

    @invariant()
    def tail_only_when_caught_up(self) -> None:
        for entry in self.seen:
            assert (entry.tail is not None) is (entry.state is ReadState.CAUGHT_UP)

    @invariant()
    def one_current_entry_per_index_and_the_others_stopped(self) -> None:
        current = {id(e) for e in self.book}
        assert len(current) == len(self.book.indexes())
        for entry in self.seen:
            if id(entry) not in current:
                assert entry.stopped
                assert not self.book.holds(entry)

    @invariant()
    def troubles_are_of_shards_held(self) -> None:
        held = {e.index for e in self.book if self.book.holds(e)}
        assert self.book.troubles() <= held

    @invariant()
    def nothing_stopped_is_handled(self) -> None:
        for entry in self.seen:
            if entry.stopped:
                assert not self.book.may_handle(entry, self.now, self.lease_until)


TestShardBookMachine = ShardBookMachine.TestCase
