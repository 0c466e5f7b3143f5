"""The shard sampler keeps to its interval, and stretches it where a sample is slow (time is
trio's autojump clock: the test runs instantly)."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from rsc.actors.deployment import Deployment
from rsc.actors.errors import StoreUnavailable
from rsc.actors.registry import Registry
from rsc.http.metrics import SAMPLE_SHARE, Metrics
from tests.actorkit import registry_on


class _TimedMetrics(Metrics):
    """Metrics whose sample takes `took` seconds of (virtual) time and notes when it started."""

    def __init__(self, registry: Registry, took: float) -> None:
        super().__init__(Deployment(registry))
        self.took = took
        self.starts: list[float] = []

    async def sample(self) -> None:
        self.starts.append(trio.current_time())
        await trio.sleep(self.took)


async def _starts(took: float, every_s: float, run_s: float) -> list[float]:
    async with registry_on() as registry:
        metrics = _TimedMetrics(registry, took)
        with trio.move_on_after(run_s):
            await metrics.sample_forever(every_s)
    start = metrics.starts[0]
    return [round(t - start, 6) for t in metrics.starts]


async def test_a_quick_sample_keeps_the_interval(autojump_clock: Any) -> None:
    # a sample of 0.1 s every 10 s: the next starts 10 s after the last started
    assert await _starts(0.1, 10.0, 35.0) == [0.0, 10.0, 20.0, 30.0]


async def test_a_slow_sample_stretches_the_interval_to_its_share(autojump_clock: Any) -> None:
    # a sample of 2 s may take 5 % of the time: one every 40 s, not every 10 s
    every = 2.0 / SAMPLE_SHARE
    assert every == 40.0
    assert await _starts(2.0, 10.0, 125.0) == [0.0, 40.0, 80.0, 120.0]


async def test_the_stretch_is_bounded(autojump_clock: Any) -> None:
    # a sample of 20 s would ask for 400 s: at most six intervals (60 s) apart
    assert await _starts(20.0, 10.0, 125.0) == [0.0, 60.0, 120.0]


class _FailingMetrics(_TimedMetrics):
    async def sample(self) -> None:
        await super().sample()
        raise StoreUnavailable("Redis does not answer")


async def test_a_failed_sample_does_not_stretch_the_interval(autojump_clock: Any) -> None:
    async with registry_on() as registry:
        metrics = _FailingMetrics(registry, 2.0)  # a sample that waited 2 s for Redis, in vain
        with trio.move_on_after(35.0):
            await metrics.sample_forever(10.0)
    start = metrics.starts[0]
    assert [round(t - start, 6) for t in metrics.starts] == [0.0, 10.0, 20.0, 30.0]
