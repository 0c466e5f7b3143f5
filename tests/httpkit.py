"""Helpers for tests of the HTTP service: serve on a free port, build heartbeats."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import trio

from rsc.config import Settings
from rsc.coordinator_process import serve
from rsc.events.auth import Credential, credential

#: Leases long enough that a loaded machine never fences a test's member by accident.
FAST = Settings(
    heartbeat_interval_ms=100,
    member_lease_ttl_ms=10_000,
    tick_interval_ms=50,
    revoke_timeout_ms=20_000,
    # No retention round unless a test asks for one (tests/clients/test_retention_end_to_end.py):
    # others count what their shard keys hold.
    retention_interval_ms=0,
)


@contextlib.asynccontextmanager
async def serve_on(settings: Settings, bind: str = "127.0.0.1:0") -> AsyncIterator[httpx.AsyncClient]:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: serve(settings, bind, shutdown=shutdown, task_status=task_status)
        )
        async with httpx.AsyncClient(base_url=urls[0], timeout=10) as http:
            await _until_active(http)
            yield http
        shutdown.set()


async def _until_active(http: httpx.AsyncClient, timeout_s: float = 15.0) -> None:
    """Wait until the coordinator holds the coordinator lease (`/readyz` 200), as far as it can.

    The tests share one Redis: a coordinator that an earlier test killed may still hold the
    lease for up to its TTL, and meanwhile this one is a standby answering 503. A test of a
    coordinator that cannot become active (its Redis is down) goes on after `timeout_s`.
    """
    with trio.move_on_after(timeout_s):
        while (await http.get("/readyz")).status_code != 200:
            await trio.sleep(0.05)


def workers_and_others(prefix: str, token: str, other: str) -> tuple[Credential, Credential]:
    """Two member credentials: `workers` (`token`) may use and create the streams of `prefix`,
    `others` (`other`) only streams named `elsewhere-*`."""
    return (
        credential("workers", ["member"], token=token, streams=[f"{prefix}*"], create=True),
        credential("others", ["member"], token=other, streams=["elsewhere-*"]),
    )


def hb(prefix: str, member: str, epoch: int, **extra: Any) -> dict[str, Any]:
    return {
        "protocolVersion": 1,
        "streamPrefix": prefix,
        "consumerGroup": "billing",
        "memberId": member,
        "incarnation": extra.pop("incarnation", "inc-1"),
        "memberEpoch": epoch,
        "metadataVersion": extra.pop("metadataVersion", 1),
        **extra,
    }


async def beat(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post("/v1/heartbeat", json=body)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def wait_for_output(
    process: subprocess.Popen[bytes], log_path: Path, text: str, timeout_s: float = 30
) -> None:
    """Wait until the child process writing `log_path` has printed `text`; fail if it exits first."""
    deadline = time.monotonic() + timeout_s
    while text not in log_path.read_text():
        assert process.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.05)


async def exited(process: subprocess.Popen[bytes], timeout_s: float = 30) -> int:
    """The exit code of a child process, waited for without blocking the event loop (a
    coordinator served by the test itself must go on answering the child meanwhile)."""
    with trio.fail_after(timeout_s):
        while process.poll() is None:
            await trio.sleep(0.05)
    return process.returncode
