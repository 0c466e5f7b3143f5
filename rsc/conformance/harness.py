"""The conformance kit's real parts: a private redis-server, a coordinator (`rsc serve`), the
client under test started by its command line, a producer, and what they recorded.

Blocking code (subprocesses, threads, redis-py, httpx): the kit is a test driver, not a
service. Every process it starts is killed when the `Harness` closes, whatever happened.
Times are `CLOCK_MONOTONIC` seconds, as the client's records are (docs/clients.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families

from rsc.actors.keys import AggregateId
from rsc.client.sync import SyncCoordinator, SyncProducer
from rsc.conformance.history import Fault, Ownership, Publish, Record, ownership_from_journal
from rsc.events.wire import SEAL_SUFFIX
from rsc.sync_connect import sync_redis

#: The coordinator's timings in every scenario: short, so that leases and revokes run in seconds.
HEARTBEAT_MS, LEASE_MS, REVOKE_TIMEOUT_MS, SHARDS = 200, 2_000, 5_000, 4
MEMBER_TOKEN = "conformance-member-token"
PRODUCER_TOKEN = "conformance-producer-token"
ADMIN_PASSWORD = "conformance-admin"


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(condition: Callable[[], bool], seconds: float, step: float = 0.05) -> bool:
    """Poll `condition` until it holds (True) or `seconds` pass (False)."""
    deadline = now() + seconds
    while True:
        with contextlib.suppress(Exception):
            if condition():
                return True
        if now() > deadline:
            return False
        time.sleep(step)


class RedisServer:
    """A redis-server on a free port in its own directory; stopped, restarted, its data lost."""

    def __init__(self, workdir: Path, binary: str = "redis-server") -> None:
        self.binary = shutil.which(binary) or binary
        self.dir = workdir / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
        args += ["--save", "", "--appendonly", "no", "--dbfilename", "dump.rdb"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_for(self.ping, 10):
            raise RuntimeError(f"redis-server on port {self.port} did not start")

    def ping(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def snapshot(self) -> bytes:
        """The dataset as an RDB file, now (`SAVE`)."""
        with self.client() as r:
            r.save()
        return (self.dir / "dump.rdb").read_bytes()

    def restart_from(self, rdb: bytes) -> None:
        """Stop, then start again from `rdb`: an older copy of the data (a restored backup, a
        failover to a replica that lagged)."""
        self.stop()
        (self.dir / "dump.rdb").write_bytes(rdb)
        self.start()

    def client(self) -> redis.Redis:
        """A redis-py client (decoded replies)."""
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)


class Client:
    """One process of the client under test: its records read from stdout by a thread."""

    def __init__(self, command: list[str], env: Mapping[str, str], log: Path) -> None:
        self.log = log
        self._err = log.open("ab")
        self.process = subprocess.Popen(
            command, env=dict(env), stdout=subprocess.PIPE, stderr=self._err, start_new_session=True
        )
        self.pid = self.process.pid
        self.records: list[Record] = []
        #: What it published (the producer role): its "ack" and "fail" lines.
        self.publishes: list[Publish] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            try:
                data = json.loads(raw)
                if isinstance(data, dict) and data.get("ev") in ("start", "end", "abort"):
                    data.setdefault("pid", self.pid)
                    self.records.append(Record.from_json(data))
                elif isinstance(data, dict) and data.get("ev") in ("ack", "fail"):
                    self.publishes.append(Publish.from_json(data))
            except (ValueError, KeyError, TypeError):
                continue

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def wait(self, seconds: float) -> int | None:
        try:
            return self.process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.alive():
            self.signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout=2)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._err.close()

    def stderr_tail(self, lines: int = 3) -> str:
        with contextlib.suppress(OSError):
            text = self.log.read_text(errors="replace").strip().splitlines()
            return " | ".join(text[-lines:])
        return ""


class Harness:
    """Redis, a coordinator and the client processes of one scenario, in `workdir`."""

    def __init__(self, client_command: str, workdir: Path, redis_server: str = "redis-server") -> None:
        self.command = shlex.split(client_command)
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.redis = RedisServer(workdir, redis_server)
        self.stream = f"cf-{secrets.token_hex(3)}"
        self.group = "conformance"
        self.port = free_port()
        self.coordinators: dict[int, subprocess.Popen[bytes]] = {}
        self.clients: list[Client] = []
        self.faults: list[Fault] = []
        self.publishes: list[Publish] = []
        self.serve_env: dict[str, str] = {}
        self._seq = 0
        self.http = httpx.Client(base_url=self.url, timeout=5.0)

    # -- the coordinator --------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start_coordinator(self, port: int | None = None, standby: bool = False, **extra: str) -> None:
        """`rsc serve` on `port` (default: the harness's); ready, or (`standby`) answering."""
        port = port or self.port
        credentials = [
            {"name": "members", "token": MEMBER_TOKEN, "roles": ["member"], "create": True},
            {"name": "producers", "token": PRODUCER_TOKEN, "roles": ["producer"], "create": True},
        ]
        env = {
            **os.environ,
            "RSC_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS),
            "RSC_MEMBER_LEASE_TTL_MS": str(LEASE_MS),
            "RSC_REVOKE_TIMEOUT_MS": str(REVOKE_TIMEOUT_MS),
            "RSC_TICK_INTERVAL_MS": "100",
            "RSC_DEFAULT_SHARD_COUNT": str(SHARDS),
            "RSC_COORDINATOR_LEASE_TTL_MS": "1000",
            # the judges read every entry back from Redis: retention must not trim them first
            "RSC_RETENTION_INTERVAL_MS": "0",
            "RSC_ADMIN_PASSWORD": ADMIN_PASSWORD,
            "RSC_CREDENTIALS": json.dumps(credentials),
            "RSC_ADVERTISE_URL": f"http://127.0.0.1:{port}",
            **self.serve_env,
            **extra,
        }
        log = (self.workdir / f"coordinator-{port}.log").open("ab")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rsc",
                "serve",
                "--bind",
                f"127.0.0.1:{port}",
                "--redis-url",
                self.redis.url,
            ],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        self.coordinators[port] = process
        wanted = (200, 503) if standby else (200,)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=2.0) as probe:
            if not wait_for(lambda: probe.get("/readyz").status_code in wanted, 30, 0.1):
                raise RuntimeError(f"the coordinator on {port} did not start (log: {log.name})")

    def kill_coordinator(self, port: int | None = None) -> None:
        process = self.coordinators.pop(port or self.port, None)
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def stall_coordinator(self, seconds: float, port: int | None = None) -> None:
        """SIGSTOP the coordinator for `seconds` (less than its lease and the members'): nobody
        learns anything new from it meanwhile."""
        process = self.coordinators[port or self.port]
        process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            process.send_signal(signal.SIGCONT)

    def stall_at_seal(
        self, path: str, body: Mapping[str, Any], shard_key: str, seconds: float
    ) -> tuple[httpx.Response, int]:
        """`PUT path` (a scale-in) and, the moment Redis holds `shard_key`'s seal (before the
        coordinator can tell anyone the new layout, within a few ms), SIGSTOP the coordinator for
        `seconds`: its parties go on with the layout they had, so a producer that ignores the
        seal appends to the sealed shard. The answer, and when the seal was seen (ms since the
        epoch: no correct append lands on the key after it)."""
        process = self.coordinators[self.port]
        answer: list[httpx.Response] = []
        put = threading.Thread(target=lambda: answer.append(self.admin("PUT", path, json=dict(body))))
        put.start()
        seal = f"{shard_key}{SEAL_SUFFIX}"
        with self.redis.client() as r:
            if not wait_for(lambda: bool(r.exists(seal)), 10, 0.001):
                put.join()
                raise RuntimeError(f"kit: the scale-in never sealed {shard_key}: {answer}")
        process.send_signal(signal.SIGSTOP)
        sealed_ms = int(time.time() * 1000)
        try:
            time.sleep(seconds)
        finally:
            process.send_signal(signal.SIGCONT)
        put.join()
        return answer[0], sealed_ms

    def use(self, port: int) -> None:
        """Ask the coordinator on `port` from now on (the views, the producer)."""
        self.port = port
        self.http.close()
        self.http = httpx.Client(base_url=self.url, timeout=5.0)

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.request(method, path, auth=("admin", ADMIN_PASSWORD), **kwargs)

    def group_view(self) -> dict[str, Any] | None:
        answer = self.admin("GET", f"/v1/streams/{self.stream}/groups/{self.group}")
        if answer.status_code != 200:
            return None
        view: dict[str, Any] = answer.json()
        return view

    def stream_copy(self) -> dict[bytes, bytes]:
        """The stream aggregate's keys as they are now (DUMP): its journal and snapshot."""
        pattern = f"*{{{AggregateId(self.stream).tag}}}*"
        with self.redis.client() as r:
            return {key: r.dump(key) for key in r.scan_iter(match=pattern)}

    def restore_stream(self, copy: dict[bytes, bytes]) -> None:
        """Put the stream aggregate's keys back as `copy` has them (and nothing else of it): as
        if the node holding them failed over to a replica that had not received the latest writes."""
        pattern = f"*{{{AggregateId(self.stream).tag}}}*"
        with self.redis.client() as r:
            for key in list(r.scan_iter(match=pattern)):
                r.delete(key)
            for key, value in copy.items():
                r.restore(key, 0, value, replace=True)

    def routing(self) -> list[dict[str, Any]]:
        """The stream's ACTIVE shards in routing order (`GET .../routing`)."""
        answer: list[dict[str, Any]] = []

        def read() -> bool:
            body = self.admin("GET", f"/v1/streams/{self.stream}/routing").json()
            answer[:] = body.get("shards") or []
            return "shards" in body

        if not wait_for(read, 10, 0.1):
            raise RuntimeError(f"no routing for {self.stream}")
        return answer

    def producers(self) -> dict[str, bool]:
        """Producer id -> whether it reported `quiesced`, of the producers the stream view lists."""
        view = self.admin("GET", f"/v1/streams/{self.stream}")
        return {p["producerId"]: bool(p.get("quiesced")) for p in view.json().get("producers", ())}

    def entries(self) -> list[tuple[str, str, dict[str, str]]]:
        """(shard key, id, fields) of every entry of the stream's shard keys."""
        out = []
        with self.redis.client() as r:
            for key in r.scan_iter(match=f"*{self.stream}*", _type="stream"):
                if key.endswith(":dlq") or "journal" in key or "rsc:v1" in key:
                    continue
                out += [(key, entry, fields) for entry, fields in r.xrange(key)]
        return out

    def last_ids(self) -> dict[str, str]:
        """Each shard key of the stream and its last entry's id: appends move it, trims do not."""
        with self.redis.client() as r:
            keys = [k for k in r.scan_iter(match=f"*{self.stream}*", _type="stream") if "rsc:v1" not in k]
            return {k: str(r.xinfo_stream(k)["last-generated-id"]) for k in keys if not k.endswith(":dlq")}

    def producer_answers(self, status: str) -> float:
        """How many producer heartbeat answers of the stream had `status` since the coordinator
        started, as it counts them (`rsc_producer_answers_total` in `/metrics`)."""
        return self._counted("rsc_producer_answers", {"stream": self.stream, "status": status})

    def heartbeat_answers(self, status: str) -> float:
        """How many heartbeat answers of the group had `status` since the coordinator started,
        as it counts them (`rsc_heartbeat_answers_total` in `/metrics`), not as a client says."""
        return self._counted(
            "rsc_heartbeat_answers", {"stream": self.stream, "group": self.group, "status": status}
        )

    def _counted(self, name: str, want: dict[str, str]) -> float:
        text = self.admin("GET", "/metrics").text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == name
            for sample in family.samples
            if sample.name.endswith("_total") and sample.labels == want
        )

    def owners(self) -> dict[str, set[int]]:
        """Member id -> shards installed to it, as the coordinator says."""
        view = self.group_view() or {}
        return {m["memberId"]: set(m.get("assigned", ())) for m in view.get("members", ())}

    def settled(self, members: int, shards: int = SHARDS) -> bool:
        """`members` members own every one of `shards` shards between them and nothing is pending."""
        view = self.group_view()
        if view is None or len(view.get("members", ())) != members:
            return False
        owned = [s for m in view["members"] for s in m.get("assigned", ())]
        moving = any(m.get("pending") or m.get("revoking") for m in view["members"])
        return sorted(owned) == list(range(shards)) and not moving

    def journal(self) -> list[tuple[str, str, str]]:
        with self.redis.client() as r:
            entries = r.xrange(AggregateId(self.stream, self.group).journal_key)
        return [(entry_id, fields["kind"], fields["data"]) for entry_id, fields in entries]

    def fences(self) -> list[dict[str, Any]]:
        """The group's `MemberFenced` events' data."""
        return [json.loads(data) for _, kind, data in self.journal() if kind == "MemberFenced"]

    def ownership(self) -> list[Ownership]:
        offset = time.time() - now()
        return ownership_from_journal(self.journal(), offset)

    # -- the client under test -----------------------------------------------------------

    def client_env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "RSC_COORDINATOR_URL": self.url,
            "RSC_REDIS_URL": self.redis.url,
            "RSC_STREAM": self.stream,
            "RSC_GROUP": self.group,
            "RSC_TOKEN": MEMBER_TOKEN,
            "RSC_HANDLER_MS": "20",
            "RSC_CONCURRENCY": "1",
            **extra,
        }

    def start_client(self, command: str | None = None, **extra: str) -> Client:
        """One more process of the client under test (or of `command`), with the contract's
        environment and `extra` over it."""
        n = len(self.clients)
        env = self.client_env(**{"RSC_MEMBER_ID": f"member-{n}", **extra})
        args = shlex.split(command) if command else self.command
        client = Client(args, env, self.workdir / f"client-{n}.stderr")
        self.clients.append(client)
        return client

    def kill(self, client: Client) -> None:
        client.signal(signal.SIGKILL)
        client.wait(5)
        self.faults.append(Fault(client.pid, "KILL", now()))

    def records(self) -> list[Record]:
        return [r for c in self.clients for r in list(c.records)]

    def ended(self) -> set[str]:
        return {r.mid for r in self.records() if r.ev == "end" and r.mid}

    # -- the producer ----------------------------------------------------------------------

    def publish(self, count: int, keys: int = 16) -> list[str]:
        """Publish `count` messages (fields mid, bkey, seq) through the Python producer; their mids."""
        coordinator = SyncCoordinator(self.url, token=PRODUCER_TOKEN)
        data = sync_redis(self.redis.url)
        producer = SyncProducer(coordinator, data, self.stream, start_timeout_s=20.0).start()
        mids = []
        try:
            batch = []
            for _ in range(count):
                self._seq += 1
                mid, key = f"m{self._seq}", f"k{self._seq % keys}"
                batch.append(({"mid": mid, "bkey": key, "seq": str(self._seq)}, key))
                mids.append(mid)
            for at in range(0, len(batch), 100):
                part = batch[at : at + 100]
                ids = producer.publish_many(part)
                t = now()
                self.publishes += [
                    Publish("ack", fields["mid"], t, entry_id)
                    for (fields, _), entry_id in zip(part, ids, strict=True)
                ]
        finally:
            producer.close()
            coordinator.close()
            data.close()
        return mids

    def entries_by_mid(self) -> dict[str, int]:
        """How many entries of the stream's shard keys carry each `mid`."""
        found: dict[str, int] = {}
        with self.redis.client() as r:
            for key in r.scan_iter(match=f"*{self.stream}*", _type="stream"):
                if key.endswith(":dlq") or "journal" in key:
                    continue
                for _, fields in r.xrange(key):
                    if mid := fields.get("mid"):
                        found[mid] = found.get(mid, 0) + 1
        return found

    def pending(self) -> int:
        """Entries delivered to the group and not acknowledged, over every shard key."""
        with self.redis.client() as r:
            total = 0
            for key in r.scan_iter(match=f"*{self.stream}*", _type="stream"):
                if key.endswith((":dlq", ":journal")) or "journal" in key:
                    continue
                with contextlib.suppress(Exception):
                    total += int(r.xpending(key, self.group)["pending"])
            return total

    def close(self) -> None:
        for client in self.clients:
            client.kill()
        for port in list(self.coordinators):
            self.kill_coordinator(port)
        self.redis.stop()
        self.http.close()


@contextlib.contextmanager
def harness(client_command: str, workdir: Path, redis_server: str = "redis-server") -> Iterator[Harness]:
    """A `Harness` with its coordinator started, closed at the end whatever happened."""
    h = Harness(client_command, workdir, redis_server)
    try:
        h.start_coordinator()
        yield h
    finally:
        h.close()
