"""Real redis-server processes for the tests: standalone and a 3-primary cluster.

Each server runs on a free port in its own temporary directory, keeps
nothing on disk, and is stopped when the test session ends. `DurableServer`
is the exception: it keeps an AOF (fsync always) in a directory of the test's
and can be stopped and started again on the same port.
"""

from __future__ import annotations

import contextlib
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


def free_port(cluster_bus: bool = False) -> int:
    """A port that is free now (and, for cluster nodes, its bus port + 10000 too)."""
    for _ in range(200):
        port = random.randint(20_000, 40_000)
        if _port_free(port) and (not cluster_bus or _port_free(port + 10_000)):
            return port
    raise RuntimeError("no free port found")


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
def cluster(primaries: int = 3) -> Iterator[str]:
    """Yield the URL of one node of a private Redis Cluster with `primaries` primaries."""
    with tempfile.TemporaryDirectory(prefix="rsc-cluster-") as workdir:
        ports: list[int] = []
        while len(ports) < primaries:
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
                [REDIS_CLI, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
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

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
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
        args += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.workdir)]
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
