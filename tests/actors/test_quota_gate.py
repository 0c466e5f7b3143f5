"""The quota gate (`rsc.actors.quota_gate`): creations side by side never pass a quota together,
and two creations of one stream count it once. Under trio's autojump clock, on `MemoryEffects`
(the Redis half of the counts is `test_actors_redis.py`'s `stream_counts` test)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rsc.actors.effects.memory_effects import MemoryEffects
from rsc.actors.quota_gate import QuotaGate
from rsc.events.errors import QuotaExceeded
from rsc.events.quotas import Limits, Quota

QUOTA = Quota("ann", Limits(streams=10), total_streams=2)


class Streams:
    """Stream creations as the registry runs them: checked by the gate, then made (taking a
    while), then recorded; `fail` makes the next creation fail after its check."""

    def __init__(self, effects: MemoryEffects, gate: QuotaGate, quota: Quota = QUOTA) -> None:
        self.effects = effects
        self.gate = gate
        self.quota = quota
        self.fail = False
        self.answers: dict[str, list[str]] = {}

    def _maybe_fail(self) -> None:
        if self.fail:
            self.fail = False
            raise RuntimeError("Redis went away")

    async def create(self, name: str) -> None:
        said = self.answers.setdefault(name, [])
        try:
            async with self.gate.admitted(self.quota, name, 1, lambda: name not in self.effects.registered):
                await trio.sleep(1)
                self._maybe_fail()
                if name not in self.effects.registered:
                    await self.effects.register_stream(name)
                    await self.gate.created(self.quota, name)
                    said.append("created")
                else:
                    said.append("found")
        except QuotaExceeded:
            said.append("refused")
        except RuntimeError:
            said.append("failed")


async def test_two_creations_of_one_stream_at_the_limit_count_it_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    effects = MemoryEffects()
    await effects.register_stream("old")  # one of the two the deployment allows
    streams = Streams(effects, QuotaGate(effects))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(streams.create, "new")
        nursery.start_soon(streams.create, "new")  # a second member of the same new stream
        await trio.sleep(0.1)
        nursery.start_soon(streams.create, "other")  # past the quota while "new" is made
    assert sorted(streams.answers["new"]) == ["created", "found"]
    assert streams.answers["other"] == ["refused"]
    assert effects.registered == {"old", "new"}


async def test_a_second_creation_checks_afresh_when_the_first_failed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    effects = MemoryEffects()
    streams = Streams(effects, QuotaGate(effects))
    streams.fail = True
    async with trio.open_nursery() as nursery:
        nursery.start_soon(streams.create, "new")
        await trio.sleep(0.1)
        nursery.start_soon(streams.create, "new")
    assert streams.answers["new"] == ["failed", "created"]
    assert effects.registered == {"new"}


@pytest.mark.parametrize("total", [1, 3])
async def test_side_by_side_creations_stop_at_the_quota(
    autojump_clock: trio.testing.MockClock, total: int
) -> None:
    effects = MemoryEffects()
    streams = Streams(effects, QuotaGate(effects), Quota("ann", Limits(streams=10), total_streams=total))
    async with trio.open_nursery() as nursery:
        for n in range(6):
            nursery.start_soon(streams.create, f"s{n}")
    created = [name for name, said in streams.answers.items() if said == ["created"]]
    assert len(created) == len(effects.registered) == total
    await effects.unregister_stream(created[0])  # nothing admitted stays counted: one more fits
    await streams.create("again")
    assert streams.answers["again"] == ["created"]
