"""Benchmark: what a worker sees while a large group churns.

Starts a private redis-server and the coordinator (`python -m rsc serve`, its own process)
for each driver shape, then drives `--members` members (default 1,000) of one group on a
`--shards`-shard stream (default 1,024) from this process: the members live in
`--members / --batch` agents of `--batch` members (default 100), as a worker process hosting
many members would, and each agent sends its members' heartbeats in `POST /v1/heartbeats`
batches. Every member is the shipped member machine (`rsc.events.member_machine`), and long
polls are off: every batch is answered at once, so its latency is the coordinator's cost.

Two driver shapes (`--shape`, default both):

* `interval`: each agent sends every one of its members in one full batch once per heartbeat
  interval, and a member acknowledges a revoke in the next batch (a worker whose members
  joined together; the handoffs wait for the next interval). The agents' batches are spread
  evenly over the interval, as workers started apart are; `--spread 0` sends them all at the
  same moment (every worker of the fleet in step: the batches queue);
* `at-once`: each agent sends the members that are due, lingering 5 ms for more as the Python
  client's batching does, and a member acknowledges a revoke at once (small batches, many).

Phases, for each shape: `quiet` (steady heartbeats, the anchor), `churn` (`--leaves` members
leave and `--joins` new ones join every second, default 10 and 10, for `--seconds`), then
once the group settled: `pause` (an operator pauses the group and resumes it: every member
revokes everything, then everything is assigned again) and `reset` (a forced reset of the
group to `latest`: paused, every member revokes at once, repositioned, resumed).

Reported for each phase: the latency of batches by size (1, 2-10, 11-50, 51-100 members:
p50/p99/max), refusals by code (an item's error code, or the HTTP status of a failed batch),
the coordinator's CPU, the bounds its own histogram (`rsc_heartbeat_seconds{endpoint="batch"}`)
puts on the batches' p50 and p99 (what the server spent, without the driver's own time); and
the members at the end (the agents' and the coordinator's count)
against the expected count. Prints a table and writes bench/results/churn.json.

    python bench/churn.py [--members 1000] [--shards 1024] [--seconds 20] [--shape interval] [--spread 1]
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._results import results_path
from bench.heartbeat import buckets_in, process, server_p99
from rsc.events import codec
from rsc.events.member_machine import MemberMachine, MemberSettings, Steps
from rsc.events.model import ClientInfo
from rsc.events.versions import MAX_FEATURE_LEVEL
from rsc.events.wire import HeartbeatResponse
from tests import redis_servers

RESULTS = results_path("churn.json")
CLIENT = ClientInfo("rsc-bench-churn", "1", MAX_FEATURE_LEVEL)
STREAM, GROUP = "churn", "churn"
GOAL_P99_MS, FLOOR_P99_MS = 50.0, 200.0
LINGER_S = 0.005  # what the Python client's batching transport waits for more members
SHAPES = ("interval", "at-once")
#: Batch sizes reported apart: (label, smallest, largest).
SIZES = (("1", 1, 1), ("2-10", 2, 10), ("11-50", 11, 50), ("51-100", 51, 100), (">100", 101, 10**9))
ADMIN = ("admin", "churn-bench")
#: Layout version -> the one layout object every member of this process holds.
LAYOUTS: dict[int, Any] = {}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


class Agent:
    """A process hosting `members`, sending their heartbeats in batches (see the module)."""

    def __init__(
        self, client: httpx.AsyncClient, settings: MemberSettings, shape: str, offset_s: float
    ) -> None:
        self.client = client
        self.settings = settings
        self.shape = shape
        self.offset_s = offset_s  # (agents of the interval shape start apart, as workers do)
        self.members: dict[str, MemberMachine] = {}
        #: (batch size, latency ms) of every batch answered.
        self.batches: list[tuple[int, float]] = []
        self.response_bytes: list[int] = []
        self.refusals: collections.Counter[str] = collections.Counter()
        #: Set when a member of this agent has something to say at once (a join, a leave).
        self.wake = trio.Event()

    def add(self, member_id: str) -> None:
        self.members[member_id] = MemberMachine(STREAM, GROUP, member_id, "i1", CLIENT, self.settings)
        self.wake.set()

    def stop_one(self, machine: MemberMachine) -> None:
        machine.stop()
        self.wake.set()

    async def run(self, stop: trio.Event) -> None:
        if self.shape == "interval":
            await self._every_interval(stop)
        else:
            await self._when_due(stop)

    def _silent(self) -> None:
        """What the client's loop does before each heartbeat (`rsc.client.member`): the lease
        rule, and a leave the coordinator did not hand over in time revokes the rest."""
        now = time.monotonic()
        for machine in self.members.values():
            self._perform(machine, machine.silent(now))

    @staticmethod
    def _perform(machine: MemberMachine, steps: Steps) -> None:
        if steps.stop:  # the handler finishes at once: acknowledged in the next request
            machine.revoked(steps.stop)

    async def _every_interval(self, stop: trio.Event) -> None:
        """One batch of every member each interval; what an answer asks is done by the next."""
        interval = self.settings.heartbeat_interval_ms / 1000
        await trio.sleep(self.offset_s)
        next_at = trio.current_time()
        while not stop.is_set():
            self._silent()
            members = list(self.members.values())
            if members:
                await self._send(members)
            next_at += interval
            await trio.sleep_until(max(next_at, trio.current_time()))

    async def _when_due(self, stop: trio.Event) -> None:
        """The members that are due, lingering for more; a revoke acknowledged at once."""
        while not stop.is_set():
            self._silent()
            now = time.monotonic()
            when = {m: m.next_heartbeat_at(now) for m in self.members.values()}
            due = [m for m, at in when.items() if at <= now]
            if not due:  # sleep until the next one is due, or a join or leave wakes it
                self.wake = trio.Event()
                with trio.move_on_after(min(when.values(), default=now + 1) - now):
                    await self.wake.wait()
                continue
            await trio.sleep(LINGER_S)
            now = time.monotonic()
            await self._send([m for m in self.members.values() if m.next_heartbeat_at(now) <= now])

    async def _send(self, due: list[MemberMachine]) -> None:
        now = time.monotonic()
        requests = [m.request(now) for m in due]
        body = {"heartbeats": [codec.wire.unstructure(r) for r in requests]}
        started = time.perf_counter()
        try:
            answer = await self.client.post("/v1/heartbeats", json=body)
            items = answer.json()["responses"] if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            answer, items = None, None
            self.refusals[type(exc).__name__] += 1
        if items is None:
            if answer is not None:
                self.refusals[f"HTTP {answer.status_code}"] += 1
            for machine, request in zip(due, requests, strict=True):
                self._perform(machine, machine.failed(request, time.monotonic(), "batch failed"))
            return
        self.batches.append((len(due), (time.perf_counter() - started) * 1000))
        self.response_bytes.append(len(answer.content))
        now = time.monotonic()
        for machine, request, item in zip(due, requests, items, strict=True):
            if "error" in item:
                limit = (item.get("details") or {}).get("limit")  # RATE_LIMITED: which limit
                self.refusals[str(item["error"]) + (f" ({limit})" if limit else "")] += 1
                self._perform(machine, machine.failed(request, now, str(item["error"])))
                continue
            response = codec.wire.structure(item, HeartbeatResponse)
            if response.layout is not None:  # one object per layout, as a worker's members share it
                shared = LAYOUTS.setdefault(response.layout.metadata_version, response.layout)
                response = attrs.evolve(response, layout=shared)
            self._perform(machine, machine.receive(request, response, now))
        for member_id in [m for m, machine in self.members.items() if machine.left]:
            del self.members[member_id]

    def settled(self) -> bool:
        return all(
            not m.pending and not m.revoking and not m.to_ack and m.owned and not m.leaving
            for m in self.members.values()
        )


def figures(agents: list[Agent]) -> dict[str, Any]:
    """Batch latencies by size, answer sizes and refusals the agents saw."""
    batches = [b for agent in agents for b in agent.batches]
    latencies = [ms for _, ms in batches]
    sizes = [size for agent in agents for size in agent.response_bytes]
    by_size = {}
    for label, low, high in SIZES:
        these = [ms for n, ms in batches if low <= n <= high]
        if these:
            by_size[label] = {
                "batches": len(these),
                "p50Ms": round(percentile(these, 0.50), 2),
                "p99Ms": round(percentile(these, 0.99), 2),
                "maxMs": round(max(these), 2),
            }
    refusals = sum((agent.refusals for agent in agents), collections.Counter())
    return {
        "batches": len(latencies),
        "p50Ms": round(percentile(latencies, 0.50), 2),
        "p99Ms": round(percentile(latencies, 0.99), 2),
        "maxMs": round(max(latencies, default=0.0), 2),
        "meanMs": round(statistics.fmean(latencies), 2) if latencies else 0.0,
        "bySize": by_size,
        "refusals": dict(refusals),
        "responseBytesMean": round(statistics.fmean(sizes)) if sizes else 0,
    }


async def coordinator_members(client: httpx.AsyncClient) -> int:
    """The members the coordinator counts in the group."""
    view = (await client.get(f"/v1/streams/{STREAM}/groups/{GROUP}")).json()
    return len(view["members"])


class Driver:
    """One shape's run: its agents, its admin client, and the phases (see the module)."""

    def __init__(self, args: argparse.Namespace, shape: str, url: str, pid: int) -> None:
        self.args, self.shape, self.pid = args, shape, pid
        settings = MemberSettings(long_poll=False, heartbeat_interval_ms=args.interval_ms)
        self.rng = random.Random(args.seed)
        count = max(1, args.members // args.batch)
        limits = httpx.Limits(max_connections=1)
        self.clients = [httpx.AsyncClient(base_url=url, timeout=30, limits=limits) for _ in range(count)]
        self.interval = args.interval_ms / 1000
        self.agents = [
            Agent(client, settings, shape, self.interval * i / count * args.spread)
            for i, client in enumerate(self.clients)
        ]
        self.admin = httpx.AsyncClient(base_url=url, timeout=60, auth=ADMIN)
        self.group = f"/v1/admin/streams/{STREAM}/groups/{GROUP}"
        self.serial = args.members
        for number in range(args.members):
            self.agents[number % count].add(f"10.1.{number // 250}.{number % 250}/churn/{number}")
        self.result: dict[str, Any] = {}

    async def run(self) -> dict[str, Any]:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for agent in self.agents:
                nursery.start_soon(agent.run, stop)
            self.result["settleSeconds"] = await self.settle("at the start")
            # What is alive now lives on, out of the collector's way: the driver's own full
            # collections (a third of a second each, measured) stalled every agent at once and
            # sent their batches together, a burst no worker fleet sends.
            gc.collect()
            gc.freeze()
            gc.set_threshold(70_000, 10, 100)
            await self.measured("quiet", self.quiet)
            await self.measured("churn", self.churn)
            churn = self.result["churn"]
            self.result["membersAtEnd"] = {
                "expected": self.args.members + churn["joins"] - churn["leaves"],
                "agents": sum(len(agent.members) for agent in self.agents),
                "coordinator": await coordinator_members(self.clients[0]),
            }
            if self.args.storms:
                await self.measured("pause", self.pause_and_resume)
                await self.measured("reset", self.forced_reset)
            stop.set()
        for client in [*self.clients, self.admin]:
            await client.aclose()
        return self.result

    async def settle(self, what: str) -> float:
        started = time.monotonic()
        while not all(agent.settled() for agent in self.agents):
            if time.monotonic() - started > self.args.settle_timeout:
                raise SystemExit(
                    f"{self.shape}: the group did not settle {what} in {self.args.settle_timeout} s"
                )
            await trio.sleep(0.2)
        return round(time.monotonic() - started, 2)

    async def measured(self, name: str, work: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        for agent in self.agents:
            agent.batches.clear()
            agent.response_bytes.clear()
            agent.refusals.clear()
        before = buckets_in((await self.clients[0].get("/metrics")).text, "batch")
        cpu0, wall0 = cpu_seconds(self.pid), time.monotonic()
        extra = await work()
        wall = time.monotonic() - wall0
        after = buckets_in((await self.clients[0].get("/metrics")).text, "batch")
        self.result[name] = {
            **figures(self.agents),
            "seconds": round(wall, 2),
            "serverP50MsAtMost": server_p99(before, after, 0.5),
            "serverP99MsAtMost": server_p99(before, after),
            "coordinatorCpu": round((cpu_seconds(self.pid) - cpu0) / wall, 3),
            **extra,
        }

    async def quiet(self) -> dict[str, Any]:
        await trio.sleep(self.args.seconds)
        return {}

    async def churn(self) -> dict[str, Any]:
        args = self.args
        leaves = joins = 0
        step = 1 / max(1, args.leaves + args.joins)
        wall0 = time.monotonic()
        while time.monotonic() - wall0 < args.seconds:
            await trio.sleep(step)
            if leaves * args.joins <= joins * args.leaves:
                agent = self.rng.choice(self.agents)
                staying = [m for m in agent.members.values() if not m.leaving]
                if staying:
                    agent.stop_one(self.rng.choice(staying))
                    leaves += 1
            else:
                self.serial += 1
                number = self.serial
                self.rng.choice(self.agents).add(f"10.2.{number // 250}.{number % 250}/churn/{number}")
                joins += 1
        # Every leave handed its shards over and every join got its own: then count.
        return {"leaves": leaves, "joins": joins, "settledAfterS": await self.settle("after the churn")}

    async def pause_and_resume(self) -> dict[str, Any]:
        (await self.admin.post(self.group + "/pause", json={"reason": "bench"})).raise_for_status()
        await trio.sleep(3 * self.interval)  # every member revokes everything
        (await self.admin.post(self.group + "/resume", json={})).raise_for_status()
        return {"settledAfterS": await self.settle("after a resume")}

    async def forced_reset(self) -> dict[str, Any]:
        body = {"to": "latest", "dryRun": False, "force": True}
        started = time.monotonic()
        (await self.admin.post(self.group + "/reset", json=body)).raise_for_status()
        reset_s = round(time.monotonic() - started, 2)
        return {"resetSeconds": reset_s, "settledAfterS": await self.settle("after a reset")}


def run_shape(args: argparse.Namespace, shape: str) -> dict[str, Any]:
    port = redis_servers.free_port()
    url = f"http://127.0.0.1:{port}"
    with redis_servers.standalone() as redis_url, tempfile.TemporaryDirectory():
        env = {
            "RSC_REDIS_URL": redis_url,
            "RSC_HEARTBEAT_INTERVAL_MS": str(args.interval_ms),
            "RSC_MEMBER_LEASE_TTL_MS": str(max(10_000, 4 * args.interval_ms)),
            "RSC_DEFAULT_SHARD_COUNT": str(args.shards),
            "RSC_LOG_LEVEL": "warning",
            "RSC_ADMIN_USER": ADMIN[0],
            "RSC_ADMIN_PASSWORD": ADMIN[1],
        }
        cmd = [sys.executable, *os.environ.get("CHURN_PY_ARGS", "").split(), "-m", "rsc", "serve"]
        with process([*cmd, "--bind", f"127.0.0.1:{port}"], env, url + "/healthz") as proc:
            return trio.run(Driver(args, shape, url, proc.pid).run)


def print_shape(shape: str, result: dict[str, Any]) -> None:
    header = (
        f"{'phase':<8} {'sizes':>7} {'batches':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'coord CPU':>10} {'server p50/p99 <=':>18}  refusals"
    )
    print(f"\n{shape}: settled in {result['settleSeconds']} s\n{header}\n{'-' * len(header)}")
    for phase in ("quiet", "churn", "pause", "reset"):
        row = result.get(phase)
        if row is None:
            continue
        refusals = ", ".join(f"{code} {n}" for code, n in sorted(row["refusals"].items())) or "none"
        print(
            f"{phase:<8} {'all':>7} {row['batches']:>8} {row['p50Ms']:>8} {row['p99Ms']:>8} "
            f"{row['maxMs']:>8} {row['coordinatorCpu']:>10.0%} "
            f"{str(row['serverP50MsAtMost']) + ' / ' + str(row['serverP99MsAtMost']):>18}  {refusals}"
        )
        for label, sized in row["bySize"].items():
            print(
                f"{'':<8} {label:>7} {sized['batches']:>8} {sized['p50Ms']:>8} {sized['p99Ms']:>8} "
                f"{sized['maxMs']:>8}"
            )
    members = result["membersAtEnd"]
    print(
        f"members after the churn: {members['agents']} (agents), {members['coordinator']} (coordinator), "
        f"expected {members['expected']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--shards", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--leaves", type=int, default=10, help="leaves per second")
    parser.add_argument("--joins", type=int, default=10, help="joins per second")
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--settle-timeout", type=float, default=120.0)
    parser.add_argument("--shape", choices=[*SHAPES, "both"], default="both")
    parser.add_argument("--no-storms", dest="storms", action="store_false", help="skip pause and reset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--spread",
        type=float,
        default=1.0,
        help="interval shape: how much of the interval the agents' batches are spread over "
        "(1: evenly, as workers started apart; 0: every agent sends at the same moment)",
    )
    args = parser.parse_args()
    shapes = SHAPES if args.shape == "both" else (args.shape,)
    print(
        f"{args.members} members in batches of {args.batch}, {args.shards} shards, heartbeat every "
        f"{args.interval_ms} ms; churn {args.leaves} leaves + {args.joins} joins per second "
        f"for {args.seconds:g} s"
    )
    results = {shape: run_shape(args, shape) for shape in shapes}
    for shape, result in results.items():
        print_shape(shape, result)
    headline = results[shapes[0]]["churn"]
    verdict = (
        "goal met"
        if headline["p99Ms"] < GOAL_P99_MS
        else "floor met"
        if headline["p99Ms"] < FLOOR_P99_MS
        else "MISSED"
    )
    print(f"\n{shapes[0]} churn batch p99 {headline['p99Ms']} ms: goal < {GOAL_P99_MS:g} ms ({verdict})")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "churn",
        "python": platform.python_version(),
        "args": vars(args),
        "goalP99Ms": GOAL_P99_MS,
        "floorP99Ms": FLOOR_P99_MS,
        "churn": headline,
        "shapes": results,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
