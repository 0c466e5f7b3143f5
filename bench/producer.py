"""Benchmark: producer throughput next to a raw pipelined XADD loop, and keys moved by a scale-out.

Starts a private redis-server and the coordinator (`python -m rsc serve`),
creates a stream of 16 shards, then, in this one process:

* trio: `Producer.publish_many` (routes each message by key with jump-v1,
  one pipeline per call) next to a hand-written coredis loop that pipelines
  XADD to the shard keys round robin;
* sync: `SyncProducer.publish_many` next to the same loop on redis-py;
* Node.js (when `node` and clients/node/node_modules are there): the Node.js client's
  `publishMany` next to an ioredis loop that pipelines XADD the same way
  (bench/producer_node.js, a process per run that times only its publishing);
* each producer with idempotence off (`idempotent=False`) next to it on (the default): the
  cost of dedupe per append, measured side by side in the same rounds.

Each contender sends the same messages (100-byte body, 1,000 distinct keys)
in batches of `--batch`. Over `--rounds` rounds each producer runs next to
its raw loop (ABBA order); the figure is the median of the per-round ratios,
which a machine whose speed drifts between runs disturbs least. Shard keys are emptied
between runs. Then the table of keys moved when N shards become N + 1, for
N = 1..64, for jump-v1 next to `hash mod N` (100,000 keys; ideal 1/(N+1)).

Prints tables and writes bench/results/producer.json.

    python bench/producer.py [--messages 50000] [--batch 100] [--rounds 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import redis
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._rounds import ratios, run_rounds, throughput
from bench.consumer import process, wait_http
from rsc.actors.store_connection import open_redis
from rsc.client.coordinator import Coordinator
from rsc.client.producer import open_producer
from rsc.client.sync import SyncCoordinator, SyncProducer
from rsc.events.routing import bucket_of, key_hash
from tests import redis_servers

HERE = Path(__file__).resolve().parent
from bench._results import results_path  # noqa: E402

RESULTS = results_path("producer.json")
SHARDS = 16
STREAM = "bench"
BODY = "x" * 90
KEYS = 1_000
MOVE_KEYS = 100_000
#: Each producer and the raw loop it is measured against.
PAIRS = (("rsc-trio", "raw-coredis"), ("rsc-sync", "raw-redis-py"))
#: The Node.js client's producer and its raw loop (when Node.js is there).
NODE_PAIR = ("rsc-node", "raw-ioredis")
#: Each producer (idempotent, the default) and itself with idempotence off.
IDEMPOTENCE = (("rsc-trio", "rsc-trio-off"), ("rsc-sync", "rsc-sync-off"))
#: The anchor, run once in every round: what Redis takes without rsc (`redis_benchmark`).
ANCHOR = "redis-benchmark"


def messages(count: int, batch: int) -> list[list[tuple[dict[str, str], str]]]:
    """The workload: `count` messages in batches, each with a partition key."""
    every = [({"n": str(n), "body": BODY}, f"customer-{n % KEYS}") for n in range(count)]
    return [every[i : i + batch] for i in range(0, count, batch)]


# --- trio: Producer vs raw coredis ---------------------------------------------


async def trio_producer(url: str, redis_url: str, batches: list[Any], idempotent: bool = True) -> float:
    async with (
        Coordinator(url) as coordinator,
        open_redis(redis_url) as r,
        open_producer(coordinator, r, STREAM, "bench/trio", idempotent=idempotent) as producer,
    ):
        start = time.perf_counter()
        for batch in batches:
            await producer.publish_many(batch)
        return time.perf_counter() - start


async def trio_raw(redis_url: str, keys: list[str], batches: list[Any]) -> float:
    async with open_redis(redis_url) as r:
        start = time.perf_counter()
        n = 0
        for batch in batches:
            async with r.pipeline(transaction=False) as pipe:
                for fields, _ in batch:
                    pipe.xadd(keys[n % len(keys)], fields)
                    n += 1
        return time.perf_counter() - start


# --- sync: SyncProducer vs raw redis-py ------------------------------------------


def sync_producer(url: str, redis_url: str, batches: list[Any], idempotent: bool = True) -> float:
    with (
        redis.Redis.from_url(redis_url) as r,
        SyncCoordinator(url) as coordinator,
        SyncProducer(coordinator, r, STREAM, "bench/sync", idempotent=idempotent) as producer,
    ):
        start = time.perf_counter()
        for batch in batches:
            producer.publish_many(batch)
        return time.perf_counter() - start


def node(mode: str, url: str, redis_url: str, keys: list[str], count: int, batch: int) -> float:
    """bench/producer_node.js: `rsc` (the Node.js producer) or `raw` (ioredis XADD pipelines)."""
    argv = ["node", str(HERE / "producer_node.js"), mode, url, redis_url, STREAM, str(count), str(batch)]
    done = subprocess.run([*argv, ",".join(keys)], capture_output=True, text=True, check=True, timeout=600)
    return float(done.stdout.strip())


def node_ready() -> bool:
    """Whether the Node.js contenders can run: `node` and the client's dependencies."""
    return shutil.which("node") is not None and (HERE.parent / "clients/node/node_modules/ioredis").is_dir()


def sync_raw(redis_url: str, keys: list[str], batches: list[Any]) -> float:
    with redis.Redis.from_url(redis_url) as r:
        start = time.perf_counter()
        n = 0
        for batch in batches:
            pipe = r.pipeline(transaction=False)
            for fields, _ in batch:
                pipe.xadd(keys[n % len(keys)], fields)
                n += 1
            pipe.execute()
        return time.perf_counter() - start


# --- keys moved ----------------------------------------------------------------


def redis_benchmark(redis_url: str, messages: int) -> float:
    """The anchor: what Redis takes without rsc, `redis-benchmark -P 100 -c 1` XADD of the same
    fields to one key (messages per second, as it reports)."""
    port = str(urlparse(redis_url).port)
    args = ["redis-benchmark", "-p", port, "-P", "100", "-c", "1", "-n", str(messages), "-q"]
    args += ["XADD", "bench:anchor", "*", "n", "1", "body", BODY]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=300).stdout
    found = re.search(r"([\d.]+) requests per second", out)
    assert found, out
    with redis.Redis.from_url(redis_url) as r:
        r.delete("bench:anchor")
    return float(found.group(1))


def keys_moved() -> list[dict[str, float]]:
    hashes = [(key_hash(b"key-%d" % k), b"key-%d" % k) for k in range(MOVE_KEYS)]
    rows = []
    for n in range(1, 65):
        jump_moved = sum(bucket_of(key, n) != bucket_of(key, n + 1) for _, key in hashes)
        mod_moved = sum(h % n != h % (n + 1) for h, _ in hashes)
        ideal = 1 / (n + 1)
        rows.append(
            {
                "from": n,
                "to": n + 1,
                "ideal": round(ideal, 5),
                "jumpV1": round(jump_moved / MOVE_KEYS, 5),
                "mod": round(mod_moved / MOVE_KEYS, 5),
                "jumpV1Deviation": round(abs(jump_moved / MOVE_KEYS - ideal) / ideal, 4),
            }
        )
    return rows


def print_keys_moved(moved: list[dict[str, float]]) -> None:
    print(f"\nkeys moved when N shards become N + 1 ({MOVE_KEYS} keys)\n")
    header = f"{'N':>3} {'ideal':>8} {'jump-v1':>8} {'mod N':>8} {'dev':>6}"
    print(header)
    print("-" * len(header))
    for row in moved:
        print(
            f"{row['from']:>3} {row['ideal']:>8.4f} {row['jumpV1']:>8.4f} {row['mod']:>8.4f} "
            f"{row['jumpV1Deviation']:>6.1%}"
        )
    worst = max(row["jumpV1Deviation"] for row in moved)
    print(f"\nworst jump-v1 deviation from 1/(N+1): {worst:.1%} (target within 10 %)")


def report_anchor(
    results: dict[str, dict[str, Any]], runs: dict[str, list[float]], anchor_runs: list[float], messages: int
) -> None:
    """Each producer over the anchor, round by round (same messages), and the median."""
    anchor = messages / statistics.median(anchor_runs)
    print(
        f"\nanchor: redis-benchmark -P 100 -c 1 XADD, same fields: {anchor:,.0f} msg/s "
        f"(median of {len(anchor_runs)} runs, one in every round)"
    )
    for producer, _ in PAIRS:
        per_round = ratios(runs[producer], anchor_runs)
        share = statistics.median(per_round)
        results[producer]["vsRedisBenchmarkPerRound"] = [round(x, 3) for x in per_round]
        results[producer]["vsRedisBenchmark"] = round(share, 3)
        verdict = "goal met" if share >= 0.5 else "floor met" if share >= 0.35 else "BELOW FLOOR"
        shown = " ".join(f"{x:.2f}" for x in per_round)
        print(
            f"{producer} / redis-benchmark: {share:.2f} (rounds {shown}; goal >= 0.5, floor 0.35: {verdict})"
        )


def report_idempotence(results: dict[str, dict[str, Any]], runs: dict[str, list[float]], count: int) -> None:
    """Each producer with idempotence on (the default) next to off, in the same rounds: the
    throughput ratio and the time each message costs more (median of the rounds)."""
    print("\nidempotence (on, the default, vs off): throughput ratio and cost per message")
    for on, off in IDEMPOTENCE:
        per_round = ratios(runs[on], runs[off])
        cost_us = [(a - b) / count * 1e6 for a, b in zip(runs[on], runs[off], strict=True)]
        results[on]["vsIdempotenceOffPerRound"] = [round(x, 3) for x in per_round]
        results[on]["vsIdempotenceOff"] = round(statistics.median(per_round), 3)
        results[on]["idempotenceCostUsPerMessage"] = round(statistics.median(cost_us), 3)
        print(
            f"{on:<14} {statistics.median(per_round):.2f}x of {off} "
            f"({results[off]['messagesPerSecond']} msg/s off), "
            f"{statistics.median(cost_us):+.2f} us a message"
        )


def report_pairs(
    results: dict[str, dict[str, Any]], runs: dict[str, list[float]], pairs: tuple[tuple[str, str], ...]
) -> None:
    """Each producer beside its raw loop: throughput and the median of the per-round ratios."""
    header = f"{'publisher':<14} {'msg/s':>10} {'vs raw':>8}   per-round ratios"
    print(header)
    print("-" * len(header))
    for producer, raw in pairs:
        per_round = ratios(runs[producer], runs[raw])
        results[producer]["vsRawPerRound"] = [round(x, 3) for x in per_round]
        results[producer]["vsRaw"] = round(statistics.median(per_round), 3)
        for name in (producer, raw):
            row = results[name]
            ratio = row.get("vsRaw", 1.0)
            shown = " ".join(f"{x:.2f}" for x in row.get("vsRawPerRound", []))
            print(f"{name:<14} {row['messagesPerSecond']:>10} {ratio:>8.2f}   {shown}")
    for producer, raw in pairs:
        print(f"{producer} / {raw}: {results[producer]['vsRaw']:.2f} (median)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
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
            layout = httpx.get(f"{url}/v1/streams/{STREAM}/routing").json()
            keys = [s["key"] for s in layout["shards"]]
            contenders: dict[str, Callable[[], float]] = {
                "rsc-trio": lambda: trio.run(trio_producer, url, redis_url, batches),
                "raw-coredis": lambda: trio.run(trio_raw, redis_url, keys, batches),
                "rsc-sync": lambda: sync_producer(url, redis_url, batches),
                "raw-redis-py": lambda: sync_raw(redis_url, keys, batches),
                "rsc-trio-off": lambda: trio.run(trio_producer, url, redis_url, batches, False),
                "rsc-sync-off": lambda: sync_producer(url, redis_url, batches, False),
                "rsc-node": lambda: node("rsc", url, redis_url, keys, args.messages, args.batch),
                "raw-ioredis": lambda: node("raw", url, redis_url, keys, args.messages, args.batch),
            }
            pairs = PAIRS + ((NODE_PAIR,) if node_ready() else ())

            def run(name: str, round_: int) -> float:
                if name == ANCHOR:  # in every round too: the machine drifts, the anchor with it
                    return args.messages / redis_benchmark(redis_url, args.messages)
                r.delete(*keys)
                seconds = contenders[name]()
                assert sum(r.xlen(k) for k in keys) == args.messages, name
                return seconds

            # ABBA: who goes first alternates, so a drifting machine favours neither
            offs = tuple((off,) for _, off in IDEMPOTENCE)
            runs = run_rounds(args.rounds, (*pairs, *offs, (ANCHOR,)), run)
            anchor_runs = runs.pop(ANCHOR)
            anchor = args.messages / statistics.median(anchor_runs)
            with contextlib.suppress(redis.RedisError):
                r.delete(*keys)
    results: dict[str, dict[str, Any]] = {name: throughput(s, args.messages) for name, s in runs.items()}
    print(f"{args.messages} messages, batches of {args.batch}, {SHARDS} shards; {args.rounds} rounds\n")
    report_pairs(results, runs, pairs)
    report_idempotence(results, runs, args.messages)
    report_anchor(results, runs, anchor_runs, args.messages)

    moved = keys_moved()
    print_keys_moved(moved)

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "producer",
        "python": platform.python_version(),
        "messages": args.messages,
        "batch": args.batch,
        "shards": SHARDS,
        "results": results,
        "redisBenchmarkMessagesPerSecond": round(anchor),
        "keysMoved": moved,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
