"""Benchmark: publish -> handler latency at a low and a high rate, and the cost of an idle worker.

Starts a private redis-server and the coordinator (`python -m rsc serve`,
8 shards per stream). Each contender, in each of `--rounds` rounds (the
order reverses every other round, see bench/_rounds.py):

* latency: a consumer process on a fresh stream of 8 shards; a synchronous
  producer (`SyncProducer`, in this process) publishes at each of `--rates`
  (default 5 and 1,000 msg/s) for `--seconds` each; every message carries the
  publisher's `time.monotonic()` (one clock for every process of the
  machine) and the handler records now minus that: p50, p99, max; and the
  CPU the consumer process and redis-server used meanwhile (% of one core,
  utime + stime from /proc/<pid>/stat);
* idle: a consumer process with `--idle-members` members (rsc) on another
  fresh stream of `--idle-shards` shards (64), nothing published; after it settles, over
  `--idle-seconds`: the CPU it used and the Redis commands per second (INFO stats
  `total_commands_processed`, commands run by scripts included, minus what
  Redis runs over as long a window just after the consumer left: the
  coordinator's own work on that stream and group, its retention passes
  included), in total and per member, and per command.

Contenders:

* `rsc worker` on bench/latency_app.py (an `App` listener; `--members`
  members for latency, 1 by default);
* the Node.js client (`rsc-node`: bench/latency_node.js, one `createWorker`,
  one member per process; `--idle-members` does not apply), when `node` and
  clients/node/node_modules are there (`npm ci` in clients/node); left out
  with `--no-node`;
* FastStream's Redis stream subscriber (bench/latency_faststream.py, one
  group consumer per shard key, its default 100 ms blocking XREADGROUP), in
  bench/.faststream-venv (installed on first use as bench/consumer.py does);
  left out with `--no-faststream`. For FastStream "per member" is per process.

Prints a table (each round, then the median and the spread over rounds) and
writes bench/results/latency.json.

    python bench/latency.py [--seconds 20] [--rates 5,1000] [--idle-seconds 10] [--idle-shards 64]
                            [--rounds 1] [--no-node] [--no-faststream]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._rounds import order
from bench.consumer import faststream_python, process, wait_http
from rsc.client.sync import SyncCoordinator, SyncProducer
from tests import redis_servers

HERE = Path(__file__).resolve().parent
from bench._results import results_path  # noqa: E402

RESULTS = results_path("latency.json")
SHARDS = 8
RSC, NODE, FASTSTREAM = "rsc-worker", "rsc-node", "faststream"
LETTERS = {RSC: "W", NODE: "N", FASTSTREAM: "F"}
ADMIN = ("bench", "bench-secret")
NODE_DIR = HERE.parent / "clients" / "node"
TICK = os.sysconf("SC_CLK_TCK")
SETTLE_S = 3.0


# --- measuring ---------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def commands(r: redis.Redis) -> tuple[int, dict[str, int]]:
    """Redis's `total_commands_processed` and calls per command so far."""
    total = int(r.info("stats")["total_commands_processed"])
    stats = r.info("commandstats")
    return total, {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of `sorted_values`."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def summary(latencies: list[float]) -> dict[str, Any]:
    values = sorted(latencies)
    return {
        "messages": len(values),
        "p50Ms": round(percentile(values, 50), 3),
        "p99Ms": round(percentile(values, 99), 3),
        "maxMs": round(values[-1], 3) if values else math.nan,
    }


def idle_window(r: redis.Redis, pid: int | None, seconds: float) -> dict[str, Any]:
    """CPU of `pid` (None: no process) and Redis commands over `seconds`."""
    cpu0 = cpu_seconds(pid) if pid else 0.0
    total0, calls0 = commands(r)
    start = time.monotonic()
    time.sleep(seconds)
    total1, calls1 = commands(r)
    elapsed = time.monotonic() - start
    cpu1 = cpu_seconds(pid) if pid else 0.0
    # The two INFO calls of a sample and the INFO commandstats between: not the consumer's.
    per_command = {
        name: round((calls1.get(name, 0) - calls0.get(name, 0)) / elapsed, 2)
        for name in calls1
        if calls1.get(name, 0) != calls0.get(name, 0) and name != "info"
    }
    return {
        "cpuPercent": round((cpu1 - cpu0) / elapsed * 100, 2),
        "commandsPerSecond": max(0.0, (total1 - total0 - 2) / elapsed),
        "perCommand": per_command,
    }


# --- the consumers -------------------------------------------------------------


def create_stream(url: str, stream: str, shards: int | None = None) -> list[str]:
    """Register `stream` and return its shard keys: a producer heartbeat creates it (the
    coordinator's default shard count), or, given `shards`, the Admin API (`ADMIN`) with that
    many, keeping every entry (the coordinator's retention passes would blur idle figures)."""
    if shards is not None:
        spec = {"shardCount": shards, "retention": {"keep": "all", "deadLetterMaxEntries": None}}
        answer = httpx.put(f"{url}/v1/admin/streams/{stream}", json=spec, auth=ADMIN, timeout=10)
        answer.raise_for_status()
    body = {"protocolVersion": 1, "streamPrefix": stream, "producerId": f"{stream}-setup", "leave": True}
    layout = httpx.post(url + "/v1/producers/heartbeat", json=body, timeout=10).json()["layout"]
    return [s["key"] for s in layout["shards"]]


def node_ready() -> bool:
    """Whether the Node.js contender can run: `node` and the client's dependencies."""
    return shutil.which("node") is not None and (NODE_DIR / "node_modules" / "ioredis").is_dir()


def wait_assigned(
    url: str, stream: str, group: str, members: int, timeout: float = 60, shards: int = SHARDS
) -> None:
    """Until `members` members hold the stream's `shards` shards, balanced, and nothing moves for 2 s."""
    deadline = time.monotonic() + timeout
    stable_since = None
    last = None
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            answer = httpx.get(f"{url}/v1/streams/{stream}/groups/{group}", timeout=2).json()
            owned = sorted(len(m.get("assigned", [])) for m in answer["members"])
            balanced = len(owned) == members and sum(owned) == shards and owned[-1] - owned[0] <= 1
            if balanced and owned == last:
                stable_since = stable_since or time.monotonic()
                if time.monotonic() - stable_since >= 2:
                    return
            else:
                stable_since = None
            last = owned if balanced else None
        time.sleep(0.1)
    raise RuntimeError(f"{group} on {stream}: {members} members did not settle")


def wait_groups(r: redis.Redis, keys: list[str], group: str, timeout: float = 60) -> None:
    """Until `group` exists on every key (FastStream creates its groups when it starts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.ResponseError):
            if all(any(g["name"] == group for g in r.xinfo_groups(k)) for k in keys):
                return
        time.sleep(0.05)
    raise RuntimeError(f"group {group} not created on every key")


def wait_handled(r: redis.Redis, keys: list[str], group: str, timeout: float = 120) -> None:
    """Until `group` read and acknowledged every entry of every key."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = True
        for key in keys:
            info = next((g for g in r.xinfo_groups(key) if g["name"] == group), None)
            if info is None or info.get("lag") not in (0, None) or info["pending"]:
                done = False
                break
        if done:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{group} did not handle everything within {timeout} s")


@contextlib.contextmanager
def logged_process(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`argv` in bench/, its output in `log`; stopped with SIGTERM (then SIGKILL) at the end."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, env={**os.environ, **env}, cwd=HERE, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Bench:
    def __init__(self, args: argparse.Namespace, redis_url: str, url: str, fs_python: Path | None) -> None:
        self.args = args
        self.redis_url = redis_url
        self.url = url
        self.fs_python = fs_python
        self.r = redis.Redis.from_url(redis_url, decode_responses=True)
        self.redis_pid = int(self.r.info("server")["process_id"])
        self.env = {"RSC_REDIS_URL": redis_url}

    @contextlib.contextmanager
    def consumer(
        self, name: str, stream: str, keys: list[str], group: str, members: int, out: Path
    ) -> Iterator[subprocess.Popen[bytes]]:
        """A consumer process reading `keys` (the shards of `stream`) as `group`, ready to handle."""
        if name == NODE:
            argv = ["node", str(HERE / "latency_node.js")]
            extra = {
                "RSC_BENCH_COORDINATOR": self.url,
                "RSC_BENCH_STREAM": stream,
                "RSC_BENCH_GROUP": group,
                "RSC_BENCH_OUT": str(out),
            }
        elif name == RSC:
            argv = [sys.executable, "-m", "rsc", "worker", "latency_app:app", "--coordinator", self.url]
            extra = {
                "RSC_BENCH_STREAM": stream,
                "RSC_BENCH_GROUP": group,
                "RSC_BENCH_MEMBERS": str(members),
                "RSC_BENCH_OUT": str(out),
                "PYTHONPATH": str(HERE.parent),
            }
        else:
            assert self.fs_python is not None
            argv = [str(self.fs_python), str(HERE / "latency_faststream.py"), self.redis_url, group, str(out)]
            argv += keys
            extra = {}
        log = out.with_suffix(".log")
        with logged_process(argv, {**self.env, **extra}, log) as proc:
            try:
                if name in (RSC, NODE):
                    wait_assigned(self.url, stream, group, members, shards=len(keys))
                else:
                    wait_groups(self.r, keys, group)
            except RuntimeError:
                print(log.read_text()[-3000:], file=sys.stderr)
                raise
            yield proc

    def publish(self, producer: SyncProducer, phase: str, rate: float, seconds: float) -> int:
        """Publish at `rate` msg/s for `seconds`, each message stamped just before it is sent."""
        count = max(1, round(rate * seconds))
        start = time.monotonic()
        for n in range(count):
            due = start + n / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            producer.publish({"ts": repr(time.monotonic()), "phase": phase})
        return count

    def latency(self, name: str, round_: int) -> dict[str, Any]:
        stream = f"lat-{name}-{round_ + 1}"
        keys = create_stream(self.url, stream)
        group = "latency"
        with tempfile.TemporaryDirectory(prefix="rsc-latency-") as tmp:
            out = Path(tmp) / "latencies.txt"
            with (
                redis.Redis.from_url(self.redis_url) as publisher,
                SyncProducer(SyncCoordinator(self.url), publisher, stream, f"bench/{stream}") as producer,
                self.consumer(name, stream, keys, group, self.args.members, out) as proc,
            ):
                self.publish(producer, "warmup", 50, 1)
                wait_handled(self.r, keys, group)
                cpu: dict[str, tuple[float, float]] = {}
                for rate in self.args.rates:
                    pids = (proc.pid, self.redis_pid)
                    cpu0, start = [cpu_seconds(pid) for pid in pids], time.monotonic()
                    self.publish(producer, f"{rate:g}", rate, self.args.seconds)
                    wait_handled(self.r, keys, group)
                    elapsed = time.monotonic() - start
                    consumer, server = (
                        (cpu_seconds(p) - c) / elapsed * 100 for p, c in zip(pids, cpu0, strict=True)
                    )
                    cpu[f"{rate:g}"] = (consumer, server)
            lines = [line.split() for line in out.read_text().splitlines()] if out.exists() else []
        by_phase: dict[str, list[float]] = {}
        for phase, ms in lines:
            by_phase.setdefault(phase, []).append(float(ms))
        return {
            f"{rate:g}": {
                **summary(by_phase.get(f"{rate:g}", [])),
                "cpuPercent": round(cpu[f"{rate:g}"][0], 1),
                "redisCpuPercent": round(cpu[f"{rate:g}"][1], 1),
            }
            for rate in self.args.rates
        }

    def idle(self, name: str, round_: int) -> dict[str, Any]:
        """The consumer's idle cost: a window with it, less a window of the same stream and group
        once it left (the coordinator's work on them, retention passes included)."""
        stream = f"idle-{name}-{round_ + 1}"
        keys = create_stream(self.url, stream, self.args.idle_shards)
        members = self.args.idle_members if name == RSC else 1
        with (
            tempfile.TemporaryDirectory(prefix="rsc-idle-") as tmp,
            self.consumer(name, stream, keys, "idle", members, Path(tmp) / "none.txt") as proc,
        ):
            time.sleep(SETTLE_S)
            window = idle_window(self.r, proc.pid, self.args.idle_seconds)
        time.sleep(SETTLE_S)
        without = idle_window(self.r, None, self.args.idle_seconds)
        window["members"] = members
        window["withoutCommandsPerSecond"] = round(without["commandsPerSecond"], 2)
        rate = window["commandsPerSecond"] - without["commandsPerSecond"]
        window["commandsPerSecond"] = round(max(0.0, rate), 2)
        window["commandsPerSecondPerMember"] = round(window["commandsPerSecond"] / members, 2)
        window["perCommand"] = {
            name: delta
            for name, rate in window["perCommand"].items()
            if (delta := round(rate - without["perCommand"].get(name, 0.0), 2)) > 0.05
        }
        return window

    def baseline(self) -> None:
        """Redis commands/s with no consumer: the coordinator's own background work."""
        self.background = idle_window(self.r, None, self.args.idle_seconds)["commandsPerSecond"]

    def run(self, name: str, round_: int) -> dict[str, Any]:
        return {"latency": self.latency(name, round_), "idle": self.idle(name, round_)}


# --- report ----------------------------------------------------------------------


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else ""


Runs = dict[str, list[dict[str, Any]]]
#: The columns of each rate.
STATS = {"p50Ms": "p50", "p99Ms": "p99", "maxMs": "max", "cpuPercent": "cpu%", "redisCpuPercent": "redis%"}


def report(args: argparse.Namespace, names: list[str], runs: Runs, bg: float) -> None:
    rounds = args.rounds
    latency = f"{args.members} member(s), {args.seconds:g} s per rate"
    idle = (
        f"{args.idle_shards} shards, {args.idle_members} rsc-worker member(s) (rsc-node, FastStream:"
        f" one process), {args.idle_seconds:g} s"
    )
    print(f"\n{SHARDS} shards; latency: {latency}; idle: {idle}; {rounds} round(s)")
    print(
        f"Redis commands/s with no consumer (the coordinator alone): {bg:.2f}; idle cmd/s: less the"
        " same stream and group once the consumer left\n"
    )
    columns: list[tuple[str, Callable[[dict[str, Any]], float]]] = []
    for rate in args.rates:
        for stat, title in STATS.items():
            columns.append((f"{rate:g}/s {title}", lambda run, r=rate, s=stat: run["latency"][f"{r:g}"][s]))
    columns.append(("idle cpu%", lambda run: run["idle"]["cpuPercent"]))
    columns.append(("idle cmd/s", lambda run: run["idle"]["commandsPerSecond"]))
    columns.append(("cmd/s/member", lambda run: run["idle"]["commandsPerSecondPerMember"]))
    print("latency in ms; cpu%: the consumer, redis%: redis-server (% of one core); cmd/s: while idle")
    header = f"{'contender':<12}{'round':<7}" + "".join(f"{title:>14}" for title, _ in columns)
    print(header)
    print("-" * len(header))
    for name in names:
        for round_, run in enumerate(runs[name]):
            print(f"{name:<12}{round_ + 1:<7}" + "".join(f"{get(run):>14.2f}" for _, get in columns))
        medians = [statistics.median(get(run) for run in runs[name]) for _, get in columns]
        print(f"{name:<12}{'median':<7}" + "".join(f"{m:>14.2f}" for m in medians))
        if rounds > 1:
            spreads = [spread([get(run) for run in runs[name]]) for _, get in columns]
            print(f"{name:<12}{'range':<7}" + "".join(f"{s:>14}" for s in spreads))
        print("-" * len(header))
    for name in names:
        print(f"{name} idle, per command (calls/s, last round): {runs[name][-1]['idle']['perCommand']}")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "latency",
        "python": platform.python_version(),
        "shards": SHARDS,
        "rates": args.rates,
        "seconds": args.seconds,
        "members": args.members,
        "idleMembers": args.idle_members,
        "idleShards": args.idle_shards,
        "idleSeconds": args.idle_seconds,
        "rounds": rounds,
        "order": [order(names, r) for r in range(rounds)],
        "backgroundCommandsPerSecond": round(bg, 2),
        "results": runs,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20, help="publishing time per rate")
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[5.0, 1000.0])
    parser.add_argument("--idle-seconds", type=float, default=10)
    parser.add_argument("--members", type=int, default=1, help="rsc members of the latency worker")
    parser.add_argument("--idle-members", type=int, default=1, help="rsc members of the idle worker")
    parser.add_argument("--idle-shards", type=int, default=64, help="shards of the idle stream")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-faststream", action="store_true")
    parser.add_argument("--no-node", action="store_true")
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds <= 0 or args.idle_seconds <= 0 or min(args.rates) <= 0:
        parser.error("--rounds, --seconds, --idle-seconds and --rates must be positive")
    fs_python = None if args.no_faststream else faststream_python()
    with_node = not args.no_node and node_ready()
    if not args.no_node and not with_node:
        print("no node or no clients/node/node_modules (npm ci): rsc-node left out", file=sys.stderr)
    names = [RSC] + ([NODE] if with_node else []) + ([FASTSTREAM] if fs_python else [])
    port = redis_servers.free_port()
    with redis_servers.standalone() as redis_url:
        env = {
            "RSC_REDIS_URL": redis_url,
            "RSC_DEFAULT_SHARD_COUNT": str(SHARDS),
            "RSC_ADMIN_USER": ADMIN[0],
            "RSC_ADMIN_PASSWORD": ADMIN[1],
            # Periodic passes over every shard would blur the idle figures (bursts every 30 s).
            "RSC_CONSUMER_PRUNE_INTERVAL_MS": "3600000",
            "RSC_RETENTION_INTERVAL_MS": "3600000",
        }
        url = f"http://127.0.0.1:{port}"
        serve = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
        with process(serve, env, HERE.parent):
            wait_http(url + "/healthz")
            bench = Bench(args, redis_url, url, fs_python)
            time.sleep(SETTLE_S)
            bench.baseline()
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            for round_ in range(args.rounds):
                for name in order(names, round_):
                    runs[name].append(bench.run(name, round_))
                    print(f"round {round_ + 1}: {name} done", file=sys.stderr)
    report(args, names, runs, bench.background)


if __name__ == "__main__":
    main()
