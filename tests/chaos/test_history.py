"""The chaos suite's history checker on synthetic histories: each property, kept and broken."""

from __future__ import annotations

import json

import attrs

from rsc.conformance.history import (
    Fault,
    Ownership,
    Publish,
    Record,
    check,
    entry_key,
    intervals,
    ownership_from_journal,
)

KEY = "s:{s:0}"


def call(
    member: str,
    entry: str,
    start: float,
    end: float | None,
    *,
    pid: int = 0,
    key: str = KEY,
    shard: int = 0,
    how: str = "end",
    deliveries: int = 1,
) -> list[Record]:
    """The records of one handler call: a start, and an end (or abort) unless `end` is None."""
    pid = pid or {"a": 100, "b": 200, "c": 300}[member]
    mid = f"m-{key}-{entry}"
    out = [Record("start", pid, member, shard, key, entry, start, mid, deliveries=deliveries)]
    if end is not None:
        out.append(Record(how, pid, member, shard, key, entry, end, mid, deliveries=deliveries))
    return out


def ack(entry: str, key: str = KEY) -> Publish:
    return Publish("ack", f"m-{key}-{entry}", 0.0, entry, key)


#: Shard 0 held by a from 0 to 10, then by b.
HANDOFF = [
    Ownership(0, "a", "install", 0.0),
    Ownership(0, "a", "release", 10.0),
    Ownership(0, "b", "install", 10.1),
]


def test_a_clean_history_passes_with_its_figures() -> None:
    records = [
        *call("a", "1-0", 1.0, 1.1),
        *call("a", "2-0", 1.2, 1.3),
        *call("b", "2-0", 10.2, 10.3),  # redelivered to the next owner: a duplicate, not a violation
        *call("b", "3-0", 10.4, 10.5),
    ]
    publishes = [ack("1-0"), ack("2-0"), ack("3-0"), Publish("fail", "m-x", 0.0)]
    report = check(records, publishes, [], HANDOFF)
    assert report.ok, report.problems()
    assert report.figures() == {
        "published": 3,
        "failed publishes": 1,
        "handled": 3,
        "handler calls": 4,
        "duplicates": 1,
        "open calls": 0,
        "max deliveries": 1,
        "overlaps": 0,
        "stale starts": 0,
        "order violations": 0,
        "lost": 0,
        "producer duplicates": 0,
    }


def test_a_message_appended_twice_by_a_producer_is_a_violation() -> None:
    """The same message (`mid`) handled under two entry ids: a producer appended it twice."""
    records = [*call("a", "1-0", 1.0, 1.1), *call("a", "2-0", 1.2, 1.3)]
    twice = [attrs.evolve(r, mid="m-1-0") for r in records]
    report = check(twice, [], [], HANDOFF)
    assert not report.ok
    assert report.producer_duplicates == ("m-1-0 as shard 0 1-0 and shard 0 2-0",)
    assert report.problems()[-1].startswith("f. messages a producer appended twice: 1")


def test_an_acknowledged_publish_without_an_end_record_is_lost() -> None:
    records = [*call("a", "1-0", 1.0, 1.1), *call("a", "2-0", 1.2, 1.3, how="abort")]
    report = check(records, [ack("1-0"), ack("2-0"), ack("3-0")], [], HANDOFF)
    assert [p.id for p in report.lost] == ["2-0", "3-0"]  # aborted, and never started
    assert not report.ok
    assert "a. acknowledged publishes never handled: 2" in report.problems()[0]


def test_the_same_entry_id_on_another_key_does_not_count_as_handled() -> None:
    records = call("a", "1-0", 1.0, 1.1, key="s:{s:1}", shard=1)
    report = check(records, [ack("1-0")], [], [Ownership(1, "a", "install", 0.0)])
    assert len(report.lost) == 1


def test_overlapping_calls_on_one_key_are_reported() -> None:
    records = [*call("a", "1-0", 1.0, 2.0), *call("b", "2-0", 1.5, 2.5)]
    report = check(records, [], [], [Ownership(0, "a", "install", 0), Ownership(0, "b", "install", 0)])
    assert len(report.overlaps) == 1
    assert (report.overlaps[0].first.member, report.overlaps[0].second.member) == ("a", "b")
    assert "c. overlapping handler calls" in report.problems()[0]
    # Back to back, or on different keys: no overlap.
    apart = [*call("a", "1-0", 1.0, 2.0), *call("b", "2-0", 2.0, 2.5), *call("c", "1-0", 1.5, 1.7, key="o")]
    assert len(intervals(apart, [])) == 3
    assert check(apart, [], [], []).overlaps == ()


def test_two_calls_of_one_member_on_one_key_overlap_too() -> None:
    records = [*call("a", "1-0", 1.0, 2.0), *call("a", "2-0", 1.5, 2.5)]
    assert len(check(records, [], [], HANDOFF).overlaps) == 1


def test_a_call_in_flight_at_a_sigstop_counts_until_the_stop() -> None:
    # a's call resumes after SIGCONT and ends at 12.0; b took the shard over at 10.1.
    records = [*call("a", "1-0", 1.0, 12.0), *call("b", "1-0", 10.2, 10.3)]
    stopped = [Fault(100, "STOP", 1.05), Fault(100, "CONT", 11.9)]
    report = check(records, [], stopped, HANDOFF)
    assert report.overlaps == (), report.problems()
    assert [c.how for c in intervals(records, stopped)].count("stopped") == 1
    # Without the stop it is an overlap.
    assert len(check(records, [], [], HANDOFF).overlaps) == 1


def test_a_call_without_an_end_counts_until_its_process_was_killed() -> None:
    records = [*call("a", "1-0", 1.0, None), *call("b", "1-0", 10.2, 10.3)]
    killed = [Fault(100, "KILL", 1.5)]
    assert check(records, [], killed, HANDOFF).overlaps == ()
    # Killed only after b started: overlap; never killed: open forever, overlap.
    assert len(check(records, [], [Fault(100, "KILL", 10.25)], HANDOFF).overlaps) == 1
    report = check(records, [], [], HANDOFF)
    assert len(report.overlaps) == 1
    assert report.open_calls == 1


def test_a_start_after_the_shard_moved_away_is_stale() -> None:
    records = [
        *call("a", "1-0", 1.0, 1.1),  # held
        *call("a", "2-0", 11.0, 11.1),  # installed to b at 10.1: stale
        *call("b", "3-0", 10.103, 10.2),  # b's first start 3 ms after its install: within tolerance
    ]
    report = check(records, [], [], HANDOFF)
    assert [(s.record.member, s.record.id, s.owner) for s in report.stale_starts] == [("a", "2-0", "b")]
    assert "d. handler starts after the shard moved away: 1" in report.problems()[0]


def test_a_start_after_its_own_release_is_stale_and_one_after_getting_it_back_is_not() -> None:
    ownership = [*HANDOFF, Ownership(0, "b", "release", 20.0), Ownership(0, "a", "install", 20.5)]
    released = call("a", "2-0", 10.05, 10.06)  # after a's release, before b's install
    back = call("a", "3-0", 21.0, 21.1)
    report = check([*released, *back], [], [], ownership)
    assert [s.record.id for s in report.stale_starts] == ["2-0"]


def test_a_start_by_a_member_that_never_held_the_shard_is_stale() -> None:
    report = check(call("c", "1-0", 5.0, 5.1), [], [], HANDOFF)
    assert [(s.record.member, s.owner, s.moved_at) for s in report.stale_starts] == [("c", "a", None)]


def test_first_handlings_out_of_id_order_are_reported() -> None:
    records = [
        *call("a", "1-0", 1.0, 1.1),
        *call("a", "3-0", 1.2, 1.3),  # read after a revoke began...
        *call("b", "2-0", 10.2, 10.3),  # ...while 2-0 waited for the next owner
    ]
    report = check(records, [], [], HANDOFF)
    assert [(v.earlier.id, v.later.id) for v in report.order_violations] == [("3-0", "2-0")]
    assert "e. first handlings out of entry-id order: 1" in report.problems()[0]


def test_redeliveries_and_other_keys_do_not_break_order() -> None:
    records = [
        *call("a", "9-0", 1.0, 1.1),
        *call("a", "10-0", 1.2, 1.3),  # ids compare as numbers: 10-0 comes after 9-0
        *call("a", "10-1", 1.4, 1.5),
        *call("b", "9-0", 10.2, 10.3),  # a redelivery of an entry already handled
        *call("b", "5-0", 10.4, 10.5, key="o", shard=1),  # another shard has its own order
    ]
    ownership = [*HANDOFF, Ownership(1, "b", "install", 0.0)]
    assert check(records, [], [], ownership).order_violations == ()
    assert entry_key("10-1") > entry_key("10-0") > entry_key("9-5")


def test_ownership_is_read_from_journal_entries_on_the_monotonic_clock() -> None:
    entries = [
        ("1700000000000-0", "MemberJoined", json.dumps({"memberId": "a"})),
        ("1700000000500-0", "ShardsInstalled", json.dumps({"memberId": "a", "shards": [0, 2]})),
        (
            "1700000001250-3",
            "ShardsReleased",
            json.dumps({"memberId": "a", "shards": [2], "reason": "FENCED"}),
        ),
        ("1700000001300-0", "Checkpoint", "{}"),
    ]
    events = ownership_from_journal(entries, offset=1_699_999_000.0)
    assert [(e.shard, e.member, e.kind, round(e.t, 3)) for e in events] == [
        (0, "a", "install", 1000.5),
        (2, "a", "install", 1000.5),
        (2, "a", "release", 1001.25),
    ]


def test_a_block_note_does_not_end_a_call() -> None:
    start, end = call("a", "1-0", 1.0, 12.0)
    block = Record("block", 100, "a", 0, KEY, "1-0", 1.01, start.mid)
    records = [start, block, end, *call("b", "1-0", 10.2, 10.3)]
    assert len(check(records, [], [], HANDOFF).overlaps) == 1  # a's call runs until 12.0
    blocked = [Fault(100, "STOP", 1.01), Fault(100, "CONT", 11.0)]  # as the harness logs a block
    assert check(records, [], blocked, HANDOFF).overlaps == ()
