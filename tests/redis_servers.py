"""Real redis-server processes for the tests: standalone and a 3-primary cluster.

Each server runs on a free port in its own temporary directory, keeps
nothing on disk, and is stopped when the test session ends. `DurableServer`
is the exception: it keeps an AOF (fsync always) in a directory of the test's
and can be stopped and started again on the same port.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis

REDIS_SERVER = shutil.which("redis-server") or "redis-server"
REDIS_CLI = shutil.which("redis-cli") or "redis-cli"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


#: Where `free_port` looks: below the kernel's ephemeral range (32768 and up on Linux), so that
#: no outgoing connection of any process takes a port between its check and its listener; the
#: bus port of a cluster node (+10000) falls in 20000-29999, where no other port is picked.
PORTS = (10_000, 20_000)


def free_port(cluster_bus: bool = False) -> int:
    """A port that is free now (and, for cluster nodes, its bus port + 10000 too).

    Each pytest-xdist worker looks in its own slice of the range, so two workers never pick
    the same port between a check and a listener: under load that window grew long enough
    for a coordinator to fail with "Address already in use" (CI, 2026-12-07)."""
    low, high = PORTS
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = int(worker[2:]) % count if worker[2:].isdigit() else 0
    size = (high - low) // count
    low += index * size
    for _ in range(200):
        port = random.randint(low, low + size - 1)
        if port in _GIVEN:
            continue
        if _port_free(port) and (not cluster_bus or _port_free(port + 10_000)):
            if len(_GIVEN) >= _REMEMBERED:
                del _GIVEN[next(iter(_GIVEN))]
            _GIVEN[port] = None
            return port
    raise RuntimeError("no free port found")


#: The last ports `free_port` gave in this process (oldest first): not given again while
#: remembered. A caller that picks several before starting anything (a Sentinel set: two
#: servers and three sentinels) saw the same free port twice, and a sentinel then found a
#: server on its port (CI, 2026-12-07: "unknown command 'SENTINEL'"). A port given longer ago
#: is in use (the check finds it) or free again.
_REMEMBERED = 256
_GIVEN: dict[int, None] = {}


def _wait_ping(port: int, timeout: float = 10.0, password: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.ConnectionError), redis.Redis(port=port, password=password) as client:
            if client.ping():
                return
        time.sleep(0.05)
    raise RuntimeError(f"redis-server on port {port} did not answer")


def _start(port: int, workdir: Path, *extra: str, password: str | None = None) -> subprocess.Popen[bytes]:
    args = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--dir", str(workdir), *extra]
    if password is not None:
        args += ["--requirepass", password]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_ping(port, password=password)
    return process


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for p in processes:
        p.terminate()
    for p in processes:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


@contextlib.contextmanager
def standalone(password: str | None = None) -> Iterator[str]:
    """Yield the URL of a private standalone redis-server (with `requirepass` if `password`)."""
    with tempfile.TemporaryDirectory(prefix="rsc-redis-") as workdir:
        port = free_port()
        process = _start(port, Path(workdir), password=password)
        try:
            auth = f":{password}@" if password else ""
            yield f"redis://{auth}127.0.0.1:{port}"
        finally:
            _stop([process])


def server_pid(url: str) -> int:
    """The pid of the redis-server behind `url` (to SIGSTOP/SIGCONT it)."""
    with redis.Redis.from_url(url) as client:
        return int(client.info("server")["process_id"])


@contextlib.contextmanager
def cluster(primaries: int = 3, replicas: int = 0) -> Iterator[str]:
    """Yield the URL of one node of a private Redis Cluster with `primaries` primaries (and
    `replicas` replicas of each)."""
    with tempfile.TemporaryDirectory(prefix="rsc-cluster-") as workdir:
        ports: list[int] = []
        while len(ports) < primaries * (1 + replicas):
            port = free_port(cluster_bus=True)
            if port not in ports:
                ports.append(port)
        processes = []
        try:
            for port in ports:
                node_dir = Path(workdir) / str(port)
                node_dir.mkdir()
                processes.append(
                    _start(port, node_dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
                )
            nodes = [f"127.0.0.1:{p}" for p in ports]
            subprocess.run(
                [
                    REDIS_CLI,
                    "--cluster",
                    "create",
                    *nodes,
                    "--cluster-replicas",
                    str(replicas),
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
            )
            _wait_cluster_ok(ports)
            yield f"redis://127.0.0.1:{ports[0]}"
        finally:
            _stop(processes)


def _wait_cluster_ok(ports: list[int], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for p in ports:
            with redis.Redis(port=p, decode_responses=True) as client:
                states.append(client.cluster("info"))
        if all("cluster_state:ok" in str(s) or _state_ok(s) for s in states):
            return
        time.sleep(0.1)
    raise RuntimeError("cluster did not become ok")


def _state_ok(info: object) -> bool:
    return isinstance(info, dict) and info.get("cluster_state") == "ok"


class DurableServer:
    """A standalone redis-server with AOF (`appendfsync always`) in `workdir`, for outage tests.

    `stop()` ends it (SIGTERM, or SIGKILL to crash it) and `start()` brings it back on the
    same port and directory, where it reloads every write it acknowledged. `close()` stops it
    for good. Used as a context manager, it is started on entry and closed on exit.
    """

    def __init__(self, workdir: Path, port: int | None = None, *, persistent: bool = True) -> None:
        self.workdir = workdir
        #: False: no AOF and no RDB, so a restart starts empty (production Redis without persistence).
        self.persistent = persistent
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> DurableServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self, timeout: float = 20.0) -> None:
        """Start it (again) and wait until it answers PING, its data loaded."""
        assert self.process is None or self.process.poll() is not None, "already running"
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        if self.persistent:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        args += ["--dir", str(self.workdir)]
        with (self.workdir / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.workdir / "redis.log").read_text()
            # ConnectionError while it binds, BusyLoadingError while it reads the AOF.
            with contextlib.suppress(redis.RedisError), redis.Redis(port=self.port) as client:
                if client.ping():
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not answer")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """Send `sig` and wait for the process to end (SIGKILL after `timeout`)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a stopped server could not act on SIGTERM
        self.stop()


SENTINEL_SERVICE = "main"


class SentinelSet:
    """A primary, one replica and three sentinels, all local (`redis-server F --sentinel`), that
    fail over in about a second: what a Sentinel deployment looks like to a client."""

    def __init__(self, workdir: Path, service: str = SENTINEL_SERVICE) -> None:
        self.workdir = workdir
        self.service = service
        self.data_ports = [free_port(), free_port()]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}"

    def __enter__(self) -> SentinelSet:
        primary, replica = self.data_ports
        for port in self.data_ports:
            (self.workdir / str(port)).mkdir(parents=True, exist_ok=True)
        self.processes.append(_start(primary, self.workdir / str(primary)))
        self.processes.append(
            _start(replica, self.workdir / str(replica), "--replicaof", "127.0.0.1", str(primary))
        )
        for port in self.sentinel_ports:
            config = self.workdir / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {self.service} 1000\n"
                f"sentinel failover-timeout {self.service} 4000\n"
                f"sentinel parallel-syncs {self.service} 1\n"
            )
            self.processes.append(
                subprocess.Popen(
                    [REDIS_SERVER, str(config), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            _wait_ping(port)
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)  # a test may have stopped one
        _stop(self.processes)

    def process(self, port: int) -> subprocess.Popen[bytes]:
        """The redis-server process of data node `port`."""
        return self.processes[self.data_ports.index(port)]

    def restart(self, port: int) -> None:
        """Start data node `port` again (after a kill), empty, as a replica of today's primary:
        what an operator does with a failed primary once a replica took its place."""
        index = self.data_ports.index(port)
        with contextlib.suppress(ProcessLookupError):
            self.processes[index].kill()
        self.processes[index].wait()
        primary = self.primary_port()
        self.processes[index] = _start(
            port, self.workdir / str(port), "--replicaof", "127.0.0.1", str(primary)
        )

    def wait_primary(self, port: int, timeout: float = 30.0) -> None:
        """Until every sentinel names `port` the primary and it says it is one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.named_primaries() == {port}:
                with contextlib.suppress(redis.ConnectionError), redis.Redis(port=port) as node:
                    if node.execute_command("ROLE")[0] in (b"master", "master"):
                        return
            time.sleep(0.1)
        raise RuntimeError(f"the sentinels did not promote {port}")

    def named_primaries(self) -> set[int]:
        """The ports the sentinels name as the primary (one when they agree)."""
        named = set()
        for sentinel_port in self.sentinel_ports:
            with redis.Redis(port=sentinel_port, decode_responses=True) as sentinel:
                answer = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                named.add(int(answer[1]))
        return named

    def primary_port(self) -> int:
        """The port of the primary, as the first sentinel names it."""
        with redis.Redis(port=self.sentinel_ports[0], decode_responses=True) as sentinel:
            _, port = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
            return int(port)

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until every sentinel knows the replica, in sync, and the other sentinels."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._ready(port) for port in self.sentinel_ports):
                return
            time.sleep(0.1)
        raise RuntimeError("the sentinels did not get ready")

    def _ready(self, port: int) -> bool:
        with redis.Redis(port=port, decode_responses=True) as sentinel:
            replicas = sentinel.execute_command("SENTINEL", "REPLICAS", self.service)
            others = sentinel.execute_command("SENTINEL", "SENTINELS", self.service)
        linked = [r for r in replicas if _pairs(r).get("master-link-status") == "ok"]
        return bool(linked) and len(others) == len(self.sentinel_ports) - 1

    def failover(self, timeout: float = 30.0) -> int:
        """`SENTINEL FAILOVER` (the replica, in sync, becomes the primary): the new primary's port
        once every sentinel names it and it says it is the primary."""
        old = self.primary_port()
        self.wait_ready()
        self._wait_replicated(old, timeout)
        with redis.Redis(port=self.sentinel_ports[0]) as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", self.service)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ports = self.named_primaries()
            if len(ports) == 1 and (new := ports.pop()) != old and self._switched(old, new):
                return new
            time.sleep(0.1)
        raise RuntimeError("the failover did not complete")

    @staticmethod
    def _wait_replicated(primary: int, timeout: float) -> None:
        """Until every replica has what `primary` had written when asked: a forced
        `SENTINEL FAILOVER` does not wait for it, and a write made just before was lost with
        the old primary's resync (CI: a key set before the failover read back as None)."""
        deadline = time.monotonic() + timeout
        with redis.Redis(port=primary) as node:
            target = int(node.info("replication")["master_repl_offset"])
            while time.monotonic() < deadline:
                info = node.info("replication")
                offsets = [
                    int(v["offset"]) for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                ]
                if offsets and min(offsets) >= target:
                    return
                time.sleep(0.02)
        raise RuntimeError(f"the replicas did not reach offset {target} of {primary}")

    @staticmethod
    def _switched(old: int, new: int) -> bool:
        """`new` is the primary and `old` its replica again (until then `old` still accepts
        writes, which the resync drops: Redis' asynchronous replication, not ours to test)."""
        with redis.Redis(port=new, decode_responses=True) as node:
            if node.execute_command("ROLE")[0] != "master":
                return False
        with redis.Redis(port=old, decode_responses=True) as node:
            role = node.execute_command("ROLE")
        return role[0] == "slave" and int(role[2]) == new and role[3] == "connected"


def _pairs(flat: object) -> dict[str, str]:
    """A sentinel's flat [name, value, ...] reply (redis-py may have made it a dict already)."""
    if isinstance(flat, dict):
        return {str(k): str(v) for k, v in flat.items()}
    items = list(flat)  # type: ignore[call-overload]
    return {str(items[i]): str(items[i + 1]) for i in range(0, len(items) - 1, 2)}
