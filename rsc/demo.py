"""`rsc serve --demo`: a few members heartbeat against the coordinator over HTTP.

They join one by one, then one leaves and comes back, so the log shows the
protocol at work: shards revoked from one member, acknowledged, and only
then assigned to another. Members behave like the real client: they read
what `assigned` gives them, keep a shard to revoke until they acknowledge
it, and rejoin on FENCED or UNKNOWN_MEMBER.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import trio

STREAM = "demo-orders"
GROUP = "demo-billing"


@attrs.define
class DemoMember:
    member_id: str
    incarnation: str = attrs.field(factory=lambda: uuid.uuid4().hex[:8])
    epoch: int = 0
    owned: frozenset[int] = frozenset()
    to_ack: frozenset[int] = frozenset()
    status: str = ""

    def request(self, leave: bool = False) -> dict[str, Any]:
        return {
            "protocolVersion": 1,
            "streamPrefix": STREAM,
            "consumerGroup": GROUP,
            "memberId": self.member_id,
            "incarnation": self.incarnation,
            "memberEpoch": -1 if leave else self.epoch,
            "ownedShards": sorted(self.owned - self.to_ack),
            "revokedShards": sorted(self.to_ack),
            "client": {"name": "rsc-demo", "version": "1"},
        }

    def learn(self, response: dict[str, Any]) -> None:
        self.status = response["status"]
        if self.status in ("FENCED", "UNKNOWN_MEMBER"):
            self.epoch, self.owned, self.to_ack = 0, frozenset(), frozenset()
            return
        assignment = response["assignment"]
        self.epoch = response["memberEpoch"]
        self.to_ack = frozenset(assignment["revoke"])
        self.owned = frozenset(assignment["assigned"]) | self.to_ack


async def run_demo(
    base_url: str, say: Callable[[str], None], rounds: int | None = None, pace_s: float = 1.0
) -> None:
    """Drive the demo members (forever, or `rounds` heartbeat rounds)."""
    members = [DemoMember(f"10.0.0.{i}/demo-worker/0") for i in range(1, 4)]
    active: list[DemoMember] = []
    script = {0: "join 1", 3: "join 2", 6: "join 3", 10: "leave 2", 14: "join 2"}
    last: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        step = 0
        while rounds is None or step < rounds:
            action = script.get(step % 18)
            if action:
                verb, number = action.split()
                member = members[int(number) - 1]
                if verb == "join" and member not in active:
                    member.epoch, member.owned, member.to_ack = 0, frozenset(), frozenset()
                    active.append(member)
                    say(f"demo: {member.member_id} starts")
                elif verb == "leave" and member in active:
                    active.remove(member)
                    try:
                        await client.post("/v1/heartbeat", json=member.request(leave=True))
                    except httpx.HTTPError as exc:
                        say(f"demo: {member.member_id} could not leave: {exc}")
                        continue
                    say(f"demo: {member.member_id} leaves gracefully")
            for member in active:
                try:
                    response = await client.post("/v1/heartbeat", json=member.request())
                except httpx.HTTPError as exc:
                    say(f"demo: {member.member_id} could not reach the coordinator: {exc}")
                    continue
                if response.status_code != 200:  # e.g. 409: a previous run's incarnation still holds the id
                    say(f"demo: {member.member_id} refused: {response.json().get('message')}")
                    continue
                member.learn(response.json())
                line = f"{member.status:<14} reads {sorted(member.owned - member.to_ack)}"
                if member.to_ack:
                    line += f", revoking {sorted(member.to_ack)}"
                if last.get(member.member_id) != line:
                    last[member.member_id] = line
                    say(f"demo: {member.member_id} epoch {member.epoch:<3} {line}")
            step += 1
            await trio.sleep(pace_s)
