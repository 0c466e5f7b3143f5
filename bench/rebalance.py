"""Benchmark: how long a moved shard sits idle in a rebalance, and what the rebalance costs the others.

Starts a private redis-server and the coordinator (`python -m rsc serve`, default timing: 3 s
heartbeat interval, 10 s member lease). For each mode, on a fresh stream of `--shards` shards, a
publisher in this process (the synchronous producer, keyless round robin, each message stamped
with `time.monotonic()`, one clock for every process of the machine) publishes `--rate` msg/s
throughout, while worker processes (bench/rebalance_app.py: an `App`, one listener of concurrency
1, one member each) handle and record every message. The scenario:

1. three workers, steady for `--steady` seconds;
2. `--cycles` times: a new worker joins; once the group is stable again and `--settle` seconds
   and a random part of a heartbeat interval passed (so that events do not all fall at the same
   point of the members' heartbeat cycles), a worker leaves gracefully (SIGTERM: `App.stop()`, it
   hands its shards over and leaves), and the same pause follows;
3. a worker crashes (SIGKILL): its shards move only once its lease ended (10 s), so that event is
   lease-bound and reported on its own line.

The worker that leaves or crashes is the one holding the fewest shards (the oldest of those), so
that its shards go to some of the others only and the rest stay uninvolved.

This process polls the group view (`GET /v1/streams/{p}/groups/{g}`) every 50 ms: an event's
rebalance window runs from the first view showing the new group epoch (the join, the leave, the
fence at the end of the lease) to the first view where the group is stable again (every member
`STABLE` at that epoch); the shard owners before and after come from the stable views around it.

Measured per event kind:

* moved shards: the idle gap from the old owner's last handled message of the shard to the new
  owner's first: p50, p99, max (n is small: a few shards move per event; `--cycles` adds more),
  and the part of it after the release (the heartbeat that released the shard was answered; for
  a crash, the fence);
* uninvolved members (in the group before and after, their shards unchanged): the messages they
  handled within the rebalance window against those published to their shards meanwhile, as a
  dip in % (0: kept up; 100: handled nothing). Comparing with what was published rather than
  with a rate measured before keeps a publisher that falls behind on a busy machine out of it;
  the window ends 0.25 s before the group was seen stable, so that the catch-up of a member that
  paused (eager) never counts in. The JSON also has the dip against the steady rate.

Modes (see bench/rebalance_app.py): `push` (default member settings: long-poll heartbeats while
shards are pending), `interval` (`MemberSettings(long_poll=False)`), `eager` (push plus a
stop-the-world gate: every member stops reading all its shards while the group view shows a
rebalance, like Kafka's eager protocol).

For each moved shard the JSON also keeps the handoff timeline from the workers' traces: the old
owner's last handled message, its revoke (began, ended), the heartbeat that released the shard
(the first reporting it revoked; sent, answered: the release happens in between), the new
owner's heartbeat whose answer installed the shard (sent, answered, waitMs: `held` when it was
a long poll waiting at the release), the poller's `assigned` call, the end of its first claim of
the shard (`1st read`: the backlog and the first new entries, one call) and the first handled message.
The table prints the median of each step per mode and event
kind. Per mode it also gives the coordinator's CPU, its own timing of heartbeat requests
(`rsc_heartbeat_seconds` from /metrics), and how long the coordinator and the workers were
runnable but waiting for a CPU (/proc/<pid>/schedstat): on a busy machine that wait, not rsc,
is most of a handoff.

    python bench/rebalance.py [--modes push,interval,eager] [--rate 200] [--shards 10]
                              [--steady 3] [--settle 2] [--cycles 2] [--quick]

`--quick` is `--steady 2 --settle 1.5 --cycles 1` (about 1.5 minutes). Prints a table and writes
bench/results/rebalance.json. A default run takes about 3 minutes.

`--scenario rolling` measures rolling restarts instead (docs/consumers.md, "Rolling restarts and
static membership"), for static members (`RSC_INSTANCE_ID`, the default) and for members that are
not static (`RSC_STATIC=false`, the same member ids): three workers with stable ids; each in
turn gets SIGTERM and a replacement with its id is started as soon as it exited; then one is
killed (SIGKILL) and replaced at once. Per event: the replacement's start-up time, the shard
moves seen in the group view (a shard's owner changing, counted on the restarted member's shards
and on the others'), whether the restarted member got exactly its shards back, and how long each
of its shards sat idle (from the last message handled before the event to the first after).
Writes bench/results/rebalance-rolling.json. About 2 minutes at `--shards 12`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.consumer import process, wait_http
from rsc.client.sync import SyncCoordinator, SyncProducer
from tests import redis_servers

HERE = Path(__file__).resolve().parent
from bench._results import results_path  # noqa: E402

RESULTS = results_path("rebalance.json")
ROLLING_RESULTS = results_path("rebalance-rolling.json")
MODES = ("push", "interval", "eager")
GROUP = "bench"
VIEW_EVERY_S = 0.05
#: The coordinator's default heartbeat interval, which the bench runs with.
INTERVAL_S = 3.0
#: The throughput window of an event ends this long before the group was seen stable.
WINDOW_MARGIN_S = 0.25
#: How long an event may take to settle (the crash: a 10 s lease, a 1 s tick, one interval).
SETTLE_TIMEOUT_S = 40.0
#: The steps of a handoff's timeline, in order (see `handoff_timeline`).
STEPS = ("lastOld", "revokeBegan", "revokeEnded", "releaseSent", "released", "installSent", "installed",
         "assigned", "firstRead", "firstNew")  # fmt: skip


# --- the moving parts -----------------------------------------------------------


class Publisher(threading.Thread):
    """Publishes `rate` msg/s on a schedule (late messages go at once), each stamped when sent."""

    def __init__(self, producer: SyncProducer, rate: float) -> None:
        super().__init__(daemon=True)
        self.producer = producer
        self.rate = rate
        self.sent = 0
        self.late_max_s = 0.0
        self._halt = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self._halt.is_set():
            due = start + self.sent / self.rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                self.late_max_s = max(self.late_max_s, -pause)
            self.producer.publish({"ts": repr(time.monotonic())})
            self.sent += 1

    def stop(self) -> None:
        self._halt.set()
        self.join()


@attrs.frozen
class Sample:
    """One look at the group view."""

    t: float
    group_epoch: int
    stable: bool
    owners: dict[str, frozenset[int]]


class ViewWatcher(threading.Thread):
    """Polls the group view every `VIEW_EVERY_S` and keeps every sample."""

    def __init__(self, url: str, stream: str) -> None:
        super().__init__(daemon=True)
        self.path = f"{url}/v1/streams/{stream}/groups/{GROUP}"
        self.samples: list[Sample] = []
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=2) as client:
            while not self._halt.is_set():
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                    answer = client.get(self.path)
                    if answer.status_code == 200:
                        self.samples.append(sample(time.monotonic(), answer.json()))
                self._halt.wait(VIEW_EVERY_S)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def wait(self, done: Callable[[Sample], bool], since: float, timeout: float, what: str) -> Sample:
        """The first sample taken after `since` for which `done` holds."""
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for s in self.samples[seen:]:
                if s.t >= since and done(s):
                    return s
            seen = max(0, len(self.samples) - 1)
            time.sleep(VIEW_EVERY_S / 2)
        raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")


def sample(t: float, view: dict[str, Any]) -> Sample:
    epoch = view["groupEpoch"]
    members = view["members"]
    stable = (
        bool(members)
        and view["assignmentEpoch"] == epoch
        and all(m["state"] == "STABLE" and m["memberEpoch"] == epoch for m in members)
    )
    return Sample(t, epoch, stable, {m["memberId"]: frozenset(m["assigned"]) for m in members})


@attrs.define
class Worker:
    name: str
    proc: subprocess.Popen[bytes]
    out: Path
    #: The member id (`<POD_IP>/handle/0`).
    member: str


@attrs.define
class Event:
    kind: str  # join, leave, crash
    worker: str
    trigger: float
    #: The quiet period before the trigger (the reference for the others' throughput).
    quiet_from: float
    change: float = math.nan
    stable: float = math.nan
    before: dict[str, frozenset[int]] = attrs.Factory(dict)
    after: dict[str, frozenset[int]] = attrs.Factory(dict)


# --- one mode ---------------------------------------------------------------------


class Scenario:
    def __init__(
        self, args: argparse.Namespace, mode: str, url: str, redis_url: str, coordinator_pid: int, tmp: Path
    ) -> None:
        self.args = args
        self.coordinator_pid = coordinator_pid
        self.mode = mode
        self.url = url
        self.redis_url = redis_url
        self.tmp = tmp
        self.stream = f"rebalance-{mode}"
        self.workers: list[Worker] = []
        self.alive: list[Worker] = []
        self.events: list[Event] = []
        self.next_index = 1
        self.random = random.Random(f"{args.seed}-{mode}")
        #: The workers' scheduler figures (run ns, run-queue wait ns, timeslices), summed.
        self.worker_sched = [0, 0, 0]

    def note_sched(self, worker: Worker) -> None:
        with contextlib.suppress(OSError):
            for i, value in enumerate(schedstat(worker.proc.pid)):
                self.worker_sched[i] += value

    def start_worker(self, identity: dict[str, str] | None = None, member: str | None = None) -> Worker:
        """A worker (`identity`: its environment's identity variables instead of a new POD_IP,
        `member`: then its member id)."""
        index = self.next_index
        self.next_index += 1
        name = f"w{index}"
        ip = f"10.77.0.{index}"
        out = self.tmp / f"{self.mode}-{name}.txt"
        env = {
            **os.environ,
            "RSC_COORDINATOR_URL": self.url,
            "RSC_REDIS_URL": self.redis_url,
            "RSC_BENCH_MODE": self.mode,
            "RSC_BENCH_STREAM": self.stream,
            "RSC_BENCH_GROUP": GROUP,
            "RSC_BENCH_OUT": str(out),
            "RSC_BENCH_GATE_MS": str(self.args.gate_ms),
            **(identity or {"POD_IP": ip}),
        }
        log = out.with_suffix(".log").open("wb")
        argv = [sys.executable, str(HERE / "rebalance_app.py")]
        proc = subprocess.Popen(argv, env=env, cwd=HERE, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        worker = Worker(name, proc, out, member or f"{ip}/handle/0")
        self.workers.append(worker)
        self.alive.append(worker)
        return worker

    def settled(self, members: int) -> Callable[[Sample], bool]:
        live = {w.member for w in self.alive}
        return lambda s: s.stable and len(s.owners) == members and set(s.owners) == live

    def event(self, view: ViewWatcher, kind: str) -> Event:
        """Trigger one event and wait until the group is stable without (or with) the worker."""
        last = view.wait(
            self.settled(len(self.alive)), time.monotonic(), 5, "a stable group before the event"
        )
        quiet_from = time.monotonic() - self.args.settle + 0.5
        if kind == "join":
            worker = self.start_worker()
            trigger = time.monotonic()
        else:
            # The member with the fewest shards (the oldest of those): its shards go to some of the
            # others only, so that some stay uninvolved. The crash takes the same choice.
            fewest = min(len(last.owners.get(w.member, ())) for w in self.alive)
            worker = next(w for w in self.alive if len(last.owners.get(w.member, ())) == fewest)
            self.alive.remove(worker)
            trigger = time.monotonic()
            self.note_sched(worker)
            worker.proc.send_signal(signal.SIGTERM if kind == "leave" else signal.SIGKILL)
        event = Event(kind, worker.name, trigger, quiet_from, before=dict(last.owners))
        changed = view.wait(
            lambda s: s.group_epoch > last.group_epoch, trigger, SETTLE_TIMEOUT_S, "the change"
        )
        event.change = changed.t
        done = view.wait(self.settled(len(self.alive)), changed.t, SETTLE_TIMEOUT_S, f"the {kind} to settle")
        event.stable = done.t
        event.after = dict(done.owners)
        self.events.append(event)
        print(
            f"  {self.mode} {kind} {worker.name}: change +{changed.t - trigger:.2f} s, "
            f"stable +{done.t - trigger:.2f} s",
            file=sys.stderr,
        )
        # Plus up to one heartbeat interval: the group settles on a member's heartbeat, so a fixed
        # pause would put every next event at the same point of the members' heartbeat cycle.
        time.sleep(self.args.settle + self.random.uniform(0, INTERVAL_S))
        return event

    def run(self) -> dict[str, Any]:
        args = self.args
        with (
            redis.Redis.from_url(self.redis_url) as r,
            SyncProducer(SyncCoordinator(self.url), r, self.stream, f"bench/{self.stream}") as producer,
        ):
            cpu0, t0 = cpu_seconds(self.coordinator_pid), time.monotonic()
            sched0 = schedstat(self.coordinator_pid)
            histogram0 = heartbeat_histogram(self.url)
            view = ViewWatcher(self.url, self.stream)
            view.start()
            publisher = Publisher(producer, args.rate)
            try:
                for _ in range(3):
                    self.start_worker()
                view.wait(self.settled(3), 0, 60, "three workers to settle")
                publisher.start()
                time.sleep(args.steady)
                for _ in range(args.cycles):
                    self.event(view, "join")
                    self.event(view, "leave")
                self.event(view, "crash")
            finally:
                with contextlib.suppress(Exception):
                    publisher.stop()
                with contextlib.suppress(Exception):
                    view.stop()
                for worker in self.alive:
                    self.note_sched(worker)
                    worker.proc.send_signal(signal.SIGTERM)
                for worker in self.workers:
                    try:
                        worker.proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        worker.proc.kill()
                        worker.proc.wait()
        result = analyse(self, publisher, cpu_seconds(self.coordinator_pid) - cpu0, time.monotonic() - t0)
        result["coordinatorHeartbeats"] = histogram_delta(histogram0, heartbeat_histogram(self.url))
        coordinator = [b - a for a, b in zip(sched0, schedstat(self.coordinator_pid), strict=True)]
        result["runQueue"] = {"coordinator": run_queue(coordinator), "workers": run_queue(self.worker_sched)}
        return result


# --- rolling restarts ------------------------------------------------------------------


class Rolling(Scenario):
    """Rolling restarts, then a crash with an immediate replacement, of three workers with
    stable ids: static members (`mode` "static") or not ("dynamic")."""

    def identity(self, slot: int) -> tuple[dict[str, str], str]:
        """The environment and member id of the worker in `slot` (1-3), whichever process runs it."""
        env = {"RSC_INSTANCE_ID": f"w{slot}", "RSC_STATIC": "true" if self.mode == "static" else "false"}
        return env, f"w{slot}/handle/0"

    def restart(self, view: ViewWatcher, slot: int, kind: str) -> dict[str, Any]:
        env, member = self.identity(slot)
        before = view.wait(self.settled(3), time.monotonic(), 30, "a stable group before the restart")
        old = next(w for w in self.alive if w.member == member)
        self.alive.remove(old)
        trigger = time.monotonic()
        self.note_sched(old)
        old.proc.send_signal(signal.SIGTERM if kind == "restart" else signal.SIGKILL)
        old.proc.wait(timeout=60)
        new = self.start_worker(env, member)
        mine = before.owners.get(member, frozenset())
        # Done: the replacement handled a message on each of those shards (a crash shows in the
        # view only once the replacement took the id over), and the group is stable.
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while not mine <= set(read_records(new.out).handled):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replacement of {member} did not handle its shards")
            time.sleep(VIEW_EVERY_S)
        done = view.wait(self.settled(3), time.monotonic(), SETTLE_TIMEOUT_S, f"the {kind} of {member}")
        samples = [s for s in view.samples if trigger <= s.t <= done.t]
        moves_own = moves_others = 0
        for shard in range(self.args.shards):
            owners = [before.owners and owner_of(before.owners).get(shard)]
            for s in samples:
                owner = owner_of(s.owners).get(shard)
                if owner is not None and owner != owners[-1]:
                    owners.append(owner)
            changes = len(owners) - 1
            if shard in mine:
                moves_own += changes
            else:
                moves_others += changes
        started = first(read_records(new.out).trace, lambda r: r["k"] == "started")
        print(
            f"  {self.mode} {kind} {member}: settled +{done.t - trigger:.2f} s, "
            f"moves {moves_own} own / {moves_others} others",
            file=sys.stderr,
        )
        time.sleep(self.args.settle + self.random.uniform(0, INTERVAL_S))
        return {
            "kind": kind,
            "member": member,
            "trigger": trigger,
            "settledS": round(done.t - trigger, 2),
            "startupS": round(started["t"] - trigger, 2) if started else math.nan,
            "doneAt": done.t,
            "shards": sorted(mine),
            "movesOwn": moves_own,
            "movesOthers": moves_others,
            "sameShardsBack": done.owners.get(member, frozenset()) == mine,
        }

    def run(self) -> dict[str, Any]:
        args = self.args
        with (
            redis.Redis.from_url(self.redis_url) as r,
            SyncProducer(SyncCoordinator(self.url), r, self.stream, f"bench/{self.stream}") as producer,
        ):
            view = ViewWatcher(self.url, self.stream)
            view.start()
            publisher = Publisher(producer, args.rate)
            events = []
            try:
                for slot in (1, 2, 3):
                    self.start_worker(*self.identity(slot))
                view.wait(self.settled(3), 0, 60, "three workers to settle")
                publisher.start()
                time.sleep(args.steady)
                for slot in (1, 2, 3):
                    events.append(self.restart(view, slot, "restart"))
                events.append(self.restart(view, 1, "crash"))
            finally:
                with contextlib.suppress(Exception):
                    publisher.stop()
                with contextlib.suppress(Exception):
                    view.stop()
                for worker in self.alive:
                    worker.proc.send_signal(signal.SIGTERM)
                for worker in self.workers:
                    try:
                        worker.proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        worker.proc.kill()
                        worker.proc.wait()
        handled: dict[int, list[float]] = {}
        for worker in self.workers:
            for shard, times in read_records(worker.out).handled.items():
                handled.setdefault(shard, []).extend(times)
        for times in handled.values():
            times.sort()
        for event in events:
            # per shard of the restarted member, the longest time nothing was handled on it
            # from just before the event until it was done
            gaps = []
            for shard in event["shards"]:
                times = handled.get(shard, [])
                before = [t for t in times if t <= event["trigger"]][-1:]
                during = [t for t in times if event["trigger"] < t <= event["doneAt"] + 1.0]
                points = before + during
                if len(points) >= 2:
                    gaps.append(max(b - a for a, b in itertools.pairwise(points)) * 1000)
            event["idleP50Ms"] = round(percentile(gaps, 50), 1)
            event["idleMaxMs"] = round(max(gaps), 1) if gaps else math.nan
            del event["trigger"], event["doneAt"]
        return {"mode": self.mode, "events": events}


def report_rolling(args: argparse.Namespace, results: list[dict[str, Any]], elapsed: float) -> None:
    header = (
        f"{'members':<9}{'event':<9}{'member':<13}{'start-up s':>11}{'settled s':>10}{'own moves':>10}"
        f"{'others':>8}{'same back':>10}{'idle p50 ms':>12}{'idle max':>9}"
    )
    print(f"\nrolling restarts: {args.shards} shards, {args.rate:g} msg/s, 3 s heartbeats, 10 s lease")
    print(header)
    print("-" * len(header))
    for result in results:
        for e in result["events"]:
            print(
                f"{result['mode']:<9}{e['kind']:<9}{e['member']:<13}{e['startupS']:>11.2f}{e['settledS']:>10.2f}"
                f"{e['movesOwn']:>10}{e['movesOthers']:>8}{'yes' if e['sameShardsBack'] else 'no':>10}"
                f"{e['idleP50Ms']:>12.0f}{e['idleMaxMs']:>9.0f}"
            )
        print("-" * len(header))
    ROLLING_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "rebalance-rolling",
        "python": platform.python_version(),
        "shards": args.shards,
        "rate": args.rate,
        "heartbeatIntervalMs": 3000,
        "leaseMs": 10000,
        "elapsedS": round(elapsed, 1),
        "results": results,
    }
    ROLLING_RESULTS.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nwrote {ROLLING_RESULTS}")


# --- analysis -------------------------------------------------------------------------


@attrs.define
class WorkerRecords:
    #: shard -> handle times, ascending
    handled: dict[int, list[float]]
    #: (publish ts, handle ts) of every handled message
    messages: list[tuple[float, float]]
    trace: list[dict[str, Any]]


def read_records(path: Path) -> WorkerRecords:
    handled: dict[int, list[float]] = {}
    messages: list[tuple[float, float]] = []
    trace: list[dict[str, Any]] = []
    if path.exists():
        for line in path.read_text().splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "h":
                shard, published, at = rest.split()
                handled.setdefault(int(shard), []).append(float(at))
                messages.append((float(published), float(at)))
            elif kind == "t":
                with contextlib.suppress(ValueError):
                    trace.append(json.loads(rest))
    for values in handled.values():
        values.sort()
    return WorkerRecords(handled, messages, trace)


def owner_of(owners: dict[str, frozenset[int]]) -> dict[int, str]:
    return {shard: member for member, shards in owners.items() for shard in shards}


def first(items: list[dict[str, Any]], match: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    return next((item for item in items if match(item)), None)


def handoff_timeline(
    shard: int, old: WorkerRecords | None, new: WorkerRecords, last_old: float, first_new: float, event: Event
) -> dict[str, float]:
    """Times of the steps of one handoff (`STEPS`), as far as the traces show them.

    The release is the old owner's heartbeat that gave the shard up, the first to report it
    revoked (an acknowledgement; for a leave that revoked everything unasked, the leave itself),
    or for a crash the fence at the end of its lease (the view's time)."""
    steps: dict[str, float] = {"lastOld": last_old, "firstNew": first_new}
    revoke = None
    if old is not None and event.kind != "crash":
        revoke = first(
            old.trace, lambda r: r["k"] == "revoke" and shard in r["shards"] and r["t"] >= last_old - 1
        )
    if revoke is not None:
        steps["revokeBegan"], steps["revokeEnded"] = revoke["t"], revoke["end"]
        release = first(
            old.trace,  # type: ignore[union-attr]
            lambda h: h["k"] == "hb" and shard in h["revoked"] and h["sent"] >= revoke["end"] - 1e-6,
        )
        if release is not None and "done" in release:
            steps["releaseSent"], steps["released"] = release["sent"], release["done"]
    if event.kind == "crash":
        steps["released"] = event.change
    install = first(
        new.trace,
        lambda h: (
            h["k"] == "hb" and shard in h.get("assigned", ()) and event.trigger <= h["done"] <= first_new
        ),
    )
    if install is not None:
        steps["installSent"], steps["installed"] = install["sent"], install["done"]
        steps["installWaitMs"] = install["wait"]
    calls = [
        a["t"] for a in new.trace if a["k"] == "assigned" and shard in a["shards"] and a["t"] <= first_new
    ]
    if calls:
        steps["assigned"] = calls[-1]
        read = first(
            new.trace,
            lambda r: r["k"] == "claimed" and r["shard"] == shard and calls[-1] <= r["t"] <= first_new,
        )
        if read is not None:
            steps["firstRead"] = read["end"]
    return steps


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def handoffs_of(
    event: Event, until: float, records: dict[str, WorkerRecords], names: dict[str, str]
) -> list[Any]:
    before, after = owner_of(event.before), owner_of(event.after)
    out = []
    for shard in sorted(after):
        old, new = before.get(shard), after[shard]
        if old == new or old is None:
            continue
        new_times = [t for t in records[new].handled.get(shard, []) if event.quiet_from <= t < until]
        old_times = [t for t in records[old].handled.get(shard, []) if new_times and t < new_times[0]]
        if not new_times or not old_times or old_times[-1] < event.quiet_from:
            continue  # nothing handled on it around the event (cannot happen at the default rate)
        last_old, first_new = old_times[-1], new_times[0]
        timeline = handoff_timeline(shard, records[old], records[new], last_old, first_new, event)
        relative = {k: round((v - last_old) * 1000, 1) for k, v in timeline.items() if k in STEPS}
        released = timeline.get("released")
        installed = timeline.get("installed")
        out.append(
            {
                "shard": shard,
                "from": names[old],
                "to": names[new],
                "gapMs": round((first_new - last_old) * 1000, 1),
                # From the release (the fence for a crash) to the new owner's first message.
                "afterReleaseMs": round((first_new - released) * 1000, 1) if released else None,
                # The install came in the answer to a long poll that was waiting when the shard was
                # released (between the release heartbeat's send and its answer).
                "held": bool(
                    timeline.get("installWaitMs")
                    and released
                    and installed
                    and timeline["installSent"] <= released
                    and installed >= timeline.get("releaseSent", released)
                ),
                "timelineMs": relative,
            }
        )
    return out


def uninvolved_of(event: Event, records: dict[str, WorkerRecords], names: dict[str, str]) -> list[Any]:
    """Members whose shards the event did not change: handled vs published during the window.

    The window ends `WINDOW_MARGIN_S` before the group was seen stable: a member that paused
    (eager) may see it stable a little before this process does, and its catch-up must not count."""
    out = []
    end = event.stable - WINDOW_MARGIN_S
    window = end - event.change
    quiet = event.trigger - event.quiet_from
    for member, shards in sorted(event.after.items()):
        if event.before.get(member) != shards or names[member] == event.worker or window < 0.25:
            continue
        messages = records[member].messages
        handled = sum(1 for _, at in messages if event.change <= at < end)
        published = sum(1 for ts, _ in messages if event.change <= ts < end)
        steady = sum(1 for _, at in messages if event.quiet_from <= at < event.trigger) / quiet
        out.append(
            {
                "worker": names[member],
                "shards": len(shards),
                "windowS": round(window, 3),
                "steadyPerS": round(steady, 1),
                "handledPerS": round(handled / window, 1),
                "publishedPerS": round(published / window, 1),
                "handled": handled,
                "published": published,
            }
        )
    return out


def analyse(scenario: Scenario, publisher: Publisher, cpu_s: float, elapsed_s: float) -> dict[str, Any]:
    records = {w.member: read_records(w.out) for w in scenario.workers}
    names = {w.member: w.name for w in scenario.workers}
    events_out = []
    for index, event in enumerate(scenario.events):
        until = scenario.events[index + 1].trigger if index + 1 < len(scenario.events) else math.inf
        started = [
            r["t"]
            for w in scenario.workers
            if w.name == event.worker
            for r in records[w.member].trace
            if r["k"] == "started"
        ]
        events_out.append(
            {
                "kind": event.kind,
                "worker": event.worker,
                **({"workerUpAfterS": round(started[0] - event.trigger, 3)} if event.kind == "join" else {}),
                "changeAfterS": round(event.change - event.trigger, 3),
                "stableAfterS": round(event.stable - event.trigger, 3),
                "windowS": round(event.stable - event.change, 3),
                "handoffs": handoffs_of(event, until, records, names),
                "uninvolved": uninvolved_of(event, records, names),
            }
        )
    result: dict[str, Any] = {
        "mode": scenario.mode,
        "published": publisher.sent,
        "publisherLateMaxMs": round(publisher.late_max_s * 1000, 1),
        "coordinatorCpuPercent": round(100 * cpu_s / elapsed_s, 1),
        "events": events_out,
        "summary": summarise(events_out),
    }
    if scenario.mode == "eager":
        pauses = {}
        for w in scenario.workers:
            marks = [(r["k"], r["t"]) for r in records[w.member].trace if r["k"] in ("pause", "resume")]
            pauses[w.name] = [
                round(b - a, 3)
                for (k1, a), (k2, b) in itertools.pairwise(marks)
                if (k1, k2) == ("pause", "resume")
            ]
        result["pausesS"] = pauses
    return result


def summarise(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Per event kind: the gaps of every moved shard and the pooled dip of the uninvolved members."""
    out: dict[str, Any] = {}
    for kind in ("join", "leave", "crash"):
        chosen = [e for e in events if e["kind"] == kind]
        if not chosen:
            continue
        handoffs = [h for e in chosen for h in e["handoffs"]]
        gaps = [h["gapMs"] for h in handoffs]
        after = [h["afterReleaseMs"] for h in handoffs if h["afterReleaseMs"] is not None]
        uninvolved = [u for e in chosen for u in e["uninvolved"]]
        handled = sum(u["handled"] for u in uninvolved)
        published = sum(u["published"] for u in uninvolved)
        steady = sum(u["steadyPerS"] * u["windowS"] for u in uninvolved)
        medians = {}
        for step in STEPS[1:]:
            values = [h["timelineMs"][step] for h in handoffs if step in h["timelineMs"]]
            if values:
                medians[step] = percentile(values, 50)
        out[kind] = {
            "events": len(chosen),
            "moved": len(gaps),
            "gapP50Ms": percentile(gaps, 50),
            "gapP99Ms": percentile(gaps, 99),
            "gapMaxMs": max(gaps) if gaps else math.nan,
            "afterReleaseP50Ms": percentile(after, 50),
            "afterReleaseMaxMs": max(after) if after else math.nan,
            "held": sum(1 for h in handoffs if h["held"]),
            "windowS": round(sum(e["windowS"] for e in chosen) / len(chosen), 3),
            "uninvolved": len(uninvolved),
            # Handled against published in the windows: a publisher that falls behind moves neither.
            "dipPercent": round(100 * (1 - handled / published), 1) if published else math.nan,
            "dipVsSteadyPercent": round(100 * (1 - handled / steady), 1) if steady else math.nan,
            "timelineMedianMs": medians,
        }
    return out


# --- report --------------------------------------------------------------------------

SHORT = {
    "revokeBegan": "revoke",
    "revokeEnded": "revoked",
    "releaseSent": "rel sent",
    "released": "released",
    "installSent": "inst sent",
    "installed": "installed",
    "assigned": "assigned",
    "firstRead": "1st read",
    "firstNew": "first new",
}


def fmt(value: float, width: int, digits: int = 0) -> str:
    return f"{'-':>{width}}" if value is None or math.isnan(value) else f"{value:>{width}.{digits}f}"


def report(
    args: argparse.Namespace, results: list[dict[str, Any]], elapsed: float, load: list[float]
) -> None:
    print(
        f"\n{args.shards} shards, {args.rate:g} msg/s, heartbeat interval 3 s, lease 10 s; {args.cycles} "
        f"join/leave cycle(s) and one crash per mode; {elapsed:.0f} s; "
        f"load average {load[0]:.1f} -> {load[1]:.1f}\n"
    )
    print("gap: idle time of a moved shard, old owner's last handled message -> new owner's first (ms);")
    print(
        "after rel.: from the release (the heartbeat reporting the revoke answered; crash: the fence) to it;"
    )
    print("held: installs answered to a long poll that waited; dip: uninvolved members' handled msg/s")
    print("in the rebalance window against what was published to their shards meanwhile")
    header = (
        f"{'mode':<10}{'event':<8}{'moved':>6}{'gap p50':>9}{'p99':>8}{'max':>8}{'after rel.':>11}{'max':>7}"
        f"{'held':>6}{'window s':>10}{'uninv.':>7}{'dip %':>7}"
    )
    print(header)
    print("-" * len(header))
    for result in results:
        for kind, s in result["summary"].items():
            print(
                f"{result['mode']:<10}{kind + ('*' if kind == 'crash' else ''):<8}{s['moved']:>6}"
                f"{fmt(s['gapP50Ms'], 9)}{fmt(s['gapP99Ms'], 8)}{fmt(s['gapMaxMs'], 8)}"
                f"{fmt(s['afterReleaseP50Ms'], 11)}{fmt(s['afterReleaseMaxMs'], 7)}{s['held']:>6}"
                f"{s['windowS']:>10.2f}{s['uninvolved']:>7}{fmt(s['dipPercent'], 7, 1)}"
            )
        print("-" * len(header))
    print("* lease-bound: the crashed member's shards move once its 10 s lease ended\n")
    print("median handoff timeline, ms after the old owner's last handled message:")
    header = f"{'mode':<10}{'event':<8}" + "".join(f"{SHORT[s]:>10}" for s in STEPS[1:])
    print(header)
    print("-" * len(header))
    for result in results:
        for kind, s in result["summary"].items():
            medians = s["timelineMedianMs"]
            print(
                f"{result['mode']:<10}{kind:<8}"
                + "".join(fmt(medians.get(step, math.nan), 10) for step in STEPS[1:])
            )
    print()
    for result in results:
        print(
            f"{result['mode']}: coordinator CPU {result['coordinatorCpuPercent']:.1f} % of a core; "
            f"the publisher was at most {result['publisherLateMaxMs']:.0f} ms behind its schedule"
        )
        decided = [
            f"{endpoint} {h['requests']} requests, mean {h['meanMs']:.1f} ms, p99 <= {h['p99UnderMs']:g} ms"
            for endpoint, h in result.get("coordinatorHeartbeats", {}).items()
        ]
        print("  heartbeat requests as the coordinator timed them: " + "; ".join(decided))
        waits = [
            f"{who} {q['waitS']:.1f} s (on a CPU {q['cpuS']:.1f} s), {q['waitPerSliceMs']:.2f} ms per wake-up"
            for who, q in result.get("runQueue", {}).items()
        ]
        print("  runnable but waiting for a CPU: " + "; ".join(waits))
        if "pausesS" in result:
            print(f"  eager pauses per worker (s): {result['pausesS']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "rebalance",
        "python": platform.python_version(),
        "shards": args.shards,
        "rate": args.rate,
        "steadyS": args.steady,
        "settleS": args.settle,
        "cycles": args.cycles,
        "seed": args.seed,
        "gateMs": args.gate_ms,
        "heartbeatIntervalMs": 3000,
        "leaseMs": 10000,
        "elapsedS": round(elapsed, 1),
        "loadAverage": load,
        "results": results,
    }
    RESULTS.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


@contextlib.contextmanager
def coordinator(shards: int) -> Iterator[tuple[str, str, int]]:
    """A private redis-server and `rsc serve` on it: their URLs and the coordinator's pid."""
    port = redis_servers.free_port()
    with redis_servers.standalone() as redis_url:
        env = {"RSC_REDIS_URL": redis_url, "RSC_DEFAULT_SHARD_COUNT": str(shards)}
        url = f"http://127.0.0.1:{port}"
        serve = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
        with process(serve, env, HERE.parent) as proc:
            wait_http(url + "/healthz")
            yield url, redis_url, proc.pid


def heartbeat_histogram(url: str) -> dict[str, dict[str, float]]:
    """The coordinator's `rsc_heartbeat_seconds` (time to decide a heartbeat request, a held long
    poll's wait left out) per endpoint: cumulative bucket counts by upper bound, `count`, `sum`."""
    out: dict[str, dict[str, float]] = {}
    with contextlib.suppress(httpx.HTTPError):
        for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
            if not line.startswith("rsc_heartbeat_seconds_"):
                continue
            name, _, value = line.rpartition(" ")
            labels = dict(part.split("=", 1) for part in name[name.index("{") + 1 : -1].split(","))
            endpoint = labels["endpoint"].strip('"')
            key = labels["le"].strip('"') if "le" in labels else name.split("{")[0].rsplit("_", 1)[1]
            out.setdefault(endpoint, {})[key] = float(value)
    return out


def histogram_delta(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """Per endpoint over one mode: requests, mean ms, and the bucket bounds under which 50 / 99 % fell."""
    out = {}
    for endpoint, figures in after.items():
        if endpoint == "producer":
            continue
        delta = {k: v - before.get(endpoint, {}).get(k, 0.0) for k, v in figures.items()}
        count = delta.get("count", 0.0)
        if count <= 0:
            continue
        bounds = sorted((float(k), v) for k, v in delta.items() if k not in ("count", "sum", "created"))

        def bound(share: float, bounds: list[tuple[float, float]] = bounds, count: float = count) -> float:
            return next((le * 1000 for le, n in bounds if n >= share * count), math.inf)

        out[endpoint] = {
            "requests": int(count),
            "meanMs": round(delta["sum"] / count * 1000, 2),
            "p50UnderMs": bound(0.5),
            "p99UnderMs": bound(0.99),
        }
    return out


def schedstat(pid: int) -> list[int]:
    """The scheduler's figures for `pid`: ns on a CPU, ns waiting on a run queue, timeslices."""
    return [int(x) for x in Path(f"/proc/{pid}/schedstat").read_text().split()[:3]]


def run_queue(figures: list[int]) -> dict[str, float]:
    """CPU time, time spent runnable but waiting for a CPU, and that wait per wake-up (timeslice)."""
    run, wait, slices = figures
    return {
        "cpuS": round(run / 1e9, 2),
        "waitS": round(wait / 1e9, 2),
        "waitPerSliceMs": round(wait / slices / 1e6, 2) if slices else math.nan,
    }


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--rate", type=float, default=200.0, help="msg/s published over all shards")
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--steady", type=float, default=3.0, help="seconds of three steady workers")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds after each event settled")
    parser.add_argument("--cycles", type=int, default=2, help="join/leave cycles before the crash")
    parser.add_argument("--gate-ms", type=int, default=100, help="eager mode: how often workers look")
    parser.add_argument("--seed", default="1", help="of the random pause between events")
    parser.add_argument("--quick", action="store_true", help="--steady 2 --settle 1.5 --cycles 1")
    parser.add_argument("--keep", type=Path, help="keep the workers' records and logs in this directory")
    parser.add_argument(
        "--scenario", choices=("events", "rolling"), default="events", help="rolling: rolling restarts"
    )
    args = parser.parse_args()
    if args.quick:
        args.steady, args.settle, args.cycles = 2.0, 1.5, 1
    if unknown := set(args.modes) - set(MODES):
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    if args.rate <= 0 or args.shards < 4 or args.settle < 1.5 or args.cycles < 1:
        parser.error("--rate > 0, --shards >= 4, --settle >= 1.5 and --cycles >= 1")
    started = time.monotonic()
    load = [os.getloadavg()[0]]
    results = []
    with (
        coordinator(args.shards) as (url, redis_url, pid),
        tempfile.TemporaryDirectory(prefix="rsc-rebalance-") as tmp,
    ):
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.scenario == "rolling":
            rolling = [
                Rolling(args, kind, url, redis_url, pid, workdir).run() for kind in ("static", "dynamic")
            ]
            report_rolling(args, rolling, time.monotonic() - started)
            return
        for mode in args.modes:
            print(f"{mode}:", file=sys.stderr)
            results.append(Scenario(args, mode, url, redis_url, pid, workdir).run())
    load.append(os.getloadavg()[0])
    report(args, results, time.monotonic() - started, load)


if __name__ == "__main__":
    main()
