"""Benchmark: what OpenTelemetry costs a producer and a worker's handler path, side by side.

Starts a private redis-server and `rsc serve`, then times the trio producer's `publish_many`
(`--messages` 90-byte messages in batches of `--batch`, 16 shards) in alternating rounds with
tracing **off** (`rsc.tracing.enable(False)`: what an application without the `otel` extra
runs), **on with the API's no-op provider** (the API installed, no SDK configured) and **on
with the SDK** recording every span (a `TracerProvider` whose processor drops them). The figure
is each mode's median throughput and its ratio to off, per round.

Prints a table and writes bench/results/tracing.json.

    python bench/tracing.py [--messages 50000] [--batch 1000] [--rounds 6]
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
import redis
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._results import results_path
from bench._rounds import ratios, run_rounds, throughput
from bench.consumer import process, wait_http
from bench.producer import SHARDS, messages
from rsc import connect_producer, tracing
from tests import redis_servers

HERE = Path(__file__).resolve().parent
RESULTS = results_path("tracing.json")
STREAM = "bench-tracing"
MODES = ("off", "noop", "sdk")


async def publish_all(url: str, redis_url: str, batches: list[Any]) -> float:
    async with connect_producer(
        STREAM, "bench/tracing", coordinator_url=url, redis_url=redis_url
    ) as producer:
        start = time.perf_counter()
        for batch in batches:
            await producer.publish_many(batch)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    noop, sdk = trace.NoOpTracerProvider(), TracerProvider()  # (no processor: spans recorded, dropped)
    batches = messages(args.messages, args.batch)
    port = redis_servers.free_port()
    with redis_servers.standalone() as redis_url:
        env = {"RSC_REDIS_URL": redis_url, "RSC_DEFAULT_SHARD_COUNT": str(SHARDS)}
        url = f"http://127.0.0.1:{port}"
        serve = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
        with process(serve, env, HERE.parent), redis.Redis.from_url(redis_url) as r:
            wait_http(url + "/healthz")
            body = {"protocolVersion": 1, "streamPrefix": STREAM, "producerId": "bench/setup", "leave": True}
            httpx.post(url + "/v1/producers/heartbeat", json=body).raise_for_status()
            keys = [s["key"] for s in httpx.get(f"{url}/v1/streams/{STREAM}/routing").json()["shards"]]

            def run(mode: str, _round: int) -> float:
                r.delete(*keys)
                tracing.enable(mode != "off")
                trace._TRACER_PROVIDER = noop if mode == "noop" else sdk  # (the bench swaps it per round)
                return trio.run(publish_all, url, redis_url, batches)

            runs = run_rounds(args.rounds, (MODES,), run)
    results = {mode: throughput(runs[mode], args.messages) for mode in MODES}
    print(f"{args.messages} messages, batches of {args.batch}, {SHARDS} shards; {args.rounds} rounds\n")
    print(f"{'tracing':<8} {'msg/s':>10} {'vs off':>8}   per-round ratios")
    for mode in MODES:
        per_round = ratios(runs[mode], runs["off"])
        results[mode]["vsOffPerRound"] = [round(x, 3) for x in per_round]
        results[mode]["vsOff"] = round(statistics.median(per_round), 3)
        shown = " ".join(f"{x:.2f}" for x in per_round)
        print(f"{mode:<8} {results[mode]['messagesPerSecond']:>10} {results[mode]['vsOff']:>8.2f}   {shown}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {"benchmark": "tracing", "python": platform.python_version(), "results": results}
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
