"""Benchmark: batched heartbeats while a large group churns.

Starts a private redis-server and the coordinator (`python -m rsc serve`, its
own process), then drives `--members` members (default 1,000) of one group on
a `--shards`-shard stream (default 1,024) from this process: the members live
in `--members / --batch` agents of `--batch` members (default 100), as a
worker process hosting many members would, and each agent sends the
heartbeats of its members that are due in one `POST /v1/heartbeats`. Every
member is the shipped member machine (`rsc.events.member_machine`): it
acknowledges revokes at once, leaves gracefully (handing its shards over),
and rejoins when fenced. Long polls are off: every batch is answered at once,
so its latency is the coordinator's cost.

Once the group is stable, `--leaves` members leave and `--joins` new members
join every second (default 10 and 10) for `--seconds` (default 20). Reported:
the latency of every batch during the churn (p50/p99/max), the coordinator's
CPU (its process's user+system time over wall time), and the same figures
for a quiet period of the same length before the churn (the anchor: what
steady heartbeats cost). Prints a table and writes bench/results/churn.json.

    python bench/churn.py [--members 1000] [--shards 1024] [--seconds 20]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._results import results_path
from bench.heartbeat import buckets_in, process, server_p99
from rsc.events import codec
from rsc.events.member_machine import MemberMachine, MemberSettings
from rsc.events.model import ClientInfo
from rsc.events.versions import MAX_FEATURE_LEVEL
from rsc.events.wire import HeartbeatResponse
from tests import redis_servers

RESULTS = results_path("churn.json")
CLIENT = ClientInfo("rsc-bench-churn", "1", MAX_FEATURE_LEVEL)
STREAM, GROUP = "churn", "churn"
GOAL_P99_MS, FLOOR_P99_MS = 50.0, 200.0
LINGER_S = 0.005  # what the Python client's batching transport waits for more members


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


class Agent:
    """A process hosting `members`: one batch per round carries every member that is due."""

    def __init__(self, client: httpx.AsyncClient, settings: MemberSettings) -> None:
        self.client = client
        self.settings = settings
        self.members: dict[str, MemberMachine] = {}
        self.latencies_ms: list[float] = []
        self.response_bytes: list[int] = []
        self.errors: collections.Counter[str] = collections.Counter()

        #: Set when a member of this agent has something to say at once (a join, a leave).
        self.wake = trio.Event()

    def add(self, member_id: str) -> None:
        self.members[member_id] = MemberMachine(STREAM, GROUP, member_id, "i1", CLIENT, self.settings)
        self.wake.set()

    def stop_one(self, machine: MemberMachine) -> None:
        machine.stop()
        self.wake.set()

    async def run(self, stop: trio.Event) -> None:
        while not stop.is_set():
            now = time.monotonic()
            when = {m: m.next_heartbeat_at(now) for m in self.members.values()}
            due = [m for m, at in when.items() if at <= now]
            if not due:  # sleep until the next one is due, or a join or leave wakes it
                self.wake = trio.Event()
                with trio.move_on_after(min(when.values(), default=now + 1) - now):
                    await self.wake.wait()
                continue
            # As `rsc.client.batching` does: linger for the others due at about the same time.
            await trio.sleep(LINGER_S)
            now = time.monotonic()
            due = [m for m in self.members.values() if m.next_heartbeat_at(now) <= now]
            requests = [m.request(now) for m in due]
            body = {"heartbeats": [codec.wire.unstructure(r) for r in requests]}
            started = time.perf_counter()
            try:
                answer = await self.client.post("/v1/heartbeats", json=body)
                answer.raise_for_status()
                items = answer.json()["responses"]
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                self.errors[type(exc).__name__] += 1
                for machine, request in zip(due, requests, strict=True):
                    machine.failed(request, time.monotonic(), str(exc))
                continue
            self.latencies_ms.append((time.perf_counter() - started) * 1000)
            self.response_bytes.append(len(answer.content))
            now = time.monotonic()
            for machine, request, item in zip(due, requests, items, strict=True):
                if "error" in item:
                    self.errors[str(item["error"])] += 1
                    machine.failed(request, now, str(item["error"]))
                    continue
                steps = machine.receive(request, codec.wire.structure(item, HeartbeatResponse), now)
                if steps.stop:  # the handler finishes at once: acknowledge in the next batch
                    machine.revoked(steps.stop)
            for member_id in [m for m, machine in self.members.items() if machine.left]:
                del self.members[member_id]

    def settled(self) -> bool:
        return all(
            not m.pending and not m.revoking and not m.to_ack and m.owned for m in self.members.values()
        )


def figures(agents: list[Agent]) -> dict[str, Any]:
    """Batch latencies and answer sizes the agents saw."""
    latencies = [ms for agent in agents for ms in agent.latencies_ms]
    sizes = [size for agent in agents for size in agent.response_bytes]
    return {
        "batches": len(latencies),
        "p50Ms": round(percentile(latencies, 0.50), 2),
        "p99Ms": round(percentile(latencies, 0.99), 2),
        "maxMs": round(max(latencies, default=0.0), 2),
        "meanMs": round(statistics.fmean(latencies), 2) if latencies else 0.0,
        "responseBytesMean": round(statistics.fmean(sizes)) if sizes else 0,
        "responseBytesMax": max(sizes, default=0),
    }


async def drive(args: argparse.Namespace, url: str, pid: int) -> dict[str, Any]:
    settings = MemberSettings(long_poll=False, heartbeat_interval_ms=args.interval_ms)
    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=1)
    clients = [
        httpx.AsyncClient(base_url=url, timeout=30, limits=limits) for _ in range(args.members // args.batch)
    ]
    agents = [Agent(client, settings) for client in clients]
    serial = 0
    for number in range(args.members):
        agents[number % len(agents)].add(f"10.1.{number // 250}.{number % 250}/churn/{number}")
        serial = number
    stop = trio.Event()
    result: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        for agent in agents:
            nursery.start_soon(agent.run, stop)
        started = time.monotonic()
        while not all(agent.settled() for agent in agents):
            if time.monotonic() - started > args.settle_timeout:
                raise SystemExit(f"the group did not settle within {args.settle_timeout} s")
            await trio.sleep(0.2)
        result["settleSeconds"] = round(time.monotonic() - started, 2)

        async def phase(churn: bool) -> dict[str, Any]:
            nonlocal serial
            for agent in agents:
                agent.latencies_ms.clear()
                agent.response_bytes.clear()
            before = buckets_in((await clients[0].get("/metrics")).text, "batch")
            cpu0, wall0, own0 = cpu_seconds(pid), time.monotonic(), time.process_time()
            leaves = joins = 0
            step = 1 / max(1, args.leaves + args.joins)
            while time.monotonic() - wall0 < args.seconds:
                await trio.sleep(step)
                if not churn:
                    continue
                if leaves * args.joins <= joins * args.leaves:
                    agent = rng.choice(agents)
                    staying = [m for m in agent.members.values() if not m.leaving]
                    if staying:
                        agent.stop_one(rng.choice(staying))
                        leaves += 1
                else:
                    serial += 1
                    rng.choice(agents).add(f"10.2.{serial // 250}.{serial % 250}/churn/{serial}")
                    joins += 1
            wall = time.monotonic() - wall0
            cpu = cpu_seconds(pid) - cpu0
            after = buckets_in((await clients[0].get("/metrics")).text, "batch")
            return {
                **figures(agents),
                "serverP99MsAtMost": server_p99(before, after),
                "coordinatorCpu": round(cpu / wall, 3),
                "driverCpu": round((time.process_time() - own0) / wall, 3),
                "leaves": leaves,
                "joins": joins,
            }

        result["quiet"] = await phase(churn=False)
        result["churn"] = await phase(churn=True)
        result["errors"] = dict(sum((agent.errors for agent in agents), collections.Counter()))
        result["membersAtEnd"] = sum(len(agent.members) for agent in agents)
        stop.set()
    for client in clients:
        await client.aclose()
    return result


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
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    port = redis_servers.free_port()
    url = f"http://127.0.0.1:{port}"
    with redis_servers.standalone() as redis_url, tempfile.TemporaryDirectory():
        env = {
            "RSC_REDIS_URL": redis_url,
            "RSC_HEARTBEAT_INTERVAL_MS": str(args.interval_ms),
            "RSC_MEMBER_LEASE_TTL_MS": str(max(10_000, 4 * args.interval_ms)),
            "RSC_DEFAULT_SHARD_COUNT": str(args.shards),
            "RSC_LOG_LEVEL": "warning",
        }
        cmd = [
            sys.executable,
            *os.environ.get("CHURN_PY_ARGS", "").split(),
            "-m",
            "rsc",
            "serve",
            "--bind",
            f"127.0.0.1:{port}",
        ]
        with process(cmd, env, url + "/healthz") as proc:
            result = trio.run(drive, args, url, proc.pid)
    churn, quiet = result["churn"], result["quiet"]
    print(
        f"{args.members} members in batches of {args.batch}, {args.shards} shards, heartbeat every "
        f"{args.interval_ms} ms; churn {args.leaves} leaves + {args.joins} joins per second "
        f"for {args.seconds:g} s"
        f" (settled in {result['settleSeconds']} s)\n"
    )
    header = (
        f"{'phase':<16} {'batches':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'server p99 <=':>14} "
        f"{'coordinator CPU':>16} {'driver CPU':>11}"
    )
    print(header)
    print("-" * len(header))
    for name, row in (("quiet (anchor)", quiet), ("churn", churn)):
        print(
            f"{name:<16} {row['batches']:>8} {row['p50Ms']:>8} {row['p99Ms']:>8} {row['maxMs']:>8} "
            f"{row['serverP99MsAtMost']!s:>14} {row['coordinatorCpu']:>16.0%} {row['driverCpu']:>11.0%}"
        )
    verdict = (
        "goal met"
        if churn["p99Ms"] < GOAL_P99_MS
        else "floor met"
        if churn["p99Ms"] < FLOOR_P99_MS
        else "MISSED"
    )
    print(f"\nchurn batch p99 {churn['p99Ms']} ms: goal < {GOAL_P99_MS:g} ms, floor < {FLOOR_P99_MS:g} ms")
    print(f"({verdict}); errors by code: {result['errors']}, members at the end: {result['membersAtEnd']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "churn",
        "python": platform.python_version(),
        "args": vars(args),
        "goalP99Ms": GOAL_P99_MS,
        "floorP99Ms": FLOOR_P99_MS,
        **result,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
