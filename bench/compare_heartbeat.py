"""Benchmark: heartbeats of this checkout against an earlier commit, in alternating rounds.

Starts three coordinators, each on a private redis-server: the code of
`--base` (a git ref, checked out into a temporary worktree), this checkout,
and this checkout with credentials configured (every request carries
`Authorization: Bearer`). Then it drives single and batched heartbeats at
each in turn, reversing the order every round, and reports the median of
the per-round ratios to the base: on a shared 2-vCPU machine the figures
drift by about 10 % between rounds, and pairing the rounds cancels most of
that. Prints a table and writes bench/results/compare_heartbeat.json.

    python bench/compare_heartbeat.py [--base 9514f73] [--rounds 6] [--seconds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import heartbeat as bench  # the wrk driver and helpers of bench/heartbeat.py

from tests import redis_servers

ROOT = Path(__file__).resolve().parent.parent
from bench._results import results_path  # noqa: E402

RESULTS = results_path("compare_heartbeat.json")


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rsc-base-") as tmp:
        path = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(path), ref], cwd=ROOT, check=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="9514f73", help="git ref to compare with")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    bench.require_wrk("bench/compare_heartbeat.py")
    credentials = json.dumps([{"name": "bench", "token": bench.TOKEN, "roles": ["member"], "create": True}])
    with (
        worktree(args.base) as base_tree,
        tempfile.TemporaryDirectory() as tmp,
        contextlib.ExitStack() as stack,
    ):
        specs = {
            "base": (base_tree, {}),
            "current": (ROOT, {}),
            "currentWithCredentials": (ROOT, {"RSC_CREDENTIALS": credentials}),
        }
        urls = {}
        for name, (tree, extra) in specs.items():
            redis_url = stack.enter_context(redis_servers.standalone())
            port = redis_servers.free_port()
            env = {
                "RSC_REDIS_URL": redis_url,
                "RSC_HEARTBEAT_INTERVAL_MS": "3000",
                "RSC_MEMBER_LEASE_TTL_MS": "60000",
                # wrk sends one member's heartbeat as fast as it can: no member does that, and the
                # per-member limit (10 per interval) would answer nearly all of it with 429.
                "RSC_RATE_LIMIT_PARTY_PER_INTERVAL": "0",
                "PYTHONPATH": str(tree),
                **extra,
            }
            command = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
            # cwd: `python -m rsc` imports from the working directory before PYTHONPATH
            url = f"http://127.0.0.1:{port}/healthz"
            stack.enter_context(bench.process(command, env, url, cwd=str(tree)))
            urls[name] = f"http://127.0.0.1:{port}"
        bodies = {}
        for name, url in urls.items():
            token = bench.TOKEN if name == "currentWithCredentials" else ""
            one = bench.join(url, ["10.8.0.1/bench/0"], "bench", token)[0]
            hundred = bench.join(url, [f"10.9.0.{i}/bench/0" for i in range(100)], "bench-batch", token)
            bodies[name] = (one, {"heartbeats": hundred}, token)
        rates: dict[str, dict[str, list[int]]] = {name: {"single": [], "batch": []} for name in urls}
        for round_ in range(args.rounds):
            for name in list(urls) if round_ % 2 == 0 else list(reversed(urls)):
                one, batch, token = bodies[name]
                work = Path(tmp)
                single = bench.wrk(urls[name] + "/v1/heartbeat", one, args.seconds, 32, work, token=token)
                batched = bench.wrk(urls[name] + "/v1/heartbeats", batch, args.seconds, 32, work, token=token)
                rates[name]["single"].append(single["requestsPerSecond"])
                rates[name]["batch"].append(batched["requestsPerSecond"] * 100)
    report: dict[str, object] = {"benchmark": "compare_heartbeat", "base": args.base, "rates": rates}
    ratios = {}
    print(f"{args.rounds} rounds of {args.seconds:g} s, 32 connections; base = {args.base}\n")
    header = f"{'coordinator':<26} {'single req/s':>13} {'ratio':>7} {'batched hb/s':>13} {'ratio':>7}"
    print(header)
    print("-" * len(header))
    for name in urls:
        row = {}
        for kind in ("single", "batch"):
            paired = [n / b for n, b in zip(rates[name][kind], rates["base"][kind], strict=True)]
            row[kind] = round(statistics.median(paired), 3)
        ratios[name] = row
        print(
            f"{name:<26} {statistics.median(rates[name]['single']):>13.0f} {row['single']:>7.2f} "
            f"{statistics.median(rates[name]['batch']):>13.0f} {row['batch']:>7.2f}"
        )
    print("\nratio: median over rounds of (this coordinator / base) in the same round")
    report["medianPairedRatios"] = ratios
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
