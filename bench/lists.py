"""Benchmark: stream creation per second, and listing streams whole and in pages, as the
number of streams grows.

Starts a private redis-server and the coordinator (`python -m rsc serve`), creates streams
with `PUT /v1/admin/streams/{prefix}` from `--connections` connections at once, and after
each step of `--step` streams times `GET /v1/streams` (the whole list, no `limit`) and one
page of 100 from the middle (`limit=100` with a cursor). Linear means: the whole list's time
per stream stays flat as the count grows, and a page's time does not grow at all. Then it
creates `--heartbeat-streams` more the way members do (issue 30's figure): first heartbeats
naming new streams, in batches of 100 (`POST /v1/heartbeats`, each item a new member of a new
stream's group: the stream, its group and the join), from `--heartbeat-connections`
connections. Prints a table and writes bench/results/lists.json.

    python bench/lists.py [--streams 10000] [--step 2500] [--connections 8]
                          [--heartbeat-streams 3000] [--heartbeat-connections 4]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._results import results_path
from bench.heartbeat import heartbeat, process
from tests import redis_servers

RESULTS = results_path("lists.json")
AUTH = ("admin", "bench-admin-password")
CREATION_GOAL_PER_S, PAGE_GOAL_MS = 500.0, 100.0


async def create(url: str, names: list[str], connections: int) -> float:
    """Create `names`; streams per second."""
    todo = iter(names)
    started = time.perf_counter()

    async def worker() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60, auth=AUTH) as client:
            for name in todo:
                answer = await client.put(f"/v1/admin/streams/{name}", json={"shardCount": 1})
                answer.raise_for_status()

    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(worker)
    return len(names) / (time.perf_counter() - started)


async def create_by_heartbeats(url: str, names: list[str], connections: int) -> tuple[float, float]:
    """Create `names` by first heartbeats, 100 to a batch; streams per second, slowest batch (s)."""
    todo = iter([names[i : i + 100] for i in range(0, len(names), 100)])
    slowest = 0.0
    started = time.perf_counter()

    async def worker() -> None:
        nonlocal slowest
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            for chunk in todo:
                sent = time.perf_counter()
                body = {"heartbeats": [heartbeat(f"10.7.0.1/{name}/0", 0, name) for name in chunk]}
                answer = await client.post("/v1/heartbeats", json=body)
                answer.raise_for_status()
                refused = [item for item in answer.json()["responses"] if "error" in item]
                assert not refused, refused[:3]
                slowest = max(slowest, time.perf_counter() - sent)

    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(worker)
    return len(names) / (time.perf_counter() - started), slowest


async def timed_get(client: httpx.AsyncClient, path: str, repeat: int = 3) -> tuple[float, Any]:
    samples, body = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        answer = await client.get(path)
        samples.append((time.perf_counter() - started) * 1000)
        answer.raise_for_status()
        body = answer.json()
    return statistics.median(samples), body


async def drive(args: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    rows = []
    made = 0
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        while made < args.streams:
            names = [f"list-{i:06}" for i in range(made, min(args.streams, made + args.step))]
            rate = await create(url, names, args.connections)
            made += len(names)
            whole_ms, whole = await timed_get(client, "/v1/streams")
            assert len(whole["streams"]) == made, (len(whole["streams"]), made)
            middle = whole["streams"][made // 2]["streamPrefix"]
            first_ms, first = await timed_get(client, f"/v1/streams?limit=100&cursor={cursor_after(middle)}")
            assert len(first["streams"]) == min(100, made - made // 2 - 1)
            rows.append(
                {
                    "streams": made,
                    "createdPerSecond": round(rate),
                    "wholeListMs": round(whole_ms, 1),
                    "wholeListUsPerStream": round(whole_ms * 1000 / made, 1),
                    "pageOf100Ms": round(first_ms, 1),
                }
            )
            print(rows[-1], flush=True)
    if args.heartbeat_streams:
        names = [f"hb-{i:06}" for i in range(args.heartbeat_streams)]
        rate, slowest = await create_by_heartbeats(url, names, args.heartbeat_connections)
        rows.append(
            {
                "streams": made + len(names),
                "byHeartbeats": len(names),
                "createdPerSecond": round(rate),
                "slowestBatchS": round(slowest, 2),
            }
        )
        print(rows[-1], flush=True)
    return rows


def cursor_after(prefix: str) -> str:
    """A cursor after `prefix` (the server's own encoding, as `nextCursor` would carry it)."""
    from rsc.http.paging import encode_cursor

    return encode_cursor("streams", prefix)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--step", type=int, default=2_500)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--heartbeat-streams", type=int, default=3_000)
    parser.add_argument("--heartbeat-connections", type=int, default=4)
    args = parser.parse_args()
    port = redis_servers.free_port()
    url = f"http://127.0.0.1:{port}"
    with redis_servers.standalone() as redis_url:
        env = {
            "RSC_REDIS_URL": redis_url,
            "RSC_ADMIN_PASSWORD": AUTH[1],
            "RSC_RATE_LIMIT_ADMIN_WRITES_PER_S": "0",
            "RSC_RATE_LIMIT_PARTY_PER_INTERVAL": "0",
            "RSC_LOG_LEVEL": "warning",
        }
        cmd = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
        with process(cmd, env, url + "/healthz"):
            rows = trio.run(drive, args, url)
    header = (
        f"{'streams':>8} {'created/s':>10} {'whole list ms':>14} {'us/stream':>10} {'page of 100 ms':>15}"
    )
    print("\n" + header)
    print("-" * len(header))
    listed = [r for r in rows if "byHeartbeats" not in r]
    for r in listed:
        print(
            f"{r['streams']:>8} {r['createdPerSecond']:>10} {r['wholeListMs']:>14} "
            f"{r['wholeListUsPerStream']:>10} {r['pageOf100Ms']:>12}"
        )
    last = listed[-1]
    print(
        f"\ncreation by admin PUT {last['createdPerSecond']}/s (goal >= {CREATION_GOAL_PER_S:g}/s); "
        f"a page of 100 at {last['streams']:,} streams {last['pageOf100Ms']} ms "
        f"(goal < {PAGE_GOAL_MS:g} ms); the whole list {last['wholeListUsPerStream']} us per stream "
        f"at {last['streams']:,} vs "
        f"{listed[0]['wholeListUsPerStream']} at {listed[0]['streams']:,} (linear: flat)"
    )
    for r in rows:
        if "byHeartbeats" in r:
            print(
                f"creation by first heartbeats (batches of 100, {args.heartbeat_connections} connections): "
                f"{r['createdPerSecond']}/s over {r['byHeartbeats']:,} streams, slowest batch "
                f"{r['slowestBatchS']} s (goal >= {CREATION_GOAL_PER_S:g}/s)"
            )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {"benchmark": "lists", "python": platform.python_version(), "args": vars(args), "rows": rows}
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
