"""Benchmark: heartbeats per second through `rsc serve`, next to raw hypercorn-trio ASGI.

Starts a private redis-server, the coordinator (`python -m rsc serve`) and a
minimal raw ASGI app on hypercorn-trio, each in its own process, then drives
them from this process with httpx on trio over loopback:

* raw ASGI: POST of a small JSON body answered with a small JSON body;
* single heartbeats: steady members (each echoes its epoch), one per request;
* batched heartbeats: 100 members per `POST /v1/heartbeats`;
* latency at half of the single-heartbeat maximum (paced requests).

The load generator shares the machine's cores with the servers, so absolute
figures are a floor; the ratio single / raw is the figure to watch.

NOT YET TRUSTWORTHY: on the 2-core CI machine one httpx client process
saturates first (raw ASGI measured only about 300 requests/s with p50 near
80 ms), so every row measures the client. It needs a load generator that is
not the bottleneck (several client processes, or wrk) before its figures
mean anything.
Prints a table and writes bench/results/heartbeat.json.

    python bench/heartbeat.py [--seconds 5] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import redis_servers

RESULTS = Path(__file__).parent / "results" / "heartbeat.json"
RAW_APP = """
import json
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    out = json.dumps({"status": "OK", "echo": len(body)}).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})
"""


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str], url: str) -> Iterator[None]:
    proc = subprocess.Popen(
        args, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(url, timeout=1)
                break
            time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def heartbeat(member: str, epoch: int, stream: str = "bench") -> dict[str, Any]:
    return {
        "protocolVersion": 1,
        "streamPrefix": stream,
        "consumerGroup": "bench",
        "memberId": member,
        "incarnation": "bench",
        "memberEpoch": epoch,
        "metadataVersion": 1,
    }


async def load(
    client: httpx.AsyncClient, make: Any, seconds: float, concurrency: int, pace: float | None = None
) -> dict[str, Any]:
    """Send requests built by `make(worker)` for `seconds`; `pace`: requests per second in total."""
    latencies: list[float] = []
    deadline = trio.current_time() + seconds

    async def worker(index: int) -> None:
        next_at = trio.current_time()
        while trio.current_time() < deadline:
            if pace:
                next_at += concurrency / pace
                await trio.sleep_until(next_at)
            path, body = make(index)
            started = time.perf_counter()
            response = await client.post(path, json=body)
            latencies.append(time.perf_counter() - started)
            response.raise_for_status()

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for index in range(concurrency):
            nursery.start_soon(worker, index)
    elapsed = trio.current_time() - started
    ordered = sorted(latencies)
    return {
        "requests": len(latencies),
        "requestsPerSecond": round(len(latencies) / elapsed),
        "p50Ms": round(statistics.median(ordered) * 1000, 2),
        "p99Ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000, 2),
    }


async def run(args: argparse.Namespace, raw_url: str, rsc_url: str) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    results: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=raw_url, limits=limits, timeout=30) as raw:
        results["raw"] = await load(
            raw, lambda i: ("/", heartbeat(f"m{i}", 1)), args.seconds, args.concurrency
        )
    async with httpx.AsyncClient(base_url=rsc_url, limits=limits, timeout=30) as client:
        members = [f"10.8.0.{i}/bench/0" for i in range(args.concurrency)]
        epochs = {}
        for member in members:  # join once; afterwards every heartbeat is steady
            response = await client.post("/v1/heartbeat", json=heartbeat(member, 0))
            epochs[member] = response.json()["memberEpoch"]
        for member in members:
            response = await client.post("/v1/heartbeat", json=heartbeat(member, epochs[member]))
            epochs[member] = response.json()["memberEpoch"]
        single = await load(
            client,
            lambda i: ("/v1/heartbeat", heartbeat(members[i], epochs[members[i]])),
            args.seconds,
            args.concurrency,
        )
        results["single"] = single
        batch_members = [f"10.9.{i // 256}.{i % 256}/bench/0" for i in range(100 * args.concurrency)]
        batch_epochs: dict[str, int] = {}
        for start in range(0, len(batch_members), 100):
            chunk = batch_members[start : start + 100]
            for epoch_round in range(2):
                body = {"heartbeats": [heartbeat(m, batch_epochs.get(m, 0), "bench-batch") for m in chunk]}
                response = await client.post("/v1/heartbeats", json=body)
                for m, r in zip(chunk, response.json()["responses"], strict=True):
                    batch_epochs[m] = r["memberEpoch"]
                del epoch_round

        def batch(i: int) -> tuple[str, dict[str, Any]]:
            chunk = batch_members[i * 100 : (i + 1) * 100]
            return "/v1/heartbeats", {
                "heartbeats": [heartbeat(m, batch_epochs[m], "bench-batch") for m in chunk]
            }

        batched = await load(client, batch, args.seconds, args.concurrency)
        batched["memberHeartbeatsPerSecond"] = batched["requestsPerSecond"] * 100
        results["batch"] = batched
        half = single["requestsPerSecond"] / 2
        results["singleAtHalfRate"] = await load(
            client,
            lambda i: ("/v1/heartbeat", heartbeat(members[i], epochs[members[i]])),
            args.seconds,
            args.concurrency,
            pace=half,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    raw_port = redis_servers.free_port()
    rsc_port = redis_servers.free_port()
    with redis_servers.standalone() as redis_url, tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "rawapp.py").write_text(RAW_APP)
        raw_cmd = [
            sys.executable,
            "-m",
            "hypercorn",
            "-k",
            "trio",
            "-b",
            f"127.0.0.1:{raw_port}",
            "rawapp:app",
        ]
        rsc_cmd = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{rsc_port}"]
        raw_url, rsc_url = f"http://127.0.0.1:{raw_port}", f"http://127.0.0.1:{rsc_port}"
        env_raw = {"PYTHONPATH": tmp}
        env_rsc = {
            "RSC_REDIS_URL": redis_url,
            "RSC_HEARTBEAT_INTERVAL_MS": "3000",
            "RSC_MEMBER_LEASE_TTL_MS": "60000",
        }
        with process(raw_cmd, env_raw, raw_url + "/"), process(rsc_cmd, env_rsc, rsc_url + "/healthz"):
            results = trio.run(run, args, raw_url, rsc_url)
    ratio = results["single"]["requestsPerSecond"] / results["raw"]["requestsPerSecond"]
    capacity = results["batch"]["memberHeartbeatsPerSecond"] * 3
    print(f"{args.concurrency} requests in flight, {args.seconds:g} s each\n")
    header = f"{'run':<34} {'req/s':>8} {'member hb/s':>12} {'p50 ms':>8} {'p99 ms':>8}"
    print(header)
    print("-" * len(header))
    for name, key in [
        ("raw hypercorn-trio ASGI", "raw"),
        ("single heartbeats", "single"),
        ("batched heartbeats (100/request)", "batch"),
        ("single at half the max rate", "singleAtHalfRate"),
    ]:
        r = results[key]
        per = r.get("memberHeartbeatsPerSecond", r["requestsPerSecond"] if key != "raw" else "-")
        print(f"{name:<34} {r['requestsPerSecond']:>8} {per:>12} {r['p50Ms']:>8} {r['p99Ms']:>8}")
    print(f"\nsingle / raw ASGI: {ratio:.0%} (target >= 60%)")
    print(f"batched: {results['batch']['memberHeartbeatsPerSecond']} member-heartbeats/s (target >= 20,000)")
    print(f"members one coordinator carries at a 3 s interval (batched): about {capacity:,}")
    print(f"p99 at half the max single rate: {results['singleAtHalfRate']['p99Ms']} ms (target < 50 ms)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "heartbeat",
        "python": platform.python_version(),
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "results": results,
        "singleToRawRatio": round(ratio, 3),
        "membersAt3sInterval": capacity,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
