"""Redis losing or rolling back the coordinator's store at any step (issue 26), as a property.

Hypothesis draws a history of heartbeats, leaves, time passing, coordinator terms ending, and
store faults: an older copy restored (a lagging replica promoted, an older RDB), one aggregate
lost (evicted), everything lost (FLUSHALL, a restart without persistence). The registry runs on
a `MemoryStore` under a mock clock, with the shipped member machines. After every step the
invariants of PROTOCOL section 4 hold, as the coordinator tells them, across every fault:

* no shard is installed to two members at once;
* the group's epochs and every staying member's epoch never go down;
* no member machine whose lease is still valid holds a shard the coordinator installed to
  another member.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsc.actors.keys import AggregateId
from rsc.actors.store import MemoryStore
from rsc.events.model import HeartbeatStatus
from tests.actorkit import Member, registry_on

GROUP = AggregateId("orders", "billing")
MEMBERS = 4

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("beat"), st.integers(0, MEMBERS - 1)),
        st.tuples(st.just("beat"), st.integers(0, MEMBERS - 1)),
        st.tuples(st.just("leave"), st.integers(0, MEMBERS - 1)),
        st.tuples(st.just("wait"), st.integers(0, 12_000)),
        st.tuples(st.just("snapshot"), st.just(0)),
        st.tuples(st.just("roll_back"), st.just(0)),
        st.tuples(st.just("lose_group"), st.just(0)),
        st.tuples(st.just("lose_everything"), st.just(0)),
        st.tuples(st.just("term_ends"), st.just(0)),
        st.tuples(st.just("failover"), st.just(0)),
        st.tuples(st.just("failover"), st.just(0)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS)
def test_store_faults_at_any_step_keep_the_protocol_invariants(steps: list[tuple[str, int]]) -> None:
    try:
        trio.run(_history, steps, clock=trio.testing.MockClock(autojump_threshold=0))
    except BaseException:
        print("STEPS", steps)
        raise


async def _history(steps: list[tuple[str, int]]) -> None:
    store = MemoryStore()
    async with registry_on(store) as registry:
        members = [Member(registry, "orders", "billing", f"10.0.0.{i}/w/0") for i in range(MEMBERS)]
        checker = Checker()
        copy: dict[Any, Any] = store.snapshot()
        for step, arg in steps:
            match step:
                case "beat":
                    response = await members[arg].heartbeat()
                    assert response.status is not HeartbeatStatus.UNKNOWN_MEMBER or not members[arg].owned
                case "leave":
                    await members[arg].leave()
                case "wait":
                    await trio.sleep(arg / 1000)
                case "snapshot":
                    copy = store.snapshot()
                case "roll_back":
                    store.roll_back(copy)
                case "lose_group":
                    store.lose([GROUP])
                case "lose_everything":
                    store.lose()
                case "term_ends":
                    registry.stop_all()
                case "failover":  # to a lagging replica, longer than the coordinator lease
                    registry.stop_all()
                    store.roll_back(copy)
            actor = await registry.group("orders", "billing")
            # Faults show at the next write or check: let the correction run, as the dataset
            # watch and the sweep make it run within a second.
            actor.check_store("property test", repair=False)
            actor = await registry.group("orders", "billing")
            checker.check(actor, members, registry.clock.now_ms() / 1000)


class Checker:
    def __init__(self) -> None:
        self.epochs = (0, 0)
        self.member_epochs: dict[str, tuple[str, int]] = {}

    def check(self, actor: Any, members: list[Member], now: float) -> None:
        state = actor.state
        if state is None:
            return
        installed = Counter(s for m in state.members.values() for s in m.installed)
        assert all(n == 1 for n in installed.values()), installed
        epochs = (state.group_epoch, state.assignment_epoch)
        assert epochs >= self.epochs, (epochs, self.epochs)
        self.epochs = epochs
        for gone in set(self.member_epochs) - set(state.members):  # left or fenced: starts over
            del self.member_epochs[gone]
        for member_id, member in state.members.items():
            before = self.member_epochs.get(member_id)
            if before is not None and before[0] == member.incarnation:
                assert member.member_epoch >= before[1], (member_id, member.member_epoch, before)
            self.member_epochs[member_id] = (member.incarnation, member.member_epoch)
        owners = {s: m.member_id for m in state.members.values() for s in m.installed}
        for member in members:
            if member.machine.fence_at <= now:
                continue  # its lease ended: by the lease rule it reads nothing any more
            for shard in member.owned:
                owner = owners.get(shard)
                assert owner is None or owner == member.member_id, (shard, owner, member.member_id)
