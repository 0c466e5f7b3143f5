"""Benchmark: commands per second through one group actor on real Redis.

100 members (tasks) keep one heartbeat each in flight against one group
actor. Every command changes the group (the members join and leave over and
over), so every command has events to persist. Two modes:

* group commit: the actor persists everything waiting in its inbox with one
  write (the default);
* one write per command: `max_batch = 1`.

A third row shows steady heartbeats (no durable change, so no write at all)
for scale. Starts a private redis-server on a free port unless --redis-url
is given. Prints a table and writes bench/results/persistence.json.

    python bench/persistence.py [--members 100] [--seconds 5] [--rounds 3] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._results import results_path
from rsc.actors.actor import ActorSettings
from rsc.actors.clock import WallClock
from rsc.actors.effects.redis_effects import RedisEffects
from rsc.actors.redis_store import RedisStore
from rsc.actors.registry import Registry, RegistrySettings, open_registry
from rsc.actors.store_connection import open_redis
from rsc.events.commands import Heartbeat
from rsc.events.model import Member, Timing
from tests import redis_servers

RESULTS = results_path("persistence.json")
TIMING = Timing(heartbeat_interval_ms=3_000, lease_ttl_ms=60_000, revoke_timeout_ms=60_000)


@contextlib.contextmanager
def redis_url(given: str | None) -> Iterator[str]:
    if given:
        yield given
        return
    with redis_servers.standalone() as url:
        yield url


def next_epoch(epoch: int, member: Member | None, churn: bool) -> int:
    """Churn: join, leave, join, ...; steady: heartbeat with the epoch received."""
    if churn:
        return -1 if epoch == 0 else 0
    return member.member_epoch if member is not None else 0


async def drive(registry: Registry, stream: str, members: int, seconds: float, churn: bool) -> dict[str, Any]:
    """Run `members` tasks for `seconds`, each with one command in flight; return figures."""
    latencies: list[float] = []
    deadline = trio.current_time() + seconds
    clock = registry.clock

    async def member(i: int) -> None:
        member_id = f"10.9.{i // 256}.{i % 256}/bench/0"
        epoch = 0
        while trio.current_time() < deadline:
            command = Heartbeat(member_id, "inc", epoch, clock.now_ms())
            started = time.perf_counter()
            reply = await registry.ask_group(stream, "bench", command)
            latencies.append(time.perf_counter() - started)
            epoch = next_epoch(epoch, reply.state.members.get(member_id), churn)

    actor = await registry.group(stream, "bench")
    writes_before = actor.writes
    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i in range(members):
            nursery.start_soon(member, i)
    elapsed = trio.current_time() - started
    writes = actor.writes - writes_before
    ordered = sorted(latencies)
    return {
        "commands": len(latencies),
        "seconds": round(elapsed, 2),
        "commandsPerSecond": round(len(latencies) / elapsed),
        "writes": writes,
        "commandsPerWrite": round(len(latencies) / writes, 1) if writes else None,
        "p50Ms": round(statistics.median(ordered) * 1000, 2),
        "p99Ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2),
    }


async def run_mode(url: str, members: int, seconds: float, max_batch: int, churn: bool) -> dict[str, Any]:
    settings = RegistrySettings(
        timing=TIMING,
        default_shard_count=16,
        idle_after_s=float("inf"),
        actor=ActorSettings(max_batch=max_batch, tick_interval_s=1.0, checkpoint_every=1_000),
    )
    async with open_redis(url) as redis:
        store = RedisStore(redis, retention=100_000)
        async with open_registry(store, RedisEffects(redis), WallClock(), settings) as registry:
            return await drive(registry, f"bench{uuid.uuid4().hex[:8]}", members, seconds, churn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode; the median is reported")
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    modes = [
        ("group commit", 256, True),
        ("one write per command", 1, True),
        ("steady heartbeats (no writes)", 256, False),
    ]
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in modes}
    with redis_url(args.redis_url) as url:
        for _ in range(args.rounds):  # alternate the modes so that machine noise hits them alike
            for name, max_batch, churn in modes:
                row = trio.run(run_mode, url, args.members, args.seconds, max_batch, churn)
                samples[name].append({"mode": name, "maxBatch": max_batch, **row})
    # the median round of each mode, by commands per second
    rows = [sorted(s, key=lambda r: r["commandsPerSecond"])[len(s) // 2] for s in samples.values()]
    ratio = rows[0]["commandsPerSecond"] / rows[1]["commandsPerSecond"]
    header = f"{'mode':<30} {'cmd/s':>8} {'writes':>7} {'cmd/write':>9} {'p50 ms':>7} {'p99 ms':>7}"
    print(f"{args.members} commands in flight, {args.seconds:g} s a round, median of {args.rounds} rounds\n")
    print(header)
    print("-" * len(header))
    for r in rows:
        per_write = "-" if r["commandsPerWrite"] is None else r["commandsPerWrite"]
        print(
            f"{r['mode']:<30} {r['commandsPerSecond']:>8} {r['writes']:>7} {per_write:>9} "
            f"{r['p50Ms']:>7} {r['p99Ms']:>7}"
        )
    print(f"\ngroup commit / one write per command: {ratio:.1f}x (target: at least 5x)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "persistence",
        "python": platform.python_version(),
        "members": args.members,
        "secondsPerRound": args.seconds,
        "rounds": args.rounds,
        "samples": samples,
        "rows": rows,
        "groupCommitSpeedup": round(ratio, 2),
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
