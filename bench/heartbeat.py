"""Benchmark: heartbeats per second through `rsc serve`, next to raw hypercorn-trio ASGI.

Starts a private redis-server, the coordinator (`python -m rsc serve`) and a
minimal raw ASGI app on hypercorn-trio, each in its own process, then drives
them from this process with httpx on trio over loopback:

* raw ASGI: POST of a small JSON body answered with a small JSON body, on stock hypercorn-trio
  (the anchor) and on rsc's own HTTP server (`rsc.http.server.serve_http`, a stricter anchor:
  the same server code as the coordinator, so what is left is the coordinator's own work);
* single heartbeats: steady members (each echoes its epoch), one per request;
* batched heartbeats: 100 members per `POST /v1/heartbeats`, twice: members that only echo
  their first epoch (their group never reconciles: one member holds shards it never hands
  over, so every heartbeat finds a revoke pending), and the steady state of a fleet (members
  that acknowledge revokes and report what they own, sent once their group reconciled);
* latency under light load (2 connections);
* single and batched heartbeats again on a second coordinator with
  credentials configured (each request carries `Authorization: Bearer`),
  to show what authentication costs.

The load generator shares the machine's cores with the servers, so absolute
figures are a floor; the ratio single / raw is the figure to watch.

The load comes from wrk (Debian package `wrk`, installed by `make bench`);
an httpx client in one process saturated long before the servers did. The
latency row paces wrk (its `delay()` hook) at half the maximum single rate.
Prints a table and writes bench/results/heartbeat.json.

    python bench/heartbeat.py [--seconds 5] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._results import results_path
from tests import redis_servers

RESULTS = results_path("heartbeat.json")
TOKEN = "bench-member-token-0123456789"
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

#: The same raw app on rsc's own HTTP server (`rsc.http.server.serve_http`: hypercorn's protocol
#: with rsc's connection handling and one write per answer), a stricter anchor: what is left
#: between it and the coordinator is the coordinator's own work.
RAW_ON_RSC = """
import sys
import trio
from rawapp import app
from rsc.http.server import Limits, hypercorn_config, serve_http

async def main():
    limits = Limits()
    await serve_http(app, hypercorn_config(sys.argv[1], limits), limits, shutdown_trigger=trio.sleep_forever)

trio.run(main)
"""


@contextlib.contextmanager
def process(
    args: list[str], env: dict[str, str], url: str, cwd: str | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `args` until the block ends, once `url` answers. `cwd`: where `python -m` finds its
    package first (the working directory comes before PYTHONPATH)."""
    proc = subprocess.Popen(
        args, env={**os.environ, **env}, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(url, timeout=1)
                break
            time.sleep(0.1)
        yield proc
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


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = io.open(os.getenv("RSC_BENCH_BODY")):read("*a")
local token = os.getenv("RSC_BENCH_TOKEN") or ""
if token ~= "" then wrk.headers["Authorization"] = "Bearer " .. token end
local pause = tonumber(os.getenv("RSC_BENCH_DELAY_MS") or "0")
if pause > 0 then
  -- random pauses (mean `pause`) keep the connections from firing in step
  function delay() return math.random(0, 2 * pause) end
end
"""


def wrk(
    url: str,
    body: dict[str, Any],
    seconds: float,
    connections: int,
    workdir: Path,
    delay_ms: int = 0,
    threads: int = 2,
    token: str = "",
) -> dict[str, Any]:
    """Drive `url` with wrk POSTing `body`; requests/s and latency percentiles.

    With `delay_ms`, each connection waits that long before each request
    (wrk's `delay()` hook): a paced load instead of as fast as possible.
    """
    body_file = workdir / "body.json"
    body_file.write_text(json.dumps(body))
    script = workdir / "post.lua"
    script.write_text(WRK_SCRIPT)
    args = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{seconds:g}s",
        "--latency",
        "-s",
        str(script),
        url,
    ]
    env = {
        **os.environ,
        "RSC_BENCH_BODY": str(body_file),
        "RSC_BENCH_DELAY_MS": str(delay_ms),
        "RSC_BENCH_TOKEN": token,
    }
    out = subprocess.run(args, capture_output=True, text=True, check=True, env=env).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "requestsPerSecond": round(rps),
        "p50Ms": _percentile(out, "50%"),
        "p99Ms": _percentile(out, "99%"),
        "non2xx": int(errors.group(1)) if errors else 0,
    }


def _percentile(out: str, label: str) -> float:
    match = re.search(rf"\s{label}\s+([\d.]+)(us|ms|s)", out)
    assert match, out
    value, unit = float(match.group(1)), match.group(2)
    return round(value / 1000 if unit == "us" else value * 1000 if unit == "s" else value, 2)


def server_buckets(rsc_url: str) -> dict[float, float]:
    """The server's own `rsc_heartbeat_seconds` buckets for single heartbeats (cumulative counts)."""
    return buckets_in(httpx.get(rsc_url + "/metrics", timeout=10).text, "single")


def buckets_in(metrics: str, endpoint: str) -> dict[float, float]:
    """`rsc_heartbeat_seconds` buckets of `endpoint` (single or batch) in a /metrics text."""
    pattern = rf'rsc_heartbeat_seconds_bucket\{{endpoint="{endpoint}",le="([^"]+)"\}} ([\d.e+]+)'
    return {float(le): float(count) for le, count in re.findall(pattern, metrics)}


def server_p99(before: dict[float, float], after: dict[float, float], q: float = 0.99) -> float | None:
    """The upper bound (ms) of the bucket holding the `q` quantile (the 99th percentile) of
    what happened in between."""
    delta = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = delta.get(float("inf"), 0.0)
    for le, count in delta.items():
        if total and count >= q * total:
            return le * 1000
    return None


def join(rsc_url: str, members: list[str], stream: str, token: str = "") -> list[dict[str, Any]]:
    """Join `members` and heartbeat once more; return their steady heartbeats."""
    steady = []
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=rsc_url, timeout=30, headers=headers) as client:
        for member in members:
            epoch = client.post("/v1/heartbeat", json=heartbeat(member, 0, stream)).json()["memberEpoch"]
            epoch = client.post("/v1/heartbeat", json=heartbeat(member, epoch, stream)).json()["memberEpoch"]
            steady.append(heartbeat(member, epoch, stream))
    return steady


def settle(rsc_url: str, members: list[str], stream: str) -> list[dict[str, Any]]:
    """Join `members` and heartbeat them as members do (the epoch answered, the shards assigned
    reported as owned, revokes acknowledged) until their group is reconciled: every answer
    OK and nothing moved in a round. Their heartbeats then, the steady state of a fleet."""
    bodies = {m: {**heartbeat(m, 0, stream), "protocolVersion": 2, "ownedShards": []} for m in members}
    with httpx.Client(base_url=rsc_url, timeout=30) as client:
        for _ in range(200):
            answers = client.post("/v1/heartbeats", json={"heartbeats": list(bodies.values())}).json()
            moved = False
            for member, item in zip(members, answers["responses"], strict=True):
                body, assignment = bodies[member], item["assignment"]
                revoked = sorted(assignment["revoke"])
                owned = sorted(set(assignment["assigned"]) - set(revoked))
                if revoked:
                    body["revokedShards"] = revoked
                else:
                    body.pop("revokedShards", None)
                moved |= body["memberEpoch"] != item["memberEpoch"] or body["ownedShards"] != owned
                moved |= bool(revoked) or item["status"] != "OK"
                body.update(memberEpoch=item["memberEpoch"], ownedShards=owned)
                body["metadataVersion"] = item["metadataVersion"]
            if not moved:
                return list(bodies.values())
            time.sleep(0.05)
    raise RuntimeError(f"the group of {len(members)} members did not settle")


def statuses(url: str, body: dict[str, Any], token: str = "") -> dict[str, int]:
    """How many items of the batch `body` are answered with each status (or error) now."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answers = httpx.post(url + "/v1/heartbeats", json=body, headers=headers, timeout=30).json()["responses"]
    return dict(Counter(item.get("status") or item.get("error") for item in answers))


def run(
    args: argparse.Namespace, raw_url: str, raw_rsc_url: str, rsc_url: str, auth_url: str, workdir: Path
) -> dict[str, Any]:
    one = join(rsc_url, ["10.8.0.1/bench/0"], "bench")[0]
    auth_one = join(auth_url, ["10.8.0.1/bench/0"], "bench", TOKEN)[0]
    c = args.concurrency
    # raw, raw on rsc's server and single alternate (ABC, CBA...) for `--rounds` rounds: the
    # machine drifts between runs, and the per-round ratio, not one run of each, is the figure
    # (its median).
    urls = {"raw": raw_url + "/", "rawRsc": raw_rsc_url + "/", "single": rsc_url + "/v1/heartbeat"}
    pairs = []
    for round_ in range(args.rounds):
        order = list(urls) if round_ % 2 == 0 else list(reversed(urls))
        pairs.append({name: wrk(urls[name], one, args.seconds, c, workdir) for name in order})
    ratios = [p["single"]["requestsPerSecond"] / p["raw"]["requestsPerSecond"] for p in pairs]
    strict = [p["single"]["requestsPerSecond"] / p["rawRsc"]["requestsPerSecond"] for p in pairs]
    middle = sorted(range(len(pairs)), key=lambda i: ratios[i])[len(pairs) // 2]
    results = {
        "raw": pairs[middle]["raw"],
        "rawRsc": pairs[middle]["rawRsc"],
        "single": pairs[middle]["single"],
        "singleToRawPerRound": [round(r, 3) for r in ratios],
        "singleToRawRscPerRound": [round(r, 3) for r in strict],
        "singleAuth": wrk(auth_url + "/v1/heartbeat", auth_one, args.seconds, c, workdir, token=TOKEN),
    }
    # Each batch's members join (or settle) just before their run: members that joined before
    # the single rounds would have outlived their lease by now, and a fenced member's heartbeat
    # is a refusal, not the heartbeat of a live member.
    batches = {
        "batch": (
            rsc_url,
            lambda: join(rsc_url, [f"10.9.0.{i}/bench/0" for i in range(100)], "bench-batch"),
            "",
        ),
        "batchSettled": (
            rsc_url,
            lambda: settle(rsc_url, [f"10.10.0.{i}/bench/0" for i in range(100)], "bench-settled"),
            "",
        ),
        "batchAuth": (
            auth_url,
            lambda: join(auth_url, [f"10.9.0.{i}/bench/0" for i in range(100)], "bench-batch", TOKEN),
            TOKEN,
        ),
    }
    for key, (url, members, token) in batches.items():
        body = {"heartbeats": members()}
        results[key] = wrk(url + "/v1/heartbeats", body, args.seconds, c, workdir, token=token)
        results[key]["statuses"] = statuses(url, body, token)  # what the members were answered
    # Half the maximum single rate, paced: 16 connections, each pausing between requests.
    half = results["single"]["requestsPerSecond"] / 2
    pause_ms = max(1, round(16 * 1000 / half) - 2)
    before = server_buckets(rsc_url)
    results["singleHalfRate"] = wrk(
        rsc_url + "/v1/heartbeat", one, args.seconds, 16, workdir, delay_ms=pause_ms, threads=1
    )
    results["singleHalfRate"]["targetRequestsPerSecond"] = round(half)
    results["singleHalfRate"]["serverP99MsAtMost"] = server_p99(before, server_buckets(rsc_url))
    for key in ("batch", "batchSettled", "batchAuth"):
        results[key]["memberHeartbeatsPerSecond"] = results[key]["requestsPerSecond"] * 100
    return results


def require_wrk(benchmark: str) -> None:
    """Exit with one line (no traceback) when wrk, which drives the load, is not installed."""
    if shutil.which("wrk") is None:
        raise SystemExit(f"{benchmark} needs wrk to drive its load: apt-get install wrk (make bench does)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of raw, raw on rsc, single")
    args = parser.parse_args()
    require_wrk("bench/heartbeat.py")
    raw_port = redis_servers.free_port()
    raw_rsc_port = redis_servers.free_port()
    rsc_port = redis_servers.free_port()
    auth_port = redis_servers.free_port()
    with redis_servers.standalone() as redis_url, tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "rawapp.py").write_text(RAW_APP)
        (Path(tmp) / "raw_on_rsc.py").write_text(RAW_ON_RSC)
        repo = str(Path(__file__).resolve().parent.parent)
        raw_rsc_cmd = [sys.executable, str(Path(tmp) / "raw_on_rsc.py"), f"127.0.0.1:{raw_rsc_port}"]
        raw_rsc_url = f"http://127.0.0.1:{raw_rsc_port}"
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
        auth_cmd = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{auth_port}"]
        raw_url, rsc_url = f"http://127.0.0.1:{raw_port}", f"http://127.0.0.1:{rsc_port}"
        auth_url = f"http://127.0.0.1:{auth_port}"
        env_raw = {"PYTHONPATH": tmp}
        env_rsc = {
            "RSC_REDIS_URL": redis_url,
            "RSC_HEARTBEAT_INTERVAL_MS": "3000",
            "RSC_MEMBER_LEASE_TTL_MS": "60000",
            # wrk sends one member's heartbeat as fast as it can: no member does that, and the
            # per-member limit (10 per interval) would answer nearly all of it with 429.
            "RSC_RATE_LIMIT_PARTY_PER_INTERVAL": "0",
        }
        credentials = [{"name": "bench", "token": TOKEN, "roles": ["member"], "create": True}]
        env_auth = {**env_rsc, "RSC_CREDENTIALS": json.dumps(credentials)}
        # The second coordinator has its own Redis: one active coordinator per Redis.
        with (
            process(raw_cmd, env_raw, raw_url + "/"),
            process(raw_rsc_cmd, {"PYTHONPATH": f"{tmp}:{repo}"}, raw_rsc_url + "/"),
            process(rsc_cmd, env_rsc, rsc_url + "/healthz"),
            redis_servers.standalone() as auth_redis,
        ):
            env_auth["RSC_REDIS_URL"] = auth_redis
            with process(auth_cmd, env_auth, auth_url + "/healthz"):
                results = run(args, raw_url, raw_rsc_url, rsc_url, auth_url, Path(tmp))
    report(args, results)


def report(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Print the table and the ratios; write the JSON."""
    ratio = statistics.median(results["singleToRawPerRound"])
    strict = statistics.median(results["singleToRawRscPerRound"])
    capacity = results["batch"]["memberHeartbeatsPerSecond"] * 3
    print(f"{args.concurrency} requests in flight, {args.seconds:g} s each\n")
    header = f"{'run':<34} {'req/s':>8} {'member hb/s':>12} {'p50 ms':>8} {'p99 ms':>8}"
    print(header)
    print("-" * len(header))
    for name, key in [
        ("raw hypercorn-trio ASGI", "raw"),
        ("raw ASGI on rsc's HTTP server", "rawRsc"),
        ("single heartbeats", "single"),
        ("single, with a bearer credential", "singleAuth"),
        ("batched heartbeats (100/request)", "batch"),
        ("batched, a reconciled group", "batchSettled"),
        ("batched, with a bearer credential", "batchAuth"),
        ("single, paced at half the max rate", "singleHalfRate"),
    ]:
        r = results[key]
        per = r.get("memberHeartbeatsPerSecond", r["requestsPerSecond"] if not key.startswith("raw") else "-")
        print(f"{name:<34} {r['requestsPerSecond']:>8} {per:>12} {r['p50Ms']:>8} {r['p99Ms']:>8}")
    shown = " ".join(f"{r:.0%}" for r in results["singleToRawPerRound"])
    rounds = args.rounds
    print(f"\nsingle / raw ASGI (the anchor, same run): {ratio:.0%}, median of {rounds} alternating rounds")
    print(f"  per round: {shown}; goal >= 90%, floor 80%")
    shown = " ".join(f"{r:.0%}" for r in results["singleToRawRscPerRound"])
    print(f"single / the same raw app on rsc's HTTP server (a stricter anchor): {strict:.0%}")
    print(f"  per round: {shown}")
    single_auth = results["singleAuth"]["requestsPerSecond"] / results["single"]["requestsPerSecond"]
    batch_auth = results["batchAuth"]["requestsPerSecond"] / results["batch"]["requestsPerSecond"]
    print(f"with credentials / without: single {single_auth:.0%}, batched {batch_auth:.0%} (target >= 90%)")
    print(
        f"batched: {results['batch']['memberHeartbeatsPerSecond']} member-heartbeats/s, a reconciled "
        f"group {results['batchSettled']['memberHeartbeatsPerSecond']} (goal >= 50,000)"
    )
    answered = ", ".join(
        f"{key} {results[key]['statuses']}" for key in ("batch", "batchSettled", "batchAuth")
    )
    print(f"  the batches' members were answered (after their runs): {answered}")
    print(f"members one coordinator carries at a 3 s interval (batched): about {capacity:,}")
    half = results["singleHalfRate"]
    print(
        f"p99 at half the max rate ({half['requestsPerSecond']} req/s, aimed at "
        f"{half['targetRequestsPerSecond']}): {half['p99Ms']} ms as wrk saw it (target: < 50 ms); "
        f"inside the server (its histogram): <= {half['serverP99MsAtMost']} ms"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "heartbeat",
        "python": platform.python_version(),
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "results": results,
        "singleToRawRatio": round(ratio, 3),
        "singleToRawOnRscServerRatio": round(strict, 3),
        "authToPlainRatio": {"single": round(single_auth, 3), "batch": round(batch_auth, 3)},
        "membersAt3sInterval": capacity,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
