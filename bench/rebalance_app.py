"""One worker process of `bench/rebalance.py`: an `App` with one listener (concurrency 1) that records
every handled message, and a trace of its member's heartbeats and shard lifecycle.

    python bench/rebalance_app.py   # configured by the environment, see below

SIGTERM leaves gracefully (`App.stop()`, as `rsc worker` does: the member hands its shards over, then
leaves); SIGKILL is a crash. Every line goes to `RSC_BENCH_OUT` with one `os.write` (no buffer a
SIGKILL could lose); times are `time.monotonic()`, one clock for every process of the machine:

* `h <shard> <publish ts> <handle ts>`: a handled message (handle ts: when the handler started);
* `t <json>`: the trace: each heartbeat (sent, answered, epoch, waitMs, owned, revoked, status,
  assigned, pending, revoke), each `assigned` / `revoke` call of the poller and each claim of
  a new shard's backlog (`claimed`, with the first new entries in the same call) (when it began
  and ended), and in eager mode each pause and resume.

Modes (`RSC_BENCH_MODE`):

* `push`: default member settings (long-poll heartbeats while shards are pending);
* `interval`: `MemberSettings(long_poll=False)`, learning of everything at the next heartbeat;
* `eager`: push, plus a stop-the-world gate like Kafka's eager protocol. A task polls the group view
  (`GET /v1/streams/{p}/groups/{g}`) every `RSC_BENCH_GATE_MS` (100 ms); while the group is not
  stable (some member not `STABLE`, or a member epoch, the assignment epoch and the group epoch not
  all equal) no handler call starts and nothing is read, on any shard of this member. Heartbeats,
  revokes and acknowledgements go on (the handler in flight finishes and a revoke completes at
  once), so the group settles exactly as in push mode, and every member resumes once it has. The
  gate is a subclass of the built-in `Poller` whose lease check (`state.lease_valid`, asked before every
  turn of a worker and every read) also says no while paused.

The bench needs two hooks the `App` has no option for: the trace wraps the member's transport and
the poller's lifecycle calls, and eager mode replaces the poller. Both subclass `Member` and
`Poller` and are installed into `rsc.client.worker` before the `App` starts its members.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import rsc.client.worker as app_module
from rsc.client.member import HeartbeatTransport, Member, MemberSettings
from rsc.client.poller import Message, Poller
from rsc.client.worker import App
from rsc.events.model import Layout
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse

MODE = os.environ.get("RSC_BENCH_MODE", "push")
STREAM = os.environ.get("RSC_BENCH_STREAM", "rebalance")
GROUP = os.environ.get("RSC_BENCH_GROUP", "bench")
GATE_S = int(os.environ.get("RSC_BENCH_GATE_MS", "100")) / 1000
STOP_TIMEOUT_S = 30.0
_fd = os.open(os.environ["RSC_BENCH_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def write(line: str) -> None:
    os.write(_fd, (line + "\n").encode())


def trace(kind: str, **fields: Any) -> None:
    write("t " + json.dumps({"k": kind, **fields}, separators=(",", ":")))


def _list(shards: frozenset[int]) -> list[int]:
    return sorted(shards)


class TracingTransport:
    """The member's transport, with each heartbeat exchange traced."""

    def __init__(self, inner: HeartbeatTransport) -> None:
        self.inner = inner

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        sent = time.monotonic()
        fields: dict[str, Any] = {
            "sent": sent,
            "epoch": request.member_epoch,
            "wait": request.wait_ms,
            "owned": _list(request.owned_shards),
            "revoked": _list(request.revoked_shards),
        }
        try:
            response = await self.inner.heartbeat(request)
        except BaseException as exc:
            trace("hb", done=time.monotonic(), error=type(exc).__name__, **fields)
            raise
        assignment = response.assignment
        trace(
            "hb",
            done=time.monotonic(),
            status=response.status.value,
            answerEpoch=response.member_epoch,
            groupEpoch=response.group_epoch,
            assigned=_list(assignment.assigned),
            pending=_list(assignment.pending),
            revoke=_list(assignment.revoke),
            **fields,
        )
        return response


class TracedMember(Member):
    def __init__(self, transport: HeartbeatTransport, *args: Any, **kwargs: Any) -> None:
        super().__init__(TracingTransport(transport), *args, **kwargs)


class Gate:
    """Eager mode's stop-the-world switch, shared by the pollers of the process."""

    def __init__(self) -> None:
        self.paused = MODE == "eager"  # until the group is first seen stable
        self.pollers: list[TracedPoller] = []

    def set(self, paused: bool) -> None:
        if paused == self.paused:
            return
        self.paused = paused
        trace("pause" if paused else "resume", t=time.monotonic())
        if not paused:
            for poller in self.pollers:
                poller.renewed(poller.lease_until)  # wakes its reader and workers if the lease is valid


GATE = Gate()


class TracedPoller(Poller):
    """The built-in poller, its lifecycle calls traced; in eager mode, gated by `GATE`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        GATE.pollers.append(self)
        lease_valid = self.state.lease_valid  # asked before every read and every worker's turn

        def gated() -> bool:
            return not GATE.paused and lease_valid()

        self.state.lease_valid = gated  # type: ignore[method-assign]
        claim_then_read = self.scripts.claim_then_read

        async def traced(entry: Any, count: int, cursor: str) -> Any:
            began = time.monotonic()
            out = await claim_then_read(entry, count, cursor)
            trace("claimed", t=began, end=time.monotonic(), shard=entry.index, claimed=len(out[0]))
            return out

        self.scripts.claim_then_read = traced  # type: ignore[method-assign]

    async def assigned(self, shards: frozenset[int], layout: Layout) -> None:
        began = time.monotonic()
        await super().assigned(shards, layout)
        trace("assigned", t=began, end=time.monotonic(), shards=_list(shards))

    async def revoke(self, shards: frozenset[int], within_s: float) -> None:
        began = time.monotonic()
        await super().revoke(shards, within_s)
        trace("revoke", t=began, end=time.monotonic(), shards=_list(shards))

    async def lost(self, shards: frozenset[int]) -> None:
        trace("lost", t=time.monotonic(), shards=_list(shards))
        await super().lost(shards)


app_module.Member = TracedMember  # type: ignore[attr-defined]
app_module.Poller = TracedPoller  # type: ignore[attr-defined]

app = App(member_settings=MemberSettings(long_poll=MODE != "interval"))


@app.listener(stream=STREAM, group=GROUP, concurrency=1)
async def handle(message: Message) -> None:
    write(f"h {message.shard} {message.fields['ts']} {time.monotonic():.6f}")


def stable(view: dict[str, Any]) -> bool:
    """Every member reconciled to the current target: no rebalance under way."""
    epoch = view["groupEpoch"]
    members = view["members"]
    return (
        bool(members)
        and view["assignmentEpoch"] == epoch
        and all(m["state"] == "STABLE" and m["memberEpoch"] == epoch for m in members)
    )


async def watch_group(url: str) -> None:
    """Eager mode: pause while the group view says a rebalance is under way."""
    async with httpx.AsyncClient(base_url=url, timeout=2) as client:
        while True:
            try:
                answer = await client.get(f"/v1/streams/{STREAM}/groups/{GROUP}")
                if answer.status_code == 200:
                    GATE.set(not stable(answer.json()))
            except httpx.HTTPError:
                pass
            await trio.sleep(GATE_S)


async def main() -> None:
    url = os.environ["RSC_COORDINATOR_URL"]
    async with trio.open_nursery() as nursery:
        if MODE == "eager":
            nursery.start_soon(watch_group, url)
        await nursery.start(app.run)
        trace("started", t=time.monotonic(), member=app.members[0].member_id)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        trace("stopping", t=time.monotonic())
        app.stop()
        nursery.cancel_scope.deadline = trio.current_time() + STOP_TIMEOUT_S
        for member in app.members:
            await member.wait_left()
        trace("left", t=time.monotonic())
        nursery.cancel_scope.cancel()  # the gate's watcher


if __name__ == "__main__":
    trio.run(main)
