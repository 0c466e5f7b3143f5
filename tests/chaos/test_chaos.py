"""The chaos suite: real processes under a fault schedule, then the history checker.

Its own redis-server (AOF, fsync always, in the test's directory), `rsc serve`
as a child process, three `rsc worker tests.chaos.chaosapp:app` processes
(two members each) and two producer processes (`tests.chaos.producer`), on a
stream of 4 shards. The schedule, with the producers publishing throughout:

1. SIGSTOP two workers, each while one of its handlers is in flight (right
   after a burst, so their queues hold entries too); keep them stopped past
   their lease until the group shows their shards installed to the remaining
   worker; scale out 4 -> 6 meanwhile; SIGCONT.
2. kill -9 a worker while one of its handlers is in flight, scale out 6 -> 8,
   start a replacement.
3. Rebalance under load (the producers at their fast rate): a worker joins,
   then one leaves with SIGTERM.
4. A handler blocks its worker's event loop past the lease (still under
   load), until its shards moved; then the loop goes on.
5. kill -9 the coordinator and start a new one on the same port.
6. kill -9 Redis and start it again on the same port and directory 2.5 s later.
7. Stop Redis (SIGTERM) for 6 s, then start it again.

After each fault it waits for convergence (every expected member STABLE,
every shard installed, handling progressing) and records how long that took.
A worker that exits by itself is a failure; it is replaced so that the rest
of the schedule still runs. At the end the producers stop, every acknowledged
publish must be handled and nothing left pending, the workers stop with
SIGTERM, and `rsc.conformance.history.check` judges the whole history. Run with
`-s` to see the figures; a failure message carries them too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, Protocol

import attrs
import httpx

from rsc.actors.keys import AggregateId
from rsc.conformance.history import Fault, Publish, Record, Report, check, ownership_from_journal
from rsc.sync_connect import sync_redis
from tests.redis_servers import DurableServer, free_port

ROOT = Path(__file__).resolve().parents[2]
SETPRIV = shutil.which("setpriv")
GROUP = "billing"
PASSWORD = "chaos-admin-password"
AUTH = ("admin", PASSWORD)
LEASE_S = 2.0
SERVE_ENV = {
    "RSC_HEARTBEAT_INTERVAL_MS": "200",
    "RSC_MEMBER_LEASE_TTL_MS": str(int(LEASE_S * 1000)),
    "RSC_TICK_INTERVAL_MS": "100",
    "RSC_REVOKE_TIMEOUT_MS": "10000",
    "RSC_ADMIN_PASSWORD": PASSWORD,
}
#: The handler's delay: at least DELAY_MIN_MS, so a start seen within CATCH_S is still in flight.
DELAY_MIN_MS, DELAY_MAX_MS = 30, 100
CATCH_S = 0.012
CONCURRENCY = 2
PRODUCER_RATE = 15.0  # messages a second, each of two producers
CONVERGE_S = 20.0
EXCEPTION_LINE = re.compile(r"^[ |]*((?:[\w.]+\.)?\w*(?:Error|Exception|Unreachable)\w*: .*)$", re.MULTILINE)
DRAIN_S = 45.0


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of a record file (a line cut by kill -9 is left out)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().split(b"\n"):
        with contextlib.suppress(ValueError):
            if line:
                out.append(json.loads(line))
    return out


class Tail:
    """Follows one worker's record file: calls in flight, and the time of the last end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""
        self.in_flight: dict[tuple[str, str, str], float] = {}
        self.last_end = 0.0
        self.blocked: float | None = None  # when a handler began to block the event loop

    def poll(self) -> None:
        try:
            with self.path.open("rb") as file:
                file.seek(self.offset)
                data = file.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        for line in lines:
            r = json.loads(line)
            call = (r["member"], r["key"], r["id"])
            if r["ev"] == "start":
                self.in_flight[call] = r["t"]
            elif r["ev"] in ("end", "abort"):
                self.in_flight.pop(call, None)
                if r["ev"] == "end":
                    self.last_end = max(self.last_end, r["t"])
            elif r["ev"] == "block":
                self.blocked = r["t"]

    def fresh_call(self, within_s: float) -> bool:
        """Whether a call started less than `within_s` ago is in flight (so it surely still is)."""
        self.poll()
        return any(now() - t < within_s for t in self.in_flight.values())


@attrs.define
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    ip: str = ""
    records: Path | None = None
    tail: Tail | None = None
    stopped: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def members(self) -> set[str]:
        return {f"{self.ip}/chaos/{i}" for i in range(CONCURRENCY)}

    def last_lines(self, n: int = 4) -> str:
        lines = self.log.read_text(errors="replace").strip().splitlines() if self.log.exists() else []
        return "\n".join(f"        {line}" for line in lines[-n:])

    def terminate(self, timeout: float = 20) -> int | None:
        """SIGTERM, then its exit code (None if it did not end within `timeout`)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def death(self) -> str:
        """How it ended: exit code, the size of its log, the innermost exception of a traceback."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        raised = [m.group(1) for m in EXCEPTION_LINE.finditer(text) if "ExceptionGroup" not in m.group(1)]
        what = f"traceback ends: {raised[-1]}" if raised else f"log ends:\n{self.last_lines()}"
        return f"exit code {self.process.returncode}, {len(text.splitlines())} log lines, {what}"


def spawn(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A child process writing to `log`, killed with the test process if that dies (a timeout)."""
    if SETPRIV is not None:
        command = [SETPRIV, "--pdeathsig", "KILL", *command]
    with log.open("wb") as output:  # the child keeps its own descriptor
        return subprocess.Popen(command, env=env, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)


def stopped_state(pid: int) -> bool:
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")
    return False


class ActiveHttp:
    """Requests to whichever of the coordinators is active: a standby's 503 STANDBY, or a
    coordinator that does not answer, passes the request on to the next one."""

    def __init__(self, urls: list[str]) -> None:
        self.clients = [httpx.Client(base_url=url, timeout=2.0) for url in urls]

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        failure: httpx.HTTPError | None = None
        response: httpx.Response | None = None
        for client in self.clients:
            try:
                response = client.request(method, path, **kwargs)
            except httpx.HTTPError as exc:
                failure = exc
                continue
            if response.status_code != 503 or response.headers.get("content-type") != "application/json":
                return response
            if response.json().get("error") != "STANDBY":
                return response
        if response is not None:
            return response
        assert failure is not None
        raise failure

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("PUT", path, **kwargs)

    def close(self) -> None:
        for client in self.clients:
            client.close()


class ChaosRedis(Protocol):
    """The Redis of a run: one `DurableServer`, or a Sentinel set (`tests.redis_servers`)."""

    @property
    def url(self) -> str: ...


class Chaos:
    """The processes of one run, the fault log and what went wrong along the way.

    By default its own `DurableServer` and one coordinator; `redis` (already running, closed
    by its owner) and `coordinators` (several, on ports of their own: clients list them all)
    change that, and `serve_env` adds to the coordinators' environment."""

    def __init__(
        self,
        tmp: Path,
        redis: ChaosRedis | None = None,
        coordinators: int = 1,
        serve_env: dict[str, str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.prefix = f"chaos{uuid.uuid4().hex[:8]}"
        self.own_redis = redis is None
        self.redis: Any = DurableServer(tmp / "redis") if redis is None else redis
        self.ports = [free_port() for _ in range(coordinators)]
        self.port = self.ports[0]
        self.url = ",".join(f"http://127.0.0.1:{port}" for port in self.ports)
        self.http = ActiveHttp([f"http://127.0.0.1:{port}" for port in self.ports])
        self.serve_env = {**SERVE_ENV, **(serve_env or {})}
        self.coordinator: Child | None = None
        self.coordinators: list[Child] = []
        self.workers: list[Child] = []  # the live ones
        self.gone: list[Child] = []  # killed, or exited
        self.producers: list[Child] = []
        self.faults: list[Fault] = []
        self.timeline: list[tuple[float, str]] = []
        self.failures: list[str] = []
        self.convergence: list[tuple[str, float | None]] = []
        self.shards = 4
        self.next_ip = 1
        self.owed = 0  # workers to start in place of those that exited by themselves
        self.redis_down = False
        self.fast = False
        #: Workers run static members (their identity is RSC_INSTANCE_ID).
        self.static = False
        self.dead: dict[str, int] = {}  # message (mid) -> deliveries, of what the dead-letter streams hold
        self.context = "start-up"
        self.offsets = [self.clock_offset()]

    @staticmethod
    def clock_offset() -> float:
        return time.time() - now()

    def note(self, what: str) -> None:
        self.timeline.append((now(), what))

    def fail(self, what: str) -> None:
        self.failures.append(f"[{self.context}] {what}")
        self.note(f"FAILURE: {what}")

    # --- processes --------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(ROOT), **extra}

    def start_coordinator(self, port: int | None = None) -> Child:
        """A coordinator on `port` (the first one's by default); until it is ready, or (a
        standby, with others running) until it answers."""
        port = self.port if port is None else port
        n = len(self.coordinators)
        log = self.tmp / f"coordinator-{n}.log"
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
        env = self.env(**self.serve_env, RSC_REDIS_URL=self.redis.url, RSC_ADVERTISE_URL=url)
        process = spawn(command, env, log)
        child = Child(f"coordinator-{n}", process, log)
        if port == self.port:
            self.coordinator = child
        self.coordinators.append(child)
        deadline = now() + 30
        with httpx.Client(base_url=url, timeout=2.0) as http:
            while True:
                assert process.poll() is None, log.read_text()
                with contextlib.suppress(httpx.HTTPError):
                    status = http.get("/readyz").status_code
                    if status == 200 or (status == 503 and len(self.ports) > 1 and n > 0):
                        break
                assert now() < deadline, log.read_text()
                time.sleep(0.05)
        self.note(f"coordinator {process.pid} on port {port} answering")
        return child

    def start_worker(self, ip: str | None = None) -> Child:
        """A worker with a new identity, or (`ip`) another process with that one: its member ids
        (`<ip>/chaos/<n>`) are the same, its record file and log its own. With `static`
        workers the identity is `RSC_INSTANCE_ID` (static members), else `POD_IP`."""
        if ip is None:
            ip = f"10.0.0.{self.next_ip}"
            self.next_ip += 1
        again = sum(w.ip == ip for w in self.workers + self.gone)
        name = ip if not again else f"{ip}-{again}"
        records = self.tmp / f"records-{name}.jsonl"
        log = self.tmp / f"worker-{name}.log"
        command = [sys.executable, "-m", "rsc", "worker", "tests.chaos.chaosapp:app"]
        command += ["--coordinator", self.url, "--redis", self.redis.url, "--stop-timeout", "5"]
        identity = {"RSC_INSTANCE_ID": ip} if self.static else {"POD_IP": ip}
        env = self.env(
            **identity,
            RSC_CHAOS_RECORDS=str(records),
            RSC_CHAOS_STREAM=self.prefix,
            RSC_CHAOS_GROUP=GROUP,
            RSC_CHAOS_CONCURRENCY=str(CONCURRENCY),
            RSC_CHAOS_DELAY_MS=f"{DELAY_MIN_MS},{DELAY_MAX_MS}",
            RSC_CHAOS_CONTROL=str(self.tmp),
        )
        process = spawn(command, env, log)
        worker = Child(f"worker {name}", process, log, ip, records, Tail(records))
        self.workers.append(worker)
        self.note(f"{worker.name} started (pid {process.pid})")
        return worker

    def start_producer(self, n: int) -> None:
        name = f"api-{n}"
        log = self.tmp / f"producer-{n}.log"
        command = [sys.executable, "-m", "tests.chaos.producer", "--coordinator", self.url]
        command += ["--redis", self.redis.url, "--stream", self.prefix, "--name", name]
        command += ["--out", str(self.tmp / f"published-{n}.jsonl"), "--rate", str(PRODUCER_RATE)]
        process = spawn(command, self.env(), log)
        self.producers.append(Child(name, process, log))
        deadline = now() + 30
        while "publishing" not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert now() < deadline, log.read_text()
            time.sleep(0.05)

    def burst(self) -> None:
        """Each producer publishes a few messages per key at once: queues fill up."""
        for producer in self.producers:
            if producer.process.poll() is None:
                producer.process.send_signal(signal.SIGUSR1)

    def retire(self, worker: Child) -> None:
        self.workers.remove(worker)
        self.gone.append(worker)

    def supervise(self) -> None:
        """A worker, producer or coordinator that exited by itself is a failure; workers are replaced."""
        for worker in list(self.workers):
            if worker.process.poll() is not None:
                self.owed += 1
                self.fail(f"{worker.name} exited by itself: {worker.death()}")
                self.retire(worker)
        while self.owed and not self.redis_down:  # a worker cannot start without Redis
            self.owed -= 1
            self.start_worker()
        for producer in self.producers:
            if producer.process.poll() is not None and not producer.stopped:
                producer.stopped = True  # reported once
                self.fail(f"producer {producer.name} exited by itself: {producer.death()}")
        if self.coordinator is not None and self.coordinator.process.poll() is not None:
            self.fail(f"the coordinator exited by itself: {self.coordinator.death()}")
            self.coordinator = None
        if self.coordinator is None and not self.redis_down:
            self.start_coordinator()

    # --- faults -----------------------------------------------------------

    def catch_in_flight(self, worker: Child, sig: signal.Signals) -> None:
        """Send `sig` right after `worker` started a handler, so that one is in flight when it lands.

        (If none was, a SIGSTOP is undone and tried again; a failure is recorded if it never works,
        and the signal is sent anyway so that the schedule goes on.)
        """
        assert worker.tail is not None
        deadline = now() + 20
        while True:
            fresh = worker.tail.fresh_call(CATCH_S)
            if not fresh and now() < deadline:
                time.sleep(0.002)
                continue
            os.kill(worker.pid, sig)
            if sig == signal.SIGSTOP:
                while not stopped_state(worker.pid):
                    time.sleep(0.001)
                self.faults.append(Fault(worker.pid, "STOP", now()))
                worker.stopped = True
            else:
                worker.process.wait()
                self.faults.append(Fault(worker.pid, "KILL", now()))
            worker.tail.poll()
            if worker.tail.in_flight:
                self.note(f"{sig.name} {worker.name} with {len(worker.tail.in_flight)} handler(s) in flight")
                return
            if sig != signal.SIGSTOP or now() >= deadline:
                self.fail(f"could not {sig.name} {worker.name} while a handler was in flight")
                return
            self.resume(worker)  # it finished in between: let it go on and try again

    def busiest(self, besides: Collection[Child] = ()) -> Child:
        """The running worker whose members hold the most shards."""
        view = self.view() or {"members": []}
        held = {m["memberId"]: len(m["assigned"]) for m in view["members"]}
        candidates = [w for w in self.workers if w not in besides and not w.stopped]
        return max(candidates, key=lambda w: sum(held.get(m, 0) for m in w.members))

    def resume(self, worker: Child) -> float:
        t = now()
        self.faults.append(Fault(worker.pid, "CONT", t))
        os.kill(worker.pid, signal.SIGCONT)
        worker.stopped = False
        return t

    def scale_out(self, shards: int) -> None:
        for _ in range(50):
            with contextlib.suppress(httpx.HTTPError):
                put = self.http.put(
                    f"/v1/admin/streams/{self.prefix}", json={"shardCount": shards}, auth=AUTH
                )
                if put.status_code == 200:
                    self.shards = shards
                    self.note(f"scaled out to {shards} shards")
                    return
            time.sleep(0.2)
        self.fail(f"could not scale out to {shards} shards")

    # --- observing --------------------------------------------------------

    def view(self) -> dict[str, Any] | None:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = self.http.get(f"/v1/streams/{self.prefix}/groups/{GROUP}")
            if response.status_code == 200:
                data: dict[str, Any] = response.json()
                return data
        return None

    def expected_members(self) -> set[str]:
        return {m for w in self.workers if not w.stopped for m in w.members}

    def settled(self) -> bool:
        view = self.view()
        if view is None:
            return False
        members = {m["memberId"]: m for m in view["members"]}
        if set(members) != self.expected_members():
            return False
        if any(m["state"] != "STABLE" or m["revoking"] for m in members.values()):
            return False
        if sorted(s for m in members.values() for s in m["assigned"]) != list(range(self.shards)):
            return False
        owners = {int(s): m for s, m in view["currentAssignment"].items()}
        return all(owners.get(s) == m for m, member in members.items() for s in member["assigned"])

    def last_end(self) -> float:
        for worker in self.workers:
            assert worker.tail is not None
            worker.tail.poll()
        return max((w.tail.last_end for w in self.workers if w.tail is not None), default=0.0)

    def wait_converged(self, label: str, since: float) -> None:
        """Until the group is settled and a handler has finished after that; record how long it took."""
        deadline = now() + CONVERGE_S
        settled_at: float | None = None
        while now() < deadline:
            self.supervise()
            if not self.settled():
                settled_at = None
            elif settled_at is None:
                settled_at = now()
            elif self.last_end() > settled_at:
                self.convergence.append((label, now() - since))
                self.note(f"converged after {label}")
                return
            time.sleep(0.1)
        self.convergence.append((label, None))
        self.fail(f"no convergence within {CONVERGE_S} s; view: {json.dumps(self.view())}")

    def wait_until(self, condition: Any, seconds: float, what: str) -> bool:
        deadline = now() + seconds
        while now() < deadline:
            self.supervise()
            if condition():
                return True
            time.sleep(0.1)
        self.fail(f"timed out after {seconds} s waiting for {what}")
        return False

    def shard_keys(self) -> list[str]:
        routing = self.http.get(f"/v1/streams/{self.prefix}/routing").json()
        return [s["key"] for s in routing["shards"]]

    # --- the schedule -----------------------------------------------------

    def setup(self) -> None:
        if self.own_redis:
            self.redis.start()
        self.start_coordinator()
        for port in self.ports[1:]:
            self.start_coordinator(port)
        put = self.http.put(f"/v1/admin/streams/{self.prefix}", json={"shardCount": self.shards}, auth=AUTH)
        assert put.status_code == 200, put.text
        group = {"startFrom": "earliest"}
        put = self.http.put(f"/v1/admin/streams/{self.prefix}/groups/{GROUP}", json=group, auth=AUTH)
        assert put.status_code == 200, put.text
        for _ in range(3):
            self.start_worker()
        for n in range(2):
            self.start_producer(n)
        self.wait_converged("start", now())
        time.sleep(2.0)  # steady state for a while

    def holdings(self, workers: Collection[Child]) -> tuple[set[str], set[int]]:
        """The member ids of `workers` and the shards they hold now."""
        view = self.view() or {"members": []}
        members = {m for w in workers for m in w.members}
        return members, {s for m in view["members"] if m["memberId"] in members for s in m["assigned"]}

    def wait_moved(self, members: set[str], held: set[int], since: float) -> None:
        """Until `members` left the group (their lease ended) and their shards are installed elsewhere."""

        def moved() -> bool:
            view = self.view()
            if view is None or now() - since < LEASE_S:
                return False
            owners = view["currentAssignment"]
            live = {m["memberId"] for m in view["members"]}
            return not (live & members) and all(owners.get(str(s)) not in (None, *members) for s in held)

        if self.wait_until(moved, CONVERGE_S, f"the shards {sorted(held)} of {sorted(members)} to move"):
            self.note(f"the shards {sorted(held)} of {', '.join(sorted(members))} moved")

    def sigstop_workers(self, count: int, scale_to: int | None = None) -> None:
        """SIGSTOP `count` workers, each with a handler in flight; SIGCONT once their shards moved.

        On waking, each stopped member races its own self-fencing: a worker that starts a queued
        entry before its member noticed the lost lease breaks exclusivity (d, and c while the
        new owner is at work), so more stopped members make such a bug more likely to show.
        """
        self.context = f"SIGSTOP of {count} worker(s) past the lease"
        stopped: list[Child] = []
        for _ in range(count):
            stopped.append(self.busiest(besides=stopped))
        members, held = self.holdings(stopped)
        self.burst()
        time.sleep(0.15)
        for worker in stopped:
            self.catch_in_flight(worker, signal.SIGSTOP)
        stopped_at = self.faults[-1].t
        self.wait_moved(members, held, stopped_at)
        if scale_to is not None:
            self.scale_out(scale_to)  # during the fault
        self.wait_converged(f"SIGSTOP of {count}, lease over (without the stopped)", stopped_at)
        self.burst()  # the new owners are busy when they wake
        time.sleep(0.3)
        woke = now()
        for worker in stopped:
            self.resume(worker)
        self.note(f"SIGCONT {', '.join(w.name for w in stopped)}")
        self.context = f"after SIGCONT of {count} worker(s)"
        self.wait_converged(f"SIGCONT of {count} stopped worker(s)", woke)

    def block_a_worker(self) -> None:
        """A handler blocks its worker's event loop past the lease (a long GC pause, CPU-bound work).

        For the runtime it is a SIGSTOP, except that the handler then returns normally and the
        loop goes on from there: the lease rule must stop the next queued entry of a shard that
        moved meanwhile. The fault log counts the process as stopped while it blocks.
        """
        self.context = "an event loop blocked past the lease"
        worker = self.busiest()
        assert worker.tail is not None
        members, held = self.holdings([worker])
        if not held:
            self.fail(f"{worker.name} holds no shard to block on")
            return
        self.burst()
        time.sleep(0.15)
        flag = self.tmp / f"block-{worker.pid}"
        flag.touch()
        tail = worker.tail
        # A batch for one of its shards, the blocking entry first: the rest of the batch is
        # read with it and waits in the queue behind the blocked call, so that when the loop
        # goes on, only the lease rule stands between the next queued entry and a handler.
        key = self.shard_keys()[min(held)]
        probe = uuid.uuid4().hex[:8]
        with sync_redis(self.redis.url, decode_responses=True) as client, client.pipeline() as pipe:
            for n in range(20):
                fields = {"bkey": f"probe-{probe}", "seq": str(n), "mid": f"probe-{probe}-{n}"}
                pipe.xadd(key, {**fields, "block": "1" if n == 0 else "0"})
            pipe.execute()

        def blocking() -> bool:
            tail.poll()
            return tail.blocked is not None

        if not self.wait_until(blocking, 10, f"a handler of {worker.name} to block"):
            flag.unlink()
            return
        assert tail.blocked is not None
        blocked_at = tail.blocked
        self.faults.append(Fault(worker.pid, "STOP", blocked_at))
        worker.stopped = True
        self.note(f"a handler blocks the event loop of {worker.name}")
        self.wait_moved(members, held, blocked_at)
        self.wait_converged("event loop blocked, lease over (without the blocked)", blocked_at)
        self.burst()
        time.sleep(0.3)
        unblocked = now()
        self.faults.append(Fault(worker.pid, "CONT", unblocked))
        flag.unlink()
        worker.stopped = False
        self.note(f"the event loop of {worker.name} goes on")
        self.context = "after the blocked event loop went on"
        self.wait_converged("the blocked event loop goes on", unblocked)

    def kill_a_worker(self) -> None:
        self.context = "kill -9 a worker"
        worker = self.busiest()
        self.burst()
        time.sleep(0.15)
        self.catch_in_flight(worker, signal.SIGKILL)
        killed = self.faults[-1].t
        self.retire(worker)
        self.scale_out(8)  # during the fault
        self.start_worker()
        self.wait_converged("kill -9 of a worker, scale-out to 8, replacement", killed)

    def rebalance_under_load(self) -> None:
        """A worker joins, then one leaves (SIGTERM), while the producers publish at their fast rate."""
        self.context = "rebalance under load"
        self.set_fast(True)
        time.sleep(1.0)  # queues fill up
        joined = now()
        self.start_worker()
        self.wait_converged("a worker joins under load", joined)
        leaving = self.busiest()
        self.retire(leaving)
        left = now()
        self.note(f"SIGTERM {leaving.name}")
        if leaving.terminate() != 0:
            self.fail(f"{leaving.name} did not leave cleanly on SIGTERM: {leaving.death()}")
        self.wait_converged("a worker leaves (SIGTERM) under load", left)

    def set_fast(self, fast: bool) -> None:
        if fast != self.fast:
            self.fast = fast
            for producer in self.producers:
                if producer.process.poll() is None:
                    producer.process.send_signal(signal.SIGUSR2)
            self.note(f"producers at their {'fast' if fast else 'normal'} rate")

    def kill_the_coordinator(self) -> None:
        self.set_fast(False)
        self.context = "kill -9 the coordinator"
        assert self.coordinator is not None
        self.burst()
        time.sleep(0.1)
        killed = now()
        self.coordinator.process.kill()
        self.coordinator.process.wait()
        self.note("kill -9 coordinator")
        self.start_coordinator()
        self.wait_converged("kill -9 of the coordinator, new one started", killed)

    def restart_redis(self, sig: signal.Signals, outage_s: float) -> None:
        self.context = f"Redis {sig.name}, {outage_s} s outage"
        self.burst()
        time.sleep(0.1)
        self.redis_down = True
        self.redis.stop(sig)
        self.note(f"redis-server stopped ({sig.name})")
        down = now()
        while now() - down < outage_s:
            self.supervise()
            time.sleep(0.1)
        self.redis.start()
        self.redis_down = False
        self.note("redis-server started again")
        self.wait_converged(f"Redis {sig.name} and restart after {outage_s} s", down)

    def finish(self) -> tuple[list[Publish], dict[str, int], float | None]:
        """Stop the producers, let the workers drain, stop them; the publishes and pending counts."""
        self.context = "the end"
        for producer in self.producers:
            producer.stopped = True
            if producer.terminate() != 0:
                self.fail(f"producer {producer.name} did not stop cleanly on SIGTERM: {producer.death()}")
        publishes = [
            Publish.from_json(r) for n in range(2) for r in read_jsonl(self.tmp / f"published-{n}.jsonl")
        ]
        acked = {(p.id, p.mid) for p in publishes if p.ev == "ack"}
        keys = self.shard_keys()
        checker = sync_redis(self.redis.url, decode_responses=True)
        started = now()

        def drained() -> bool:
            done = {
                (r["id"], r.get("mid"))
                for w in self.workers + self.gone
                for r in read_jsonl(w.records or Path())
                if r["ev"] == "end"
            }
            return acked <= done and all(checker.xpending(k, GROUP)["pending"] == 0 for k in keys)

        drain: float | None = now() - started if self.wait_until(drained, DRAIN_S, "the drain") else None
        for worker in self.workers:
            worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                code = worker.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
                self.faults.append(Fault(worker.pid, "KILL", now()))
                code = None
            if code != 0:
                self.fail(f"{worker.name} did not stop cleanly on SIGTERM: {worker.death()}")
        pending = {k: int(checker.xpending(k, GROUP)["pending"]) for k in keys}
        pending |= {f"{k}:dlq": int(checker.xlen(f"{k}:dlq")) for k in keys if checker.xlen(f"{k}:dlq")}
        for k in keys:  # dead-lettered: the entry's id in its shard and its delivery count
            for _, fields in checker.xrange(f"{k}:dlq"):
                self.dead[fields.get("mid", fields["rscSourceId"])] = int(fields["rscDeliveries"])
        checker.close()
        return publishes, pending, drain

    def journal(self) -> list[tuple[str, str, str]]:
        with sync_redis(self.redis.url, decode_responses=True) as client:
            entries = client.xrange(AggregateId(self.prefix, GROUP).journal_key)
        return [(entry_id, fields["kind"], fields["data"]) for entry_id, fields in entries]

    def records(self) -> list[Record]:
        return [
            Record.from_json(r) for w in self.workers + self.gone for r in read_jsonl(w.records or Path())
        ]

    def cleanup(self) -> None:
        for child in [*self.workers, *self.gone, *self.producers, *self.coordinators]:
            if child.process.poll() is None:
                with contextlib.suppress(OSError):
                    child.process.send_signal(signal.SIGCONT)
                child.process.kill()
                child.process.wait()
        if self.own_redis:
            self.redis.close()
        self.http.close()


@contextlib.contextmanager
def chaos(tmp: Path, **options: Any) -> Iterator[Chaos]:
    """A run (`Chaos`'s options), its processes killed at the end whatever happened."""
    run = Chaos(tmp, **options)
    try:
        yield run
    finally:
        run.cleanup()


def summary(run: Chaos, report: Report, pending: dict[str, int], drain: float | None, took: float) -> str:
    lines = [f"chaos run of {took:.0f} s, stream {run.prefix}, {run.shards} shards, logs in {run.tmp}"]
    lines += [f"  {name:>17}: {value}" for name, value in report.figures().items()]
    left = {k: v for k, v in pending.items() if v}
    lines.append(f"  {'pending at end':>17}: {sum(left.values())} {left or ''}")
    lines.append(f"  {'drain':>17}: " + (f"{drain:.1f} s" if drain is not None else "did not finish"))
    lines.append("  convergence:")
    lines += [
        f"    {label}: " + (f"{seconds:.1f} s" if seconds is not None else "NOT REACHED")
        for label, seconds in run.convergence
    ]
    drift = abs(run.offsets[-1] - run.offsets[0]) * 1000
    lines.append(f"  clock offset drift (realtime - monotonic) during the run: {drift:.2f} ms")
    lines += report.problems()
    if run.dead:  # the chaos handler never raises: nothing should ever be dead-lettered
        records = run.records()
        started = {r.mid for r in records if r.ev == "start"}
        ended = {r.mid for r in records if r.ev == "end"}
        lines.append(
            f"dead-lettered although the handler never raises: {len(run.dead)} "
            f"(rscDeliveries {sorted(set(run.dead.values()))}); {sum(m in ended for m in run.dead)} of them "
            f"had completed a handler call before, {sum(m not in started for m in run.dead)} never reached "
            f"a handler, {sum(p.mid in run.dead for p in report.lost)} are lost acknowledged publishes"
        )
    lines.append("timeline (CLOCK_MONOTONIC):")
    lines += [f"  {t:.3f} {what}" for t, what in run.timeline if not what.startswith("FAILURE")]
    if run.failures:
        lines.append(f"harness-visible failures: {len(run.failures)}")
        lines += [f"  {f}" for f in run.failures]
    return "\n".join(lines)


def test_the_data_plane_keeps_its_promises_under_faults(tmp_path: Path) -> None:
    began = now()
    with chaos(tmp_path) as run:
        run.setup()
        schedule = [
            lambda: run.sigstop_workers(2, scale_to=6),
            run.kill_a_worker,
            run.rebalance_under_load,
            run.block_a_worker,
            run.kill_the_coordinator,
            lambda: run.restart_redis(signal.SIGKILL, 2.5),
            lambda: run.restart_redis(signal.SIGTERM, 6.0),
        ]
        for step in schedule:
            if sum(seconds is None for _, seconds in run.convergence) >= 2:  # stay within the timeout
                run.fail(f"the rest of the schedule was skipped ({len(schedule)} steps in all)")
                break
            step()
        publishes, pending, drain = run.finish()
        run.offsets.append(run.clock_offset())
        offset = sum(run.offsets) / len(run.offsets)
        ownership = ownership_from_journal(run.journal(), offset)
        report = check(run.records(), publishes, run.faults, ownership)
    text = summary(run, report, pending, drain, now() - began)
    print("\n" + text)
    assert report.published > 500, text
    assert report.ok, text  # a, c, d, e
    assert not any(pending.values()), text  # b (and nothing dead-lettered)
    assert not run.failures, text
