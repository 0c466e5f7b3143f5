"""The retention watcher's schedule when its rounds fail (virtual time, a small fake of the
`Streams` it reads): a failed round is tried again a whole interval later, never at once (a
Redis refusal or a standby once made it spin on Redis), and a refusal that will not pass is
logged at WARNING each round while one that will (Redis away) stays at DEBUG."""

from __future__ import annotations

import logging

import coredis
import pytest
import trio

from rsc.actors.errors import StoreUnavailable, TermFenced
from rsc.actors.retention import TrimRequests, watch_retention


class FailingStreams:
    """What `watch_retention` reads of the registry: the stream list fails with `failure`."""

    def __init__(self, failure: BaseException) -> None:
        self.trim_requests = TrimRequests()
        self.failure = failure
        self.asked: list[float] = []

    async def stream_prefixes(self) -> list[str]:
        self.asked.append(trio.current_time())
        assert len(self.asked) <= 20, f"asked {len(self.asked)} times by {trio.current_time()} s"
        raise self.failure


@pytest.mark.parametrize(
    ("failure", "level"),
    [
        (StoreUnavailable("Redis away"), logging.DEBUG),
        (TermFenced("a standby"), None),
        (coredis.exceptions.ResponseError("NOPERM this user has no permissions"), logging.WARNING),
        (coredis.exceptions.NoScriptError("No matching script"), logging.DEBUG),
    ],
    ids=["unavailable", "standby", "refused", "noscript-left"],
)
async def test_a_failed_round_waits_a_whole_interval(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    failure: BaseException,
    level: int | None,
) -> None:
    streams = FailingStreams(failure)
    caplog.set_level(logging.DEBUG, logger="rsc")
    with trio.move_on_after(10.5):
        await watch_retention(streams, every_s=1.0)  # type: ignore[arg-type]
    assert len(streams.asked) == 10, streams.asked  # one a second, not thousands
    gaps = [b - a for a, b in zip(streams.asked, streams.asked[1:], strict=False)]
    assert min(gaps) >= 1.0
    lines = [r for r in caplog.records if r.name.startswith("rsc") and "retention round" in r.getMessage()]
    if level is None:
        assert lines == []
    else:
        assert {r.levelno for r in lines} == {level}
        assert len(lines) == 10
