"""Benchmark: Redis memory under a steady publish rate with one group keeping up (retention).

Starts a private redis-server and the coordinator (`python -m rsc serve`, retention every
`--retention-ms`), creates a stream of `--shards` shards (at feature level 5 it gets the
default policy: keep what some group has not acknowledged), runs one `rsc worker` on it
(bench/latency_app.py, a no-op handler that records nothing of note) and publishes
`--rate` messages a second of a `--payload`-byte field from a `SyncProducer` for `--minutes`.
Every `--sample-s` it reads Redis' `used_memory` and the shard keys' total length.

Prints a table (time, entries published, entries in the shard keys, used_memory) and the slope
of used_memory over the second half of the run (bytes per minute: flat is ~0), and writes
bench/results/soak.json. Without retention (`--keep all`) the same run shows the growth.

    python bench/soak.py [--minutes 10] [--rate 2000] [--shards 4] [--payload 200] [--keep acknowledged]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._results import results_path
from bench.consumer import process, wait_http
from bench.latency import create_stream, logged_process, wait_assigned
from rsc.client.sync import SyncCoordinator, SyncProducer
from tests import redis_servers

HERE = Path(__file__).resolve().parent
GROUP = "soak"


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points (y per x)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return 0.0 if var == 0 else sum((x - mx) * (y - my) for x, y in points) / var


def main() -> None:  # noqa: PLR0915  (one straight run: setup, publish, sample, report)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate", type=float, default=2000, help="messages a second")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--payload", type=int, default=200, help="bytes of the one field")
    parser.add_argument("--sample-s", type=float, default=10)
    parser.add_argument("--retention-ms", type=int, default=5000)
    parser.add_argument("--keep", choices=("acknowledged", "all"), default="acknowledged")
    args = parser.parse_args()
    if args.minutes <= 0 or args.rate <= 0 or args.shards < 1 or args.sample_s <= 0:
        parser.error("--minutes, --rate, --sample-s must be positive, --shards at least 1")
    port = redis_servers.free_port()
    url = f"http://127.0.0.1:{port}"
    samples: list[dict[str, Any]] = []
    with redis_servers.standalone() as redis_url:
        env = {
            "RSC_REDIS_URL": redis_url,
            "RSC_ADMIN_PASSWORD": "soak",
            "RSC_RETENTION_INTERVAL_MS": str(args.retention_ms),
        }
        serve = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
        with process(serve, env, HERE.parent):
            wait_http(url + "/healthz")
            stream = "soak"
            spec = {"shardCount": args.shards, "retention": {"keep": args.keep}}
            put = httpx.put(f"{url}/v1/admin/streams/{stream}", json=spec, auth=("admin", "soak"), timeout=10)
            put.raise_for_status()
            keys = create_stream(url, stream)
            r = redis.Redis.from_url(redis_url, decode_responses=True)
            with tempfile.TemporaryDirectory(prefix="rsc-soak-") as tmp:
                out = Path(tmp) / "records.txt"
                worker_env = {
                    **env,
                    "RSC_BENCH_STREAM": stream,
                    "RSC_BENCH_GROUP": GROUP,
                    "RSC_BENCH_MEMBERS": "1",
                    "RSC_BENCH_OUT": str(out),
                    "PYTHONPATH": str(HERE.parent),
                }
                argv = [sys.executable, "-m", "rsc", "worker", "latency_app:app", "--coordinator", url]
                with (
                    logged_process(argv, worker_env, out.with_suffix(".log")),
                    redis.Redis.from_url(redis_url) as publisher,
                    SyncProducer(SyncCoordinator(url), publisher, stream, "bench/soak") as producer,
                ):
                    wait_assigned(url, stream, GROUP, 1, shards=args.shards)
                    payload = os.urandom(args.payload // 2 + 1).hex()[: args.payload]
                    start = time.monotonic()
                    end = start + args.minutes * 60
                    published, next_sample, batch = 0, start, max(1, int(args.rate / 100))
                    while True:
                        now = time.monotonic()
                        if now >= next_sample:
                            length = sum(int(r.xlen(k)) for k in keys)
                            memory = int(r.info("memory")["used_memory"])
                            samples.append(
                                {
                                    "s": round(now - start, 1),
                                    "published": published,
                                    "entries": length,
                                    "usedMemory": memory,
                                }
                            )
                            print(
                                f"{now - start:7.0f} s {published:>10,} published {length:>9,} "
                                f"in the keys {memory / 1e6:9.1f} MB",
                                file=sys.stderr,
                            )
                            next_sample += args.sample_s
                        if now >= end:
                            break
                        due = start + (published + batch) / args.rate
                        if due > now:
                            time.sleep(min(due - now, 0.05))
                            continue
                        producer.publish_many(
                            [({"ts": repr(now), "phase": "soak", "p": payload}, None)] * batch
                        )
                        published += batch
    half = [(s["s"] / 60, float(s["usedMemory"])) for s in samples if s["s"] >= args.minutes * 30]
    growth = slope(half)
    print()
    print(f"{'s':>7} {'published':>12} {'in the keys':>12} {'used_memory MB':>15}")
    for s in samples:
        print(f"{s['s']:>7} {s['published']:>12,} {s['entries']:>12,} {s['usedMemory'] / 1e6:>15.1f}")
    print(
        f"\nused_memory over the second half: {growth / 1e6:+.2f} MB/min at {args.rate:g} msg/s ({args.keep})"
    )
    result = {
        "benchmark": "soak",
        "args": vars(args),
        "samples": samples,
        "usedMemorySlopeBytesPerMin": growth,
    }
    path = results_path("soak.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
