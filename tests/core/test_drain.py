"""The drain rule (`rsc.events.drain`): when what Redis says shows a shard drained."""

from __future__ import annotations

from rsc.events.drain import DrainEvidence, GroupDrain, drain_check, drained, evidence
from rsc.events.model import DrainCheck


def test_a_key_that_holds_nothing_is_drained_whatever_the_groups() -> None:
    assert drained(DrainEvidence(sealed=False, exists=False), ["billing", "audit"])
    assert drained(DrainEvidence(True, False, (GroupDrain("billing", 0, False),)), ["audit"])


def test_every_group_on_the_key_must_have_nothing_pending_and_nothing_left_to_deliver() -> None:
    done = GroupDrain("billing", 0, False)
    assert drained(DrainEvidence(True, True, (done,)), ["billing"])
    assert not drained(DrainEvidence(True, True, (GroupDrain("billing", 1, False),)), ["billing"])
    assert not drained(DrainEvidence(True, True, (GroupDrain("billing", 0, True),)), ["billing"])
    # A consumer group on the key that is not one of the stream's is waited for too.
    assert not drained(DrainEvidence(True, True, (done, GroupDrain("other", 2, False))), ["billing"])


def test_each_of_the_streams_groups_must_be_on_a_key_that_holds_something() -> None:
    done = GroupDrain("billing", 0, False)
    assert not drained(DrainEvidence(True, True, (done,)), ["billing", "audit"])
    assert drained(DrainEvidence(True, True, (done,)), [])


def test_a_key_emptied_while_entries_are_pending_still_holds_them() -> None:
    assert evidence(True, "", ()) == DrainEvidence(True, False, ())
    assert evidence(False, "1-0", ()).exists
    pending = GroupDrain("billing", 2, False)
    assert evidence(True, "", [pending]) == DrainEvidence(True, True, (pending,))


def test_the_check_the_stream_aggregate_takes() -> None:
    assert drain_check(DrainEvidence(True, False), ["billing"]) == DrainCheck(sealed=True, drained=True)
    busy = DrainEvidence(False, True, (GroupDrain("billing", 1, False),))
    assert drain_check(busy, ["billing"]) == DrainCheck(sealed=False, drained=False)
