"""Benchmark: the envelope of one coordinator, many members over many streams.

Starts a private redis-server, the active coordinator and a hot standby (`python -m rsc
serve`, each its own process), then `--drivers` driver processes that share `--members`
members (default 100,000) over `--streams` streams (default 10,000; one group each). Each
driver heartbeats its members in batches of `--batch` (`POST /v1/heartbeats`) every
`--interval-ms`: first the joins (which create the streams and groups), then steady
heartbeats (each member echoes its epoch). Reported:

* setup: how long the joins took (streams and groups created on the way), then how long
  until the groups settled (a whole round in which no member's epoch or shards moved; the
  members report what they read, as members do);
* steady state over `--seconds`: member-heartbeats per second, batch p50/p99 as the drivers
  saw them, the coordinator's CPU and RSS, memory per member;
* Redis: keys and memory used (journals, snapshots, checkpoints, shard keys, owner tokens);
* recovery: the active coordinator restarted (SIGTERM, then a new process on the same port,
  the standby still waiting): seconds until every driver's batch is answered again;
* takeover: the active coordinator killed (SIGKILL): seconds until the standby answers every
  driver's batch.

Prints a table and writes bench/results/scale.json.

    python bench/scale.py [--members 100000] [--streams 10000] [--drivers 4] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._results import results_path
from bench.churn import cpu_seconds, percentile
from tests import redis_servers

RESULTS = results_path("scale.json")
LOG = RESULTS.with_name("scale-coordinators.log")
GROUP = "scale"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_coordinator(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`rsc serve` on `port`; its log (warnings and up: term ends, lease losses) is appended to
    bench/results/scale-coordinators.log."""
    args = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("ab") as log:
        return subprocess.Popen(args, env={**os.environ, **env}, stdout=log, stderr=log)


def wait_ready(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url} did not become ready in {timeout_s} s")


def driver(number: int, args: argparse.Namespace, urls: list[str], control: Any, results: Any) -> None:  # noqa: PLR0915
    """One driver process: members `number::drivers` of every stream's members."""
    import trio  # each process its own trio run

    members = [
        (f"scale-{s:05}", f"10.{number}.{m // 250}.{m % 250}/scale/{s}-{m}")
        for s in range(number, args.streams, args.drivers)
        for m in range(args.members // args.streams)
    ]
    epochs = dict.fromkeys((m for _, m in members), 0)
    # What each member last heard, as a member keeps it: the layout version, and the shards
    # it reads (it installs what it is assigned at once and stops a revoked one at once).
    versions = dict.fromkeys(epochs, 0)
    owned: dict[str, list[int]] = {m: [] for m in epochs}

    def body(stream: str, member: str) -> dict[str, Any]:
        return {
            "protocolVersion": 2,
            "streamPrefix": stream,
            "consumerGroup": GROUP,
            "memberId": member,
            "incarnation": "i1",
            "memberEpoch": epochs[member],
            "metadataVersion": versions[member],
            "ownedShards": owned[member],
        }

    async def run() -> None:
        url = urls[0]
        latencies: list[tuple[float, float]] = []  # (when, ms)
        beats = 0
        async with httpx.AsyncClient(timeout=60) as client:
            round_ = 0
            while True:
                command = control.get("command")
                if command == "stop":
                    break
                if command == "switch":
                    url = urls[1]
                started_round = time.monotonic()
                failed = False
                changed = 0  # members whose epoch or assignment moved this round
                for at in range(0, len(members), args.batch):
                    chunk = members[at : at + args.batch]
                    sent = time.perf_counter()
                    try:
                        answer = await client.post(
                            url + "/v1/heartbeats", json={"heartbeats": [body(s, m) for s, m in chunk]}
                        )
                    except httpx.HTTPError:
                        failed = True
                        continue
                    if answer.status_code != 200:
                        failed = True
                        continue
                    latencies.append((time.time(), (time.perf_counter() - sent) * 1000))
                    for (_, member), item in zip(chunk, answer.json()["responses"], strict=True):
                        if item.get("status") in ("FENCED", "UNKNOWN_MEMBER"):
                            epochs[member] = 0  # as a member does: join again
                            versions[member], owned[member] = 0, []
                            failed = True
                        elif "memberEpoch" in item:
                            assigned = item["assignment"]["assigned"]
                            changed += epochs[member] != item["memberEpoch"] or owned[member] != assigned
                            epochs[member] = max(0, item["memberEpoch"])
                            versions[member] = item.get("metadataVersion", versions[member])
                            owned[member] = assigned
                            beats += 1
                        else:
                            failed = True
                    results[f"beats-{number}"] = beats  # after every batch: a rate over any window
                if not failed:
                    results[f"ok-{number}"] = time.time()
                    if not changed:  # a whole round in which no member's epoch or shards moved
                        results[f"settled-{number}"] = time.time()
                results[f"latencies-{number}"] = latencies[-20_000:]
                round_ += 1
                left = args.interval_ms / 1000 - (time.monotonic() - started_round)
                await trio.sleep(max(0.0, left))

    trio.run(run)


def main() -> None:  # noqa: PLR0915  (a scenario read top to bottom)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=100_000)
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--drivers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--interval-ms", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    ports = [redis_servers.free_port(), redis_servers.free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    report: dict[str, Any] = {"benchmark": "scale", "python": platform.python_version(), "args": vars(args)}
    with redis_servers.standalone() as redis_url, multiprocessing.Manager() as manager:
        env = {
            "RSC_REDIS_URL": redis_url,
            "RSC_HEARTBEAT_INTERVAL_MS": str(args.interval_ms),
            "RSC_MEMBER_LEASE_TTL_MS": str(3 * args.interval_ms),
            "RSC_RATE_LIMIT_HEARTBEATS_PER_S": "0",
            "RSC_MAX_CONNECTIONS": "10000",
            "RSC_LOG_LEVEL": "warning",
        }
        active = start_coordinator(ports[0], {**env, "RSC_ADVERTISE_URL": urls[0]})
        wait_ready(urls[0])
        control, results = manager.dict(), manager.dict()
        drivers = [
            multiprocessing.Process(target=driver, args=(n, args, urls, control, results))
            for n in range(args.drivers)
        ]
        started = time.monotonic()
        for process in drivers:
            process.start()

        def all_answered_since(t: float) -> bool:
            return all(results.get(f"ok-{n}", 0) > t for n in range(args.drivers))

        while not all_answered_since(0):
            time.sleep(0.5)
        report["setupSeconds"] = round(time.monotonic() - started, 1)
        print(f"joined: {args.members:,} members over {args.streams:,} streams in {report['setupSeconds']} s")
        # Settled: every driver had a whole round in which no member's epoch or shards moved
        # (the groups converged: targets installed, revokes acknowledged). Measured from the end
        # of the joins; the steady phase is measured after it (or after the limit, if never).
        joined = time.time()
        limit = joined + 30 * args.interval_ms / 1000 + 120
        while time.time() < limit and not all(
            results.get(f"settled-{n}", 0) > joined for n in range(args.drivers)
        ):
            time.sleep(0.5)
        settled = all(results.get(f"settled-{n}", 0) > joined for n in range(args.drivers))
        report["settleSeconds"] = round(time.time() - joined, 1) if settled else None
        print("settled:", f"in {report['settleSeconds']} s" if settled else "not within the limit")
        beats0 = sum(results.get(f"beats-{n}", 0) for n in range(args.drivers))
        cpu0, wall0, since = cpu_seconds(active.pid), time.monotonic(), time.time()
        time.sleep(args.seconds)
        wall = time.monotonic() - wall0
        beats = sum(results.get(f"beats-{n}", 0) for n in range(args.drivers)) - beats0
        latencies = [
            ms for n in range(args.drivers) for at, ms in results.get(f"latencies-{n}", []) if at >= since
        ]
        with redis.Redis.from_url(redis_url) as r:
            memory = r.info("memory")
            keys = r.dbsize()
        rss = rss_mb(active.pid)
        report["steady"] = {
            "memberHeartbeatsPerSecond": round(beats / wall),
            "batchP50Ms": round(percentile(latencies, 0.5), 1),
            "batchP99Ms": round(percentile(latencies, 0.99), 1),
            "coordinatorCpu": round((cpu_seconds(active.pid) - cpu0) / wall, 3),
            "coordinatorRssMb": round(rss, 1),
            "rssKbPerMember": round(rss * 1024 / args.members, 2),
            "redisUsedMb": round(memory["used_memory"] / 2**20, 1),
            "redisKeys": keys,
            "redisKbPerMember": round(memory["used_memory"] / 1024 / args.members, 2),
        }
        print("steady:", report["steady"])
        # Recovery: the coordinator restarted on its port (it releases its lease on the way out;
        # the new process loads every aggregate it is asked for again).
        active.send_signal(signal.SIGTERM)
        active.wait(timeout=60)
        stopped = time.time()
        active = start_coordinator(ports[0], {**env, "RSC_ADVERTISE_URL": urls[0]})
        while not all_answered_since(stopped):
            time.sleep(0.1)
            if time.time() - stopped > 300:
                raise SystemExit("no recovery within 300 s")
        report["restartSeconds"] = round(time.time() - stopped, 2)
        print(f"restart: every driver answered again {report['restartSeconds']} s after SIGTERM")
        # Takeover: a hot standby waits; the active one is killed (its lease runs out, the
        # standby takes it); the drivers ask the standby from then on.
        standby = start_coordinator(ports[1], {**env, "RSC_ADVERTISE_URL": urls[1]})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(urls[1] + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        time.sleep(2)  # it has looked at the lease and waits
        killed_at = time.time()
        active.send_signal(signal.SIGKILL)
        active.wait()
        control["command"] = "switch"
        while not all_answered_since(killed_at):
            time.sleep(0.05)
            if time.time() - killed_at > 300:
                raise SystemExit("no takeover within 300 s")
        report["takeoverSeconds"] = round(time.time() - killed_at, 2)
        print(f"takeover: every driver answered by the standby {report['takeoverSeconds']} s after SIGKILL")
        control["command"] = "stop"
        for process in drivers:
            process.join(timeout=60)
        for proc in (active, standby):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    steady = report["steady"]
    print(
        f"\n{args.members:,} members, {args.streams:,} streams, a heartbeat every {args.interval_ms} ms:\n"
        f"  {steady['memberHeartbeatsPerSecond']:,} member-heartbeats/s, batch p50 {steady['batchP50Ms']} ms "
        f"p99 {steady['batchP99Ms']} ms, coordinator CPU {steady['coordinatorCpu']:.0%}, RSS "
        f"{steady['coordinatorRssMb']} MB ({steady['rssKbPerMember']} KB per member), Redis "
        f"{steady['redisUsedMb']} MB in {steady['redisKeys']:,} keys\n"
        f"  joined in {report['setupSeconds']} s, settled "
        f"{'in ' + str(report['settleSeconds']) + ' s' if report['settleSeconds'] is not None else 'never'}; "
        f"restart {report['restartSeconds']} s, standby takeover {report['takeoverSeconds']} s"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
