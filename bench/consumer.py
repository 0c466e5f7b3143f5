"""Benchmark: messages consumed and acknowledged per second by one consumer process, 16 shards.

Preloads `--messages` entries over the 16 shard keys of a stream (private
redis-server and coordinator). Then, in each of `--rounds` rounds, each
contender drains them with a consumer group of its own (a new group every
round, so every round reads the same entries), one after the other, timed
from its first read to the last acknowledgement (process start-up excluded):

* `rsc worker` on bench/consumer_app.py (an `App` listener: one member, the
  built-in `Poller`, no-op handler, fenced reads and acks, fair reading);
* a hand-written coredis loop (bench/consumer_raw.py): XREADGROUP COUNT 100
  round robin, batched XACK;
* FastStream's Redis stream subscriber (bench/consumer_faststream.py, one
  group consumer per shard key), installed on first use into its own
  virtualenv (bench/.faststream-venv) for the bench only; left out with
  `--no-faststream`, or when it cannot be installed.

The order reverses every other round (W L F, then F L W, ...; see
bench/_rounds.py), so a machine whose speed drifts between runs favours no
contender; the figures are the medians of the per-round ratios rsc / loop and
rsc / FastStream.

Options:

    --messages N     entries each contender drains in each round (default 40,000;
                     `--rounds 5` then takes about 1-2 minutes on 2 cores)
    --rounds N       rounds (default 5)
    --no-faststream  leave FastStream out (`--skip-faststream` is the old spelling)

Prints a table (each round's msg/s per contender and ratios, then the
medians) and writes bench/results/consumer.json.

    python bench/consumer.py [--messages 40000] [--rounds 5] [--no-faststream]
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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._rounds import order, ratios, run_rounds, throughput
from tests import redis_servers

HERE = Path(__file__).resolve().parent
from bench._results import results_path  # noqa: E402

RESULTS = results_path("consumer.json")
FS_VENV = HERE / ".faststream-venv"
SHARDS = 16
STREAM = "bench"
BODY = "x" * 100
DRAIN_TIMEOUT_S = 300
RSC, LOOP, FASTSTREAM = "rsc-worker", "raw-coredis", "faststream"
#: One letter per contender for the order column.
LETTERS = {RSC: "W", LOOP: "L", FASTSTREAM: "F"}


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
        pipe = r.pipeline(transaction=False)
        for key in keys:
            pipe.xinfo_groups(key)
        read = pending = 0
        for key, infos in zip(keys, pipe.execute(), strict=True):
            for info in infos:
                if info["name"] == group:
                    read += min(info.get("entries-read") or 0, per_key[key])
                    pending += info["pending"]
        if start is None and read:
            start = time.monotonic()
        if read == sum(per_key.values()) and pending == 0 and start is not None:
            return time.monotonic() - start
        time.sleep(0.01)
    raise RuntimeError(f"{group} did not drain within {timeout} s")


def faststream_python() -> Path | None:
    """The bench virtualenv's python with FastStream (installed on first use), or None if it cannot be."""
    python = FS_VENV / "bin" / "python"
    with contextlib.suppress(OSError):
        probe = [str(python), "-c", "import faststream.redis"]
        if subprocess.run(probe, check=False, capture_output=True).returncode == 0:
            return python
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(FS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "faststream[redis]"], check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"FastStream left out: cannot install it into {FS_VENV} ({error})", file=sys.stderr)
        return None
    return python


def preload(r: redis.Redis, keys: list[str], count: int) -> dict[str, int]:
    """`count` entries round robin over `keys`; the length of each key."""
    pipe = r.pipeline(transaction=False)
    for n in range(count):
        pipe.xadd(keys[n % len(keys)], {"n": str(n), "body": BODY})
        if n % 5_000 == 4_999:
            pipe.execute()
    pipe.execute()
    return {k: r.xlen(k) for k in keys}


def measure(args: argparse.Namespace, names: list[str], fs_python: Path | None) -> dict[str, list[float]]:
    """Seconds each contender took to drain the stream, one per round."""
    port = redis_servers.free_port()
    with redis_servers.standalone() as redis_url:
        env = {"RSC_REDIS_URL": redis_url, "RSC_DEFAULT_SHARD_COUNT": str(SHARDS)}
        url = f"http://127.0.0.1:{port}"
        serve = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
        with process(serve, env, HERE.parent), redis.Redis.from_url(redis_url, decode_responses=True) as r:
            wait_http(url + "/healthz")
            body = {"protocolVersion": 1, "streamPrefix": STREAM, "producerId": "loader", "leave": True}
            layout = httpx.post(url + "/v1/producers/heartbeat", json=body).json()["layout"]
            keys = [s["key"] for s in layout["shards"]]
            per_key = preload(r, keys, args.messages)

            def command(name: str, group: str) -> tuple[list[str], dict[str, str]]:
                if name == RSC:
                    worker = [sys.executable, "-m", "rsc", "worker", "consumer_app:app", "--coordinator", url]
                    return worker, {"RSC_BENCH_STREAM": STREAM, "RSC_BENCH_GROUP": group}
                if name == LOOP:
                    loop = [sys.executable, str(HERE / "consumer_raw.py"), redis_url, group]
                    return [*loop, str(args.messages), *keys], {}
                assert fs_python is not None
                return [str(fs_python), str(HERE / "consumer_faststream.py"), redis_url, group, *keys], {}

            def run(name: str, round_: int) -> float:
                group = f"{name}-{round_ + 1}"  # a new group reads the same entries from the start
                argv, extra = command(name, group)
                with process(argv, {**env, **extra}, HERE):
                    return drain_time(r, keys, group, per_key, DRAIN_TIMEOUT_S)

            return run_rounds(args.rounds, [names], run)


def report(args: argparse.Namespace, names: list[str], runs: dict[str, list[float]]) -> None:
    results: dict[str, dict[str, Any]] = {name: throughput(runs[name], args.messages) for name in names}
    versus = [(other, label) for other, label in ((LOOP, "Raw"), (FASTSTREAM, "Faststream")) if other in runs]
    per_round = {other: ratios(runs[RSC], runs[other]) for other, _ in versus}
    for other, label in versus:
        results[RSC][f"vs{label}PerRound"] = [round(x, 3) for x in per_round[other]]
        results[RSC][f"vs{label}"] = round(statistics.median(per_round[other]), 3)
    orders = [order(names, round_) for round_ in range(args.rounds)]

    print(f"\n{args.messages} messages over {SHARDS} shards, one consumer process each; {args.rounds} rounds")
    print("order: " + ", ".join(f"{LETTERS[n]} = {n}" for n in names) + " (reversed every other round)\n")
    ratio_heads = {LOOP: "rsc/loop", FASTSTREAM: "rsc/fs"}
    header = f"{'round':<7}{'order':<7}" + "".join(f"{n + ' msg/s':>18}" for n in names)
    header += "".join(f"{ratio_heads[other]:>10}" for other, _ in versus)
    print(header)
    print("-" * len(header))
    for round_ in range(args.rounds):
        line = f"{round_ + 1:<7}{' '.join(LETTERS[n] for n in orders[round_]):<7}"
        line += "".join(f"{args.messages / runs[n][round_]:>18.0f}" for n in names)
        line += "".join(f"{per_round[other][round_]:>10.2f}" for other, _ in versus)
        print(line)
    print("-" * len(header))
    line = f"{'median':<14}" + "".join(f"{results[n]['messagesPerSecond']:>18}" for n in names)
    line += "".join(f"{results[RSC][f'vs{label}']:>10.2f}" for _, label in versus)
    print(line + "\n")
    rounds = f"median of {args.rounds} rounds"
    print(f"rsc / raw coredis loop (the anchor): {results[RSC]['vsRaw']:.2f} ({rounds}; goal >= 1.0)")
    rate = results[RSC]["messagesPerSecond"]
    verdict = "goal met" if rate >= 100_000 else "floor met" if rate >= 90_000 else "BELOW FLOOR"
    print(f"rsc worker: {rate} msg/s ({rounds}; goal >= 100,000, floor 90,000: {verdict})")
    if FASTSTREAM in runs:
        print(f"rsc / FastStream: {results[RSC]['vsFaststream']:.1f} ({rounds}; target >= 10)")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "consumer",
        "python": platform.python_version(),
        "messages": args.messages,
        "shards": SHARDS,
        "rounds": args.rounds,
        "order": orders,
        "results": results,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=40_000, help="entries per contender per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-faststream", "--skip-faststream", dest="no_faststream", action="store_true")
    args = parser.parse_args()
    if args.rounds < 1 or args.messages < 1:
        parser.error("--rounds and --messages must be at least 1")
    fs_python = None if args.no_faststream else faststream_python()
    names = [RSC, LOOP] + ([FASTSTREAM] if fs_python else [])
    runs = measure(args, names, fs_python)
    report(args, names, runs)


if __name__ == "__main__":
    main()
