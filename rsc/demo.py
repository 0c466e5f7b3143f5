"""`rsc serve --demo`: a few members heartbeat against the coordinator over HTTP.

They join one by one, then one leaves and comes back, so the log shows the
protocol at work: shards revoked from one member, acknowledged, and only
then assigned to another. The members are the real client runtime
(`rsc.client.member.Member`, driving the one member machine) over the real
HTTP client; only their shards' work is pretend: a `ShardLifecycle` that logs
what it is told, and takes a moment to finish in-flight work on a revoke.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import trio

from rsc import __version__
from rsc.client.coordinator import Coordinator
from rsc.client.errors import RscError
from rsc.client.member import Member, coordinator_outage
from rsc.events.model import ClientInfo, DrainProgress, Layout
from rsc.events.versions import MAX_FEATURE_LEVEL

STREAM = "demo-orders"
GROUP = "demo-billing"
CLIENT = ClientInfo("rsc-demo", __version__, MAX_FEATURE_LEVEL)
#: Step of the script -> what happens (the script repeats every 18 steps).
SCRIPT = {0: "join 1", 3: "join 2", 6: "join 3", 10: "leave 2", 14: "join 2"}


class DemoShards:
    """A member's shards as a `ShardLifecycle` that only logs."""

    def __init__(self, say: Callable[[str], None], revoke_s: float) -> None:
        self.say = say
        self.revoke_s = revoke_s
        self.member: Member | None = None
        self.reading: frozenset[int] = frozenset()
        self.revoking: frozenset[int] = frozenset()

    def show(self) -> None:
        member = self.member
        if member is None:
            return
        status = member.status.value if member.status else "-"
        line = f"{status:<14} reads {sorted(self.reading)}"
        if self.revoking:
            line += f", revoking {sorted(self.revoking)}"
        self.say(f"demo: {member.member_id} epoch {member.epoch:<3} {line}")

    async def assigned(self, shards: frozenset[int], layout: Layout) -> None:
        self.reading |= shards
        self.show()

    async def revoke(self, shards: frozenset[int], within_s: float) -> None:
        self.reading -= shards
        self.revoking |= shards
        self.show()
        await trio.sleep(self.revoke_s)  # in-flight work finishing
        self.revoking -= shards

    async def lost(self, shards: frozenset[int]) -> None:
        self.reading -= shards
        self.revoking -= shards
        self.show()

    async def concurrency(self, workers: int) -> None:
        return None

    def drain_progress(self) -> Sequence[DrainProgress]:
        return ()

    def renewed(self, until: float) -> None:
        return None


async def _run(member: Member, say: Callable[[str], None]) -> None:
    try:
        await member.run()
    except RscError as exc:  # e.g. refused by the coordinator's policy: the demo goes on
        say(f"demo: {member.member_id} stopped: {exc}")


#: How long the members still running may take to leave once the demo is asked to stop.
LEAVE_S = 3.0


async def run_demo(
    base_url: str,
    say: Callable[[str], None],
    rounds: int | None = None,
    pace_s: float = 1.0,
    stop: trio.Event | None = None,
) -> None:
    """Run the demo script (forever, or for `rounds` steps of `pace_s`, or until `stop` is
    set: then the members still running leave gracefully, within `LEAVE_S`, so that a demo
    started again at once finds no member of this one in its way). Members still running at
    the end of the rounds stop without leaving, as a crashed process would."""
    ids = [f"10.0.0.{i}/demo-worker/0" for i in range(1, 4)]
    active: dict[int, Member] = {}
    outage = coordinator_outage()  # one line when the coordinator stops answering, not one per member
    stop = trio.Event() if stop is None else stop
    async with Coordinator(base_url) as coordinator, trio.open_nursery() as nursery:
        step = 0
        while (rounds is None or step < rounds) and not stop.is_set():
            action = SCRIPT.get(step % 18)
            if action:
                verb, number = action.split()
                index = int(number) - 1
                if verb == "join" and index not in active:
                    shards = DemoShards(say, revoke_s=min(0.5, pace_s))
                    member = Member(
                        coordinator, STREAM, GROUP, ids[index], shards, client=CLIENT, outage=outage
                    )
                    shards.member = member
                    active[index] = member
                    say(f"demo: {member.member_id} starts")
                    nursery.start_soon(_run, member, say)
                elif verb == "leave" and index in active:
                    member = active.pop(index)
                    member.stop()
                    await member.wait_left()
                    say(f"demo: {member.member_id} leaves gracefully")
            step += 1
            with trio.move_on_after(pace_s):
                await stop.wait()
        if stop.is_set() and active:
            with trio.move_on_after(LEAVE_S):
                for member in active.values():
                    member.stop()
                for member in active.values():
                    await member.wait_left()
                say(f"demo: {', '.join(m.member_id for m in active.values())} left gracefully")
        nursery.cancel_scope.cancel()
