"""Benchmark: messages consumed and acknowledged per second by one consumer process, 16 shards.

Preloads N entries over the 16 shard keys of a stream (private redis-server
and coordinator), then lets each contender drain them with its own consumer
group, one after the other, timing from its first read to the last
acknowledgement (process start-up excluded):

* `rsc worker` (one member, no-op handler, fenced reads and acks, fair reading);
* a hand-written coredis loop: XREADGROUP COUNT 100 round robin, batched XACK;
* FastStream's Redis stream subscriber (one group consumer per shard key),
  installed into its own virtualenv (bench/.faststream-venv) for the bench only.

Prints a table and writes bench/results/consumer.json.

    python bench/consumer.py [--messages 100000] [--skip-faststream]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import redis_servers

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "consumer.json"
FS_VENV = HERE / ".faststream-venv"
SHARDS = 16


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str], cwd: Path = HERE) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        args, env={**os.environ, **env}, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_http(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def drain_time(r: redis.Redis, keys: list[str], group: str, per_key: dict[str, int], timeout: float) -> float:
    """Seconds from the group's first read to every entry read and acknowledged."""
    start = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        read = pending = 0
        for key in keys:
            for info in r.xinfo_groups(key):
                if info["name"] == group:
                    read += min(info.get("entries-read") or 0, per_key[key])
                    pending += info["pending"]
        if start is None and read:
            start = time.monotonic()
        if read == sum(per_key.values()) and pending == 0 and start is not None:
            return time.monotonic() - start
        time.sleep(0.02)
    raise RuntimeError(f"{group} did not drain within {timeout} s")


def faststream_python() -> Path:
    python = FS_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(FS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "faststream[redis]"], check=True)
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--skip-faststream", action="store_true")
    args = parser.parse_args()
    port = redis_servers.free_port()
    results: dict[str, dict[str, float]] = {}
    with redis_servers.standalone() as redis_url:
        env = {"RSC_REDIS_URL": redis_url, "RSC_DEFAULT_SHARD_COUNT": str(SHARDS)}
        url = f"http://127.0.0.1:{port}"
        serve = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
        with process(serve, env, HERE.parent):
            wait_http(url + "/healthz")
            body = {"protocolVersion": 1, "streamPrefix": "bench", "producerId": "loader"}
            layout = httpx.post(url + "/v1/producers/heartbeat", json=body).json()["layout"]
            keys = [s["key"] for s in layout["shards"]]
            r = redis.Redis.from_url(redis_url, decode_responses=True)
            pipe = r.pipeline(transaction=False)
            for n in range(args.messages):
                pipe.xadd(keys[n % SHARDS], {"n": str(n), "body": "x" * 100})
                if n % 5_000 == 4_999:
                    pipe.execute()
            pipe.execute()
            per_key = {k: r.xlen(k) for k in keys}
            raw_script = str(HERE / "consumer_raw.py")
            raw_command = [sys.executable, raw_script, redis_url, "raw-coredis", str(args.messages), *keys]
            contenders: list[tuple[str, list[str], dict[str, str], Path]] = [
                (
                    "rsc-worker",
                    [sys.executable, "-m", "rsc", "worker", "consumer_app:app", "--coordinator", url],
                    {"RSC_BENCH_STREAM": "bench", "RSC_BENCH_GROUP": "rsc-worker"},
                    HERE,
                ),
                (
                    "raw-coredis",
                    raw_command,
                    {},
                    HERE,
                ),
            ]
            if not args.skip_faststream:
                fs = str(faststream_python())
                contenders.append(
                    (
                        "faststream",
                        [fs, str(HERE / "consumer_faststream.py"), redis_url, "faststream", *keys],
                        {},
                        HERE,
                    )
                )
            for name, command, extra, cwd in contenders:
                with process(command, {**env, **extra}, cwd):
                    seconds = drain_time(r, keys, name, per_key, timeout=600)
                results[name] = {
                    "seconds": round(seconds, 3),
                    "messagesPerSecond": round(args.messages / seconds),
                }
            r.close()
    raw = results["raw-coredis"]["messagesPerSecond"]
    print(f"{args.messages} messages over {SHARDS} shards, one consumer process each\n")
    header = f"{'consumer':<14} {'msg/s':>10} {'vs raw':>8}"
    print(header)
    print("-" * len(header))
    for name, row in results.items():
        print(f"{name:<14} {row['messagesPerSecond']:>10} {row['messagesPerSecond'] / raw:>8.2f}")
    rsc = results["rsc-worker"]["messagesPerSecond"]
    print(f"\nrsc / raw coredis loop: {rsc / raw:.2f} (target >= 0.8)")
    if "faststream" in results:
        print(f"rsc / FastStream: {rsc / results['faststream']['messagesPerSecond']:.1f} (target >= 10)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "consumer",
        "python": platform.python_version(),
        "messages": args.messages,
        "shards": SHARDS,
        "results": results,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
