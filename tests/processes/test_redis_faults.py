"""The coordinator when its Redis hangs or refuses it: bounded answers, one-line start-up errors."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
import pytest
import redis
import trio

from rsc.actors.keys import COORDINATOR_LEASE_KEY
from rsc.coordinator_process import serve
from tests import redis_servers
from tests.httpkit import FAST, hb, serve_on, wait_for_output


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process is frozen (SIGSTOP) inside the block, and thawed after, whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_a_hung_redis_gives_quick_503s_and_not_ready(prefix: str) -> None:
    with redis_servers.standalone() as url:
        settings = attrs.evolve(
            FAST, redis_url=url, redis_command_timeout_ms=500, redis_connect_timeout_ms=500
        )
        async with serve_on(settings) as client:
            joined = await client.post("/v1/heartbeat", json=hb(prefix, "a", 0))
            assert joined.status_code == 200
            with stopped(redis_servers.server_pid(url)):
                started = trio.current_time()
                ready = await client.get("/readyz")
                assert ready.status_code == 503
                assert ready.json()["details"] == {"redis": "timeout"}
                assert trio.current_time() - started < 3
                started = trio.current_time()
                write = await client.post("/v1/heartbeat", json=hb(prefix, "b", 0))  # a join writes
                assert write.status_code == 503, write.text
                assert write.json()["error"] == "UNAVAILABLE"
                assert trio.current_time() - started < 5
                assert (await client.get("/healthz")).status_code == 200  # alive, just not ready
            with trio.fail_after(20):  # Redis is back: so is the coordinator
                while (await client.get("/readyz")).status_code != 200:
                    await trio.sleep(0.1)
                while (
                    rejoin := await client.post("/v1/heartbeat", json=hb(prefix, "b", 0))
                ).status_code != 200:
                    await trio.sleep(0.1)
            assert rejoin.json()["status"] in ("OK", "REVOKE_PENDING")
            # The member that was there before the hang (shorter than its lease) is still a member.
            epoch = joined.json()["memberEpoch"]
            owned = joined.json()["assignment"]["assigned"]
            steady = await client.post("/v1/heartbeat", json=hb(prefix, "a", epoch, ownedShards=owned))
            assert steady.status_code == 200
            assert steady.json()["status"] in ("OK", "REVOKE_PENDING")
            assert steady.json()["memberEpoch"] >= epoch


def run_serve(tmp_path: Path, redis_url: str, *extra: str, timeout: float = 30) -> tuple[int, str]:
    """`rsc serve` as a child process that is expected to stop by itself: exit code and output."""
    port = redis_servers.free_port()
    env = {**os.environ, "RSC_REDIS_URL": redis_url}
    command = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}", *extra]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return result.returncode, result.stdout + result.stderr


def test_a_wrong_redis_password_is_one_line_without_the_password(tmp_path: Path) -> None:
    with redis_servers.standalone(password="right-pass") as url:
        wrong = url.replace("right-pass", "wrong-pass")
        code, output = run_serve(tmp_path, wrong)
    assert code == 2  # a start-up mistake
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert "refused" in lines[0]
    assert "wrong-pass" not in output


def test_the_startup_line_hides_the_redis_password(tmp_path: Path) -> None:
    with redis_servers.standalone(password="hidden-pass") as url:
        port = redis_servers.free_port()
        env = {**os.environ, "RSC_REDIS_URL": url}
        log_path = tmp_path / "serve.log"
        command = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
        with log_path.open("wb") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_for_output(process, log_path, "listening on")
                assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=20)
        text = log_path.read_text()
        assert "hidden-pass" not in text
        assert ":***@127.0.0.1" in text


def test_an_exposed_bind_without_credentials_is_refused_in_one_line(
    tmp_path: Path, standalone_url: str
) -> None:
    port = redis_servers.free_port()
    env = {**os.environ, "RSC_REDIS_URL": standalone_url}
    command = [sys.executable, "-m", "rsc", "serve", "--bind", f"0.0.0.0:{port}"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2  # a start-up mistake
    assert "Traceback" not in result.stderr
    assert "--insecure" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


async def test_a_request_in_flight_at_shutdown_is_still_answered(prefix: str) -> None:
    """SIGTERM is graceful: the server stops accepting, answers what it is working on, then stops."""
    with redis_servers.standalone() as url:
        settings = attrs.evolve(FAST, redis_url=url, redis_command_timeout_ms=1_000)
        shutdown = trio.Event()
        answers: list[int] = []
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(
                lambda task_status: serve(settings, "127.0.0.1:0", shutdown=shutdown, task_status=task_status)
            )
            async with httpx.AsyncClient(base_url=urls[0], timeout=10) as client:

                async def slow_join() -> None:  # waits for the frozen Redis, then gets its 503
                    answers.append((await client.post("/v1/heartbeat", json=hb(prefix, "a", 0))).status_code)

                with stopped(redis_servers.server_pid(url)):
                    nursery.start_soon(slow_join)
                    await trio.sleep(0.3)  # the request is in flight
                    shutdown.set()
                    with trio.fail_after(10):
                        while not answers:
                            await trio.sleep(0.05)
        assert answers == [503]


async def test_a_redis_hang_longer_than_the_coordinator_lease_says_redis_is_the_cause(prefix: str) -> None:
    """A lone coordinator that cannot renew its lease stops acting, and says why (not 'standby')."""
    with redis_servers.standalone() as url:
        settings = attrs.evolve(
            FAST,
            redis_url=url,
            redis_command_timeout_ms=300,
            redis_connect_timeout_ms=300,
            coordinator_lease_ttl_ms=1_000,
        )
        async with serve_on(settings) as client:
            joined = (await client.post("/v1/heartbeat", json=hb(prefix, "a", 0))).json()
            with stopped(redis_servers.server_pid(url)):
                await trio.sleep(2.5)  # past the lease: no renewal got through
                ready = await client.get("/readyz")
                assert ready.status_code == 503
                assert ready.json()["error"] == "NOT_READY"
                assert ready.json()["details"]["redis"] in ("unreachable", "timeout")
                beat = await client.post("/v1/heartbeat", json=hb(prefix, "a", joined["memberEpoch"]))
                assert beat.status_code == 503
                assert beat.json()["error"] == "UNAVAILABLE", beat.text
                assert "Redis" in beat.json()["message"]
            with trio.fail_after(20):  # Redis is back: a new term, and the member is still a member
                while (await client.get("/readyz")).status_code != 200:
                    await trio.sleep(0.1)
            owned = joined["assignment"]["assigned"]
            steady = await client.post(
                "/v1/heartbeat", json=hb(prefix, "a", joined["memberEpoch"], ownedShards=owned)
            )
            assert steady.status_code == 200, steady.text
            assert steady.json()["status"] == "OK"


async def test_a_coordinator_leaving_on_an_error_still_releases_its_lease() -> None:
    """Cancelled mid-command, the client's connections may be broken: the lease goes anyway."""
    with redis_servers.standalone() as url:

        async def fail_while_serving() -> None:
            async with serve_on(attrs.evolve(FAST, redis_url=url)) as client:
                assert (await client.get("/readyz")).status_code == 200
                raise LookupError("the embedding application failed")

        with pytest.raises(BaseExceptionGroup) as raised:
            await fail_while_serving()
        assert raised.group_contains(LookupError)
        with redis.Redis.from_url(url) as checker:
            assert checker.get(COORDINATOR_LEASE_KEY) is None  # a standby may take over at once


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://:pw@127.0.0.1:99999", "Port out of range"),
        ("redis://127.0.0.1:6379/abc", "the database must be a number"),
        ("http://127.0.0.1:6379", "expected redis://"),
    ],
)
def test_an_unusable_redis_url_is_one_line(tmp_path: Path, url: str, says: str) -> None:
    code, output = run_serve(tmp_path, url)
    assert code == 2  # a start-up mistake
    assert "Traceback" not in output
    assert len(output.strip().splitlines()) == 1, output
    assert says in output
    assert ":pw@" not in output


def test_a_database_redis_refuses_is_one_line(tmp_path: Path, standalone_url: str) -> None:
    code, output = run_serve(tmp_path, f"{standalone_url}/99")
    assert code == 2  # a start-up mistake
    assert "Traceback" not in output
    assert len(output.strip().splitlines()) == 1, output
    assert "DB index is out of range" in output
