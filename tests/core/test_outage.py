"""`rsc.outage.OutageLog`: an outage is two log lines (begin, end with a count), not a line per retry."""

from __future__ import annotations

import logging

import pytest

from rsc.outage import OutageLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.outage" and r.levelno >= level]


def test_an_outage_is_one_line_when_it_begins_and_one_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "test.outage")
    clock = Clock()
    outage = OutageLog(logging.getLogger("test.outage"), "Redis", settle_s=1.0, clock=clock)
    outage.ok()  # nothing under way: nothing said
    assert lines(caplog) == []
    for _ in range(5):
        outage.failed("connection refused")
        clock.now += 0.5
    assert lines(caplog) == ["Redis unavailable, retrying: connection refused"]
    assert len(lines(caplog, logging.DEBUG)) == 5  # each repeat is still there at DEBUG
    outage.ok()  # 0.5 s after the last failure: a partial outage goes on
    assert outage.since == 100.0
    clock.now += 0.5
    outage.ok()
    assert lines(caplog)[1:] == ["Redis answers again after 3.0 s (4 repeated failures not logged)"]
    assert (outage.since, outage.outages) == (None, 1)
    outage.ok()
    assert len(lines(caplog)) == 2
    outage.failed("timeout")  # a second outage is said again, and counted afresh
    clock.now += 2
    outage.ok()
    assert lines(caplog)[2:] == [
        "Redis unavailable, retrying: timeout",
        "Redis answers again after 2.0 s (0 repeated failures not logged)",
    ]
    assert outage.outages == 2


def test_the_words_fit_what_fails(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "test.outage")
    clock = Clock()
    log = logging.getLogger("test.outage")
    outage = OutageLog(log, "heartbeats", down="fail", up="succeed again", settle_s=0, clock=clock)
    outage.failed("503 UNAVAILABLE")
    outage.failed("503 UNAVAILABLE")
    clock.now += 1.25
    outage.ok()
    assert lines(caplog) == [
        "heartbeats fail, retrying: 503 UNAVAILABLE",
        "heartbeats succeed again after 1.2 s (1 repeated failure not logged)",
    ]
    outage.failed("x")
    outage.reset()  # a new start: the outage under way is forgotten, no end line
    outage.ok()
    assert len(lines(caplog)) == 3
