"""N/N-1: the previous release (tests/compat/BASELINE, built by `tests.compat.baseline`) runs
beside this one on one Redis, with real processes and a publish-and-consume workload.

One fleet covers the three mixes at once: a worker and a producer of each release, all
given both coordinators' URLs and one credential (every coordinator reads it: its pattern
means the same to both releases), while the coordinators roll:

1. the old coordinator is active, the new one a standby: new clients on an old coordinator;
2. the old one stops, the new one takes over, replaying the old one's journal: old clients
   on a new coordinator; raising the feature level is refused, naming the old parts;
3. rollback: the old coordinator starts again and the new one stops; the old one replays what
   the new one wrote (at feature level 1, exactly what the old one writes).

Then the producers stop, everything acknowledged must be handled, nothing pending, no shard
held by two members at once (the chaos suite's history checker), and `rsc journal verify`
passes under both releases. Last, with only new parts left, the level is raised to 2: the
new release writes the versioned journal, and the old one's verify refuses it by name: the
point after which a rollback is no longer possible.

A second test replays the baseline's recorded traffic (`corpus/`) against this release: every
answer must parse with the old client's own wire types and keep the recorded shape.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

import rsc
from rsc.conformance.history import Publish, check, ownership_from_journal
from tests.chaos.test_chaos import (
    AUTH,
    CONCURRENCY,
    DELAY_MAX_MS,
    DELAY_MIN_MS,
    GROUP,
    SERVE_ENV,
    SETPRIV,
    Chaos,
    Child,
    Tail,
    now,
    read_jsonl,
)
from tests.compat.baseline import ROOT, Baseline, build
from tests.redis_servers import free_port

CORPUS = Path(__file__).with_name("corpus")


@attrs.frozen
class Runtime:
    """A release to run: its interpreter and its tree (the working directory and path)."""

    version: str
    python: str
    root: Path


def spawn_in(runtime: Runtime, command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    command = [runtime.python, *command]
    if SETPRIV is not None:
        command = [SETPRIV, "--pdeathsig", "KILL", *command]
    with log.open("wb") as output:
        return subprocess.Popen(command, env=env, cwd=runtime.root, stdout=output, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def baseline() -> Baseline:
    return build()


@pytest.fixture(scope="module")
def old(baseline: Baseline) -> Runtime:
    runtime = Runtime(baseline.version, str(baseline.python), baseline.source)
    found = subprocess.run(
        [runtime.python, "-c", "import rsc; print(rsc.__version__)"],
        cwd=runtime.root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert found == baseline.version != rsc.__version__
    return runtime


NEW = Runtime(rsc.__version__, sys.executable, ROOT)


class Fleet(Chaos):
    """The chaos suite's harness, with a release per process and two coordinators (A, B)."""

    def __init__(self, tmp: Path, old: Runtime) -> None:
        super().__init__(tmp)
        self.old = old
        # Every release's coordinators read one credential, whose pattern (the stream's exact
        # name) means the same to both; every client presents it (RSC_TOKEN, read by both).
        self.token = f"compat-{uuid.uuid4().hex}"
        self.credentials = json.dumps(
            [
                {
                    "name": "fleet",
                    "token": self.token,
                    "roles": ["member", "producer"],
                    "streams": [self.prefix],
                    "create": True,
                }
            ]
        )
        self.slots = {"A": free_port(), "B": free_port()}
        self.clients_url = ",".join(f"http://127.0.0.1:{p}" for p in self.slots.values())
        self.running: dict[str, Child] = {}
        self.runtime_of: dict[str, Runtime] = {}
        self.use("A")

    def use(self, slot: str) -> None:
        """Views and admin calls go to this coordinator from now on."""
        self.http.close()
        self.url = f"http://127.0.0.1:{self.slots[slot]}"
        # (The credential: routing needs one once credentials exist; admin calls use Basic.)
        headers = {"Authorization": f"Bearer {self.token}"}
        self.http = httpx.Client(base_url=self.url, timeout=2.0, headers=headers)

    def env_of(self, runtime: Runtime, **extra: str) -> dict[str, str]:
        return self.env(**extra) | {"PYTHONPATH": str(runtime.root), "RSC_TOKEN": self.token}

    def start(self, runtime: Runtime, slot: str) -> Child:
        log = self.tmp / f"coordinator-{slot}-{runtime.version}-{len(self.coordinators)}.log"
        command = ["-m", "rsc", "serve", "--bind", f"127.0.0.1:{self.slots[slot]}"]
        env = self.env_of(
            runtime, **SERVE_ENV, RSC_REDIS_URL=self.redis.url, RSC_CREDENTIALS=self.credentials
        )
        child = Child(f"coordinator {slot} ({runtime.version})", spawn_in(runtime, command, env, log), log)
        self.coordinators.append(child)
        self.running[slot] = child
        url = f"http://127.0.0.1:{self.slots[slot]}"
        deadline = now() + 30
        while True:  # up (a standby answers /healthz too)
            assert child.process.poll() is None, log.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            assert now() < deadline, log.read_text()
            time.sleep(0.05)
        self.note(f"{child.name} started")
        return child

    def wait_active(self, slot: str) -> None:
        url = f"http://127.0.0.1:{self.slots[slot]}/readyz"

        def active() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(url, timeout=1).status_code == 200
            return False

        assert self.wait_until(active, 20, f"coordinator {slot} to become active"), self.failures
        self.use(slot)

    def stop(self, slot: str) -> None:
        child = self.running.pop(slot)
        code = child.terminate()
        if code != 0:
            self.fail(f"{child.name} did not stop cleanly: {child.death()}")
        self.note(f"{child.name} stopped")

    def start_worker(self, runtime: Runtime | None = None) -> Child:  # type: ignore[override]
        runtime = runtime or NEW
        ip = f"10.0.0.{self.next_ip}"
        self.next_ip += 1
        records = self.tmp / f"records-{ip}.jsonl"
        log = self.tmp / f"worker-{ip}-{runtime.version}.log"
        command = ["-m", "rsc", "worker", "tests.chaos.chaosapp:app"]
        command += ["--coordinator", self.clients_url, "--redis", self.redis.url, "--stop-timeout", "5"]
        env = self.env_of(
            runtime,
            POD_IP=ip,
            RSC_CHAOS_RECORDS=str(records),
            RSC_CHAOS_STREAM=self.prefix,
            RSC_CHAOS_GROUP=GROUP,
            RSC_CHAOS_CONCURRENCY=str(CONCURRENCY),
            RSC_CHAOS_DELAY_MS=f"{DELAY_MIN_MS},{DELAY_MAX_MS}",
        )
        worker = Child(f"worker {ip} ({runtime.version})", spawn_in(runtime, command, env, log), log, ip)
        worker.records, worker.tail = records, Tail(records)
        self.workers.append(worker)
        self.runtime_of[worker.name] = runtime
        self.note(f"{worker.name} started")
        return worker

    def start_producer(self, n: int, runtime: Runtime | None = None) -> None:  # type: ignore[override]
        runtime = runtime or NEW
        log = self.tmp / f"producer-{n}-{runtime.version}.log"
        command = ["-m", "tests.chaos.producer", "--coordinator", self.clients_url, "--redis", self.redis.url]
        command += ["--stream", self.prefix, "--name", f"api-{n}", "--rate", "20"]
        command += ["--out", str(self.tmp / f"published-{n}.jsonl")]
        child = Child(
            f"producer api-{n} ({runtime.version})",
            spawn_in(runtime, command, self.env_of(runtime), log),
            log,
        )
        self.producers.append(child)
        deadline = now() + 30
        while "publishing" not in log.read_text():
            assert child.process.poll() is None, log.read_text()
            assert now() < deadline, log.read_text()
            time.sleep(0.05)

    def supervise(self) -> None:
        for child in [*self.workers, *self.producers, *self.running.values()]:
            if child.process.poll() is not None and not child.stopped:
                child.stopped = True
                self.fail(f"{child.name} exited by itself: {child.death()}")

    def progress(self, label: str) -> None:
        """Every worker finishes a handler call and every producer gets an acknowledgement, now."""
        since = now()
        self.wait_converged(label, since)

        def everyone_works() -> bool:
            ends = all(
                any(r["ev"] == "end" and r["t"] > since for r in read_jsonl(w.records or Path()))
                for w in self.workers
            )
            acks = all(
                any(
                    r["ev"] == "ack" and r["t"] > since for r in read_jsonl(self.tmp / f"published-{n}.jsonl")
                )
                for n in range(len(self.producers))
            )
            return ends and acks

        self.wait_until(everyone_works, 20, f"every worker and producer to make progress ({label})")

    def finish(self) -> Any:
        out = super().finish()
        for child in [*self.workers, *self.producers]:
            child.stopped = True  # stopped on purpose
        return out

    def verify_journals(self, runtime: Runtime) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [runtime.python, "-m", "rsc", "journal", "verify", "--redis-url", self.redis.url],
            cwd=runtime.root,
            env=self.env_of(runtime),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


def brief(report: Any, pending: dict[str, int], drain: float | None, run: Fleet) -> str:
    """What went wrong, short: counts, the first few of each kind of violation, the failures."""
    counts = (
        f"published {report.published}, handled {report.handled}, lost {len(report.lost)}, "
        f"overlaps {len(report.overlaps)}, stale starts {len(report.stale_starts)}, "
        f"order violations {len(report.order_violations)}, pending {sum(pending.values())}, drain {drain}"
    )
    first = [*report.lost[:3], *report.overlaps[:3], *report.stale_starts[:3], *report.order_violations[:3]]
    lines = [counts, *(f"  {x}" for x in first), *(f"failure: {f}" for f in run.failures[:5])]
    return "\n".join([*lines, f"logs in {run.tmp}"])


@contextlib.contextmanager
def fleet(tmp: Path, old: Runtime) -> Iterator[Fleet]:
    run = Fleet(tmp, old)
    try:
        yield run
    finally:
        run.cleanup()


def test_old_and_new_coordinators_workers_and_producers_run_together_and_roll_back(
    tmp_path: Path, old: Runtime
) -> None:
    with fleet(tmp_path, old) as run:
        run.redis.start()
        run.start(old, "A")
        run.wait_active("A")
        assert (
            run.http.put(f"/v1/admin/streams/{run.prefix}", json={"shardCount": 4}, auth=AUTH).status_code
            == 200
        )
        group = run.http.put(
            f"/v1/admin/streams/{run.prefix}/groups/{GROUP}", json={"startFrom": "earliest"}, auth=AUTH
        )
        assert group.status_code == 200, group.text
        run.start(NEW, "B")  # a standby
        old_worker = run.start_worker(old)
        run.start_worker(NEW)
        run.start_producer(0, old)
        run.start_producer(1, NEW)

        run.context = "old coordinator, old and new clients"
        run.progress("start")

        run.context = "rolling upgrade: the new coordinator takes over"
        run.stop("A")
        run.wait_active("B")
        run.progress("upgrade")
        assert run.http.get("/v1/version").json()["serverVersion"] == rsc.__version__
        refused = run.http.put("/v1/admin/features", json={"level": 2}, auth=AUTH)
        assert (refused.status_code, refused.json()["error"]) == (409, "FEATURE_LEVEL_NOT_SUPPORTED"), (
            refused.text
        )
        blockers = {b["name"] for b in refused.json()["details"]["blockers"]}
        assert {f"{run.prefix}/{GROUP}/{m}" for m in old_worker.members} <= blockers
        assert f"{run.prefix}/api-0" in blockers

        run.context = "rollback: the old coordinator takes over again"
        run.start(old, "A")
        run.stop("B")
        run.wait_active("A")
        run.progress("rollback")
        assert run.http.get("/v1/version").json()["serverVersion"] == old.version

        publishes, pending, drain = run.finish()
        run.offsets.append(run.clock_offset())
        ownership = ownership_from_journal(run.journal(), sum(run.offsets) / len(run.offsets))
        report = check(run.records(), publishes, run.faults, ownership)
        text = brief(report, pending, drain, run)
        assert report.published > 100, text
        assert report.ok, text
        assert not any(pending.values()), text
        assert not run.failures, text
        for runtime in (old, NEW):
            verified = run.verify_journals(runtime)
            assert verified.returncode == 0, f"{runtime.version}: {verified.stdout}{verified.stderr}"

        finalize_level_2(run, old)


def test_old_clients_ride_through_redis_losing_everything(tmp_path: Path, old: Runtime) -> None:
    """An N-1 worker and producer on a new coordinator through both corrections (issue 26):

    1. FLUSHALL under the running coordinator: it writes back what it holds; the old clients
       see a pause, keep their layout and epochs;
    2. FLUSHALL while no coordinator runs: the next one rebuilds the stream (above the layout
       version the old producer and worker report) and the group from what they report; the
       old worker rejoins, the old producer takes the new layout as an ordinary change.

    Every publish acknowledged after each flush is handled; no entry is handled by two members
    at once; the journals verify under both releases. (Entries only in the flushed data are
    gone: Redis' durability.)"""
    import redis as redis_py

    with fleet(tmp_path, old) as run:
        run.redis.start()
        run.start(NEW, "A")
        run.wait_active("A")
        assert run.http.put(f"/v1/admin/streams/{run.prefix}", json={"shardCount": 4}, auth=AUTH).is_success
        group = run.http.put(
            f"/v1/admin/streams/{run.prefix}/groups/{GROUP}", json={"startFrom": "earliest"}, auth=AUTH
        )
        assert group.status_code == 200, group.text
        run.start_worker(old)
        run.start_producer(0, old)
        run.context = "old clients on a new coordinator"
        run.progress("start")
        version = run.http.get(f"/v1/streams/{run.prefix}/routing").json()["metadataVersion"]

        run.context = "FLUSHALL under the running coordinator"
        with redis_py.Redis.from_url(run.redis.url) as client:
            client.flushall()
        # (A publish Redis took before the flush may be acknowledged just after it returns.)
        first = now() + 0.5
        run.progress("after a FLUSHALL")
        assert run.http.get(f"/v1/streams/{run.prefix}/routing").json()["metadataVersion"] == version

        time.sleep(3)  # publishes after the flush
        drained_at = now()
        if not run.wait_until(
            lambda: not unhandled(run, first, drained_at), 30, "the publishes after the flush"
        ):
            raise AssertionError(f"not handled: {unhandled(run, first, drained_at)[:20]}; logs in {run.tmp}")

        run.context = "FLUSHALL while no coordinator runs"
        run.stop("A")
        with redis_py.Redis.from_url(run.redis.url) as client:
            client.flushall()
        second = now() + 0.5
        run.start(NEW, "B")
        run.wait_active("B")
        run.progress("rebuilt from what the old clients know")
        time.sleep(3)  # publishes after the rebuild
        rebuilt = run.http.get(f"/v1/streams/{run.prefix}/routing").json()
        assert rebuilt["metadataVersion"] > version
        assert len(rebuilt["shards"]) == 4

        run.producers[0].stopped = True
        assert run.producers[0].terminate() == 0
        windows = ((first, drained_at), (second, now()))
        ended = run.wait_until(lambda: not any(unhandled(run, *w) for w in windows), 30, "the drain")
        assert ended, [unhandled(run, *w)[:10] for w in windows]
        publishes = [Publish.from_json(r) for r in read_jsonl(run.tmp / "published-0.jsonl")]
        must = [p for p in publishes if p.ev == "ack" and any(a < p.t <= b for a, b in windows)]
        assert len(must) > 80, len(must)
        report = check(run.records(), publishes, run.faults, [])
        assert not report.overlaps, report.overlaps[:3]  # never two members on one entry at once
        assert not run.failures, run.failures
        for runtime in (old, NEW):
            verified = run.verify_journals(runtime)
            assert verified.returncode == 0, f"{runtime.version}: {verified.stdout}{verified.stderr}"


def unhandled(run: Fleet, since: float, until: float) -> list[tuple[str, float]]:
    """Publishes acknowledged between `since` and `until` and not handled: (mid, s after since)."""
    done = {r.mid for r in run.records() if r.ev == "end"}
    acked = [r for r in read_jsonl(run.tmp / "published-0.jsonl") if r["ev"] == "ack"]
    return [
        (r["mid"], round(float(r["t"]) - since, 2))
        for r in acked
        if since < float(r["t"]) <= until and r["mid"] not in done
    ]


def finalize_level_2(run: Fleet, old: Runtime) -> None:
    """With only new parts left, raise the level: the versioned journal is written, and the old
    release can no longer read it (the end of the rollback window)."""
    run.context = "finalizing level 2: no way back after it"
    run.start(NEW, "B")
    run.stop("A")
    run.wait_active("B")
    raised = run.http.put("/v1/admin/features", json={"level": 2}, auth=AUTH)
    assert raised.status_code == 200, raised.text
    # Anything written now is level 2 data: the versioned journal.
    beat = {
        "protocolVersion": 2,
        "streamPrefix": run.prefix,
        "consumerGroup": GROUP,
        "memberId": "late",
        "incarnation": "i",
        "memberEpoch": 0,
    }
    assert run.http.post("/v1/heartbeat", json=beat).json()["featureLevel"] == 2
    assert run.verify_journals(NEW).returncode == 0
    refused_by_old = run.verify_journals(old)
    assert refused_by_old.returncode != 0
    assert "schemaVersion 2" in refused_by_old.stdout + refused_by_old.stderr
    assert not run.failures, run.failures


# --- recorded traffic -----------------------------------------------------------------


def _shape(value: Any) -> Any:
    """The structure of a JSON value: keys and types, not values."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


OLD_CLIENT_PARSES = """
import json, sys
from rsc.events import codec
from rsc.events.wire import HeartbeatResponse, ProducerHeartbeatResponse
types = {"/v1/heartbeat": HeartbeatResponse, "/v1/producers/heartbeat": ProducerHeartbeatResponse}
for exchange in json.load(sys.stdin):
    path, body = exchange["path"], exchange["response"]
    if exchange["status"] != 200:
        assert set(body) >= {"error", "message"}, exchange
    elif path in types:
        codec.converter.structure(body, types[path])
    elif path == "/v1/heartbeats":
        for item in body["responses"]:
            if "error" not in item:
                codec.converter.structure(item, HeartbeatResponse)
print("parsed", len(json.load(open(sys.argv[1]))))
"""


def test_the_baselines_recorded_traffic_still_gets_answers_an_old_client_reads(
    standalone_url: str, old: Runtime, tmp_path: Path
) -> None:
    from tests.compat.corpus_tool import replay

    corpus = sorted(CORPUS.glob("*.json"))
    assert corpus, "no recorded traffic: python -m tests.compat.corpus_tool record"
    for path in corpus:
        recorded = json.loads(path.read_text())
        answered = replay(recorded, standalone_url)
        for was, now_ in zip(recorded, answered, strict=True):
            where = f"{path.name}: {was['method']} {was['path']} ({was['note']})"
            assert now_["status"] == was["status"], f"{where}: {now_}"
            if was["status"] == 200:
                assert _shape(now_["response"]) == _shape(was["response"]), where
            else:
                assert now_["response"]["error"] == was["response"]["error"], where
        out = tmp_path / path.name
        out.write_text(json.dumps(answered))
        parsed = subprocess.run(
            [old.python, "-c", OLD_CLIENT_PARSES, str(out)],
            input=out.read_text(),
            cwd=old.root,
            env={"PYTHONPATH": str(old.root), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=False,
        )
        assert parsed.returncode == 0, parsed.stderr


def test_an_old_worker_pauses_with_its_group(tmp_path: Path, old: Runtime) -> None:
    """A group paused by an operator (feature level 7) with an N-1 worker in it: the old worker
    sees an empty assignment, hands its shards back and handles nothing until the resume, like
    the new one; nothing published meanwhile is lost."""
    with fleet(tmp_path, old) as run:
        run.redis.start()
        run.start(NEW, "A")
        run.wait_active("A")
        stream = f"/v1/admin/streams/{run.prefix}"
        assert run.http.put(stream, json={"shardCount": 4}, auth=AUTH).status_code == 200
        made = run.http.put(f"{stream}/groups/{GROUP}", json={"startFrom": "earliest"}, auth=AUTH)
        assert made.status_code == 200, made.text
        run.start_worker(old)
        run.start_worker(NEW)
        run.start_producer(0, NEW)
        run.context = "an old and a new worker in one group"
        run.progress("before the pause")

        paused = run.http.post(f"{stream}/groups/{GROUP}/pause", json={"reason": "compat"}, auth=AUTH)
        assert paused.status_code == 200, paused.text
        view = f"/v1/streams/{run.prefix}/groups/{GROUP}"

        def handed_back() -> bool:
            return not run.http.get(view).json()["currentAssignment"]

        assert run.wait_until(handed_back, 20, "every shard handed back"), run.failures
        quiet_from = now() + 0.5  # a call in flight at the revoke may still end
        time.sleep(3)
        starts = [
            r
            for w in run.workers
            for r in read_jsonl(w.records or Path())
            if r["ev"] == "start" and r["t"] > quiet_from
        ]
        assert not starts, starts[:3]
        assert run.http.post(f"{stream}/groups/{GROUP}/resume", auth=AUTH).status_code == 200
        run.progress("after the resume")  # every worker (the old one too) handles again

        publishes, pending, drain = run.finish()
        report = check(run.records(), publishes, run.faults, [])
        text = brief(report, pending, drain, run)
        assert not report.lost, text
        assert not report.overlaps, text
        assert not run.failures, text
