"""The rule of idempotent producers across resharding (docs/protocol.md, P6), as a hypothesis
model over the real parts: the producers' own retry logic (`Publish`, `ProducerState`) and the
real append script in a real Redis. Only the network is simulated, per try: every reply comes
back; or the pipeline fails with some calls run and their replies lost, others not run yet and
delivered later (a late copy, after any number of later tries, retries and reshards). Between
tries the stream may be resharded: a shard sealed (DRAINING) and a new one added, the layout
the producer routes with replaced.

What must hold whatever happens: no message is ever in Redis twice; every publish that
completed has each of its messages there exactly once, under the id `publish` returned.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsc.client.append_calls import (
    SEALED_APPEND,
)
from rsc.client.producer_state import (
    ProducerState,
    Publish,
)
from rsc.events.model import ClientInfo, HeartbeatStatus, Layout, Shard, ShardState
from rsc.events.wire import ProducerHeartbeatResponse, seal_key

#: One try's network: "ok" (every reply back), or a failed pipeline: per call "ran" (run, reply
#: lost) or "late" (not run yet: delivered later).
TRIES = st.one_of(st.just("ok"), st.lists(st.sampled_from(["ran", "late"]), min_size=1, max_size=6))
STEP = st.tuples(
    st.integers(1, 6),  # messages in the publish
    st.lists(TRIES, max_size=4),  # the tries before the network lets every reply through
    st.booleans(),  # reshard after the first try
    st.integers(0, 3),  # late copies delivered after this publish
    st.booleans(),  # 130 publishes first, every reply back (a shard prunes its record every 128 calls)
)


def answer(layout: Layout) -> ProducerHeartbeatResponse:
    return ProducerHeartbeatResponse(
        HeartbeatStatus.OK,
        "p",
        layout.metadata_version,
        "jump-v1",
        0,
        False,
        1_000,
        5_000,
        layout,
        None,
        None,
        1,
    )


class Model:
    def __init__(self, r: redis.Redis, prefix: str) -> None:
        self.r = r
        self.prefix = prefix
        self.state = ProducerState(prefix, "p", ClientInfo())
        self.shards = [Shard(i, f"{prefix}:{{{prefix}:{i}}}", ShardState.ACTIVE) for i in range(2)]
        self.version = 1
        self.state.apply(answer(Layout(1, tuple(self.shards))))
        assert self.state.epoch == 1
        self.late: list[tuple[Any, ...]] = []
        self.done: dict[str, str] = {}  # mid -> the id its publish returned
        self.n = 0

    def reshard(self) -> None:
        """Seal the first ACTIVE shard (it drains) and add a new one: a new layout."""
        active = [s for s in self.shards if s.state is ShardState.ACTIVE]
        sealed = active[0]
        self.r.set(seal_key(sealed.key), str(self.version + 1), nx=True)
        index = len(self.shards)
        new = Shard(index, f"{self.prefix}:{{{self.prefix}:{index}}}", ShardState.ACTIVE)
        self.shards = [
            Shard(s.index, s.key, ShardState.DRAINING) if s is sealed else s for s in self.shards
        ] + [new]
        self.version += 1
        self.state.apply(answer(Layout(self.version, tuple(self.shards))))

    def deliver_late(self, count: int) -> None:
        for command in self.late[:count]:
            with contextlib.suppress(redis.ResponseError):  # refused (STALE, SEALED...): nothing appended
                self.r.execute_command(*command)
        del self.late[:count]

    def publish(self, count: int, tries: list[Any], reshard: bool) -> None:
        messages = []
        for _ in range(count):
            self.n += 1
            messages.append(({"mid": f"m{self.n}"}, f"k{self.n}"))
        publish = Publish(self.state, messages)
        try:
            for attempt, fate in enumerate([*tries, "ok"] + ["ok"] * 20):
                if not publish.pending:
                    break
                calls = publish.calls()
                if fate == "ok":
                    results: list[object] = []
                    for call in calls:
                        try:
                            results.append(self.r.execute_command(*call.command()))
                        except redis.ResponseError as refused:
                            results.append(refused)
                    replies = publish.take(results)
                    assert replies.failure is None, replies.failure
                    assert replies.fenced is None
                else:  # the pipeline failed: some ran (replies lost), some arrive later
                    for call, what in zip(calls, fate * len(calls), strict=False):
                        if what == "ran":
                            with contextlib.suppress(redis.ResponseError):
                                self.r.execute_command(*call.command())
                        else:
                            self.late.append(call.command())
                if attempt == 0 and reshard:
                    self.reshard()
            assert not publish.pending
            ids = publish.ids
            for (fields, _), entry in zip(messages, ids, strict=True):
                assert entry is not None
                self.done[str(fields["mid"])] = entry
        finally:
            publish.close()

    def check(self) -> None:
        found: dict[str, list[str]] = {}
        for shard in self.shards:
            for entry, fields in self.r.xrange(shard.key):
                found.setdefault(fields["mid"], []).append(entry)
        twice = {mid: ids for mid, ids in found.items() if len(ids) > 1}
        assert not twice, twice
        for mid, entry in self.done.items():
            assert found.get(mid) == [entry], (mid, entry, found.get(mid))


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=st.lists(STEP, min_size=1, max_size=8))
def test_no_message_twice_whatever_the_network_and_the_reshards(
    sync_redis: redis.Redis, steps: list[tuple[int, list[Any], bool, int, bool]]
) -> None:
    sync_redis.script_load(SEALED_APPEND)
    model = Model(sync_redis, f"idm{uuid.uuid4().hex[:8]}")
    for count, tries, reshard, late, elsewhere in steps:
        for _ in range(130 if elsewhere else 0):
            model.publish(1, [], reshard=False)
        model.publish(count, tries, reshard)
        model.deliver_late(late)
        model.check()
    model.deliver_late(len(model.late))
    model.check()
