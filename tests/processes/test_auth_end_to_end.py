"""Credentials end to end: `rsc worker`, the trio and sync producers and curl, on a secured coordinator."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import redis
import trio

from rsc.client.coordinator import Coordinator
from rsc.client.errors import CoordinatorRejected
from rsc.client.producer import open_producer
from rsc.client.sync import SyncCoordinator, SyncProducer
from rsc.config import Settings
from rsc.connect import open_redis
from rsc.events.auth import credential
from tests.httpkit import FAST, exited, serve_on

ROOT = Path(__file__).resolve().parents[2]
MEMBER_TOKEN = "e2e-member-token-0123456789"
PRODUCER_TOKEN = "e2e-producer-token-0123456789"
ADMIN = ("admin", "s3cret")


def secured(redis_url: str) -> Settings:
    """A coordinator with a member and a producer credential on `e2e-*` (neither may create)."""
    credentials = (
        credential("workers", ["member"], token=MEMBER_TOKEN, streams=["e2e-*"]),
        credential("shop", ["producer"], token=PRODUCER_TOKEN, streams=["e2e-*"]),
    )
    return attrs.evolve(
        FAST,
        redis_url=redis_url,
        admin_password="s3cret",
        credentials=credentials,
        heartbeat_interval_ms=200,
        member_lease_ttl_ms=2_000,
    )


def start_worker(
    base: str, redis_url: str, stream: str, tmp_path: Path, log_path: Path, token: str = MEMBER_TOKEN
) -> subprocess.Popen[bytes]:
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    env = {
        **os.environ,
        "POD_IP": "10.9.0.1",
        "RSC_TEST_STREAM": stream,
        "RSC_TEST_RESULTS": f"{stream}:results",
        "RSC_REDIS_URL": redis_url,
    }
    env.pop("RSC_TOKEN", None)
    command = [sys.executable, "-m", "rsc", "worker", "tests.workerapp:app", "--coordinator", base]
    command += ["--token-file", str(token_file)]
    with log_path.open("wb") as log:
        return subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


async def test_worker_producers_and_curl_with_credentials(
    standalone_url: str, prefix: str, sync_redis: redis.Redis, tmp_path: Path
) -> None:
    stream = f"e2e-{prefix}"
    async with serve_on(secured(standalone_url)) as http:
        base = str(http.base_url).rstrip("/")
        assert (await http.put(f"/v1/admin/streams/{stream}", json={"shardCount": 2}, auth=ADMIN)).is_success
        assert (await http.put(f"/v1/admin/streams/{stream}/groups/billing", json={}, auth=ADMIN)).is_success

        # rsc worker, its credential from a file (RSC_TOKEN works the same way)
        log_path = tmp_path / "worker.log"
        worker = start_worker(base, standalone_url, stream, tmp_path, log_path)
        try:
            with trio.fail_after(30):
                while True:
                    view = (await http.get(f"/v1/streams/{stream}/groups/billing")).json()
                    if view["members"] and view["members"][0]["state"] == "STABLE":
                        break
                    await trio.sleep(0.1)

            # the trio producer
            async with (
                Coordinator(base, token=PRODUCER_TOKEN) as coordinator,
                open_redis(standalone_url) as r,
                open_producer(coordinator, r, stream, "shop/trio") as producer,
            ):
                for n in range(20):
                    await producer.publish({"n": f"t{n}"}, key=f"k{n}")

            # the synchronous producer
            def publish_sync() -> None:
                with (
                    SyncCoordinator(base, token=PRODUCER_TOKEN) as sync_coordinator,
                    SyncProducer(sync_coordinator, sync_redis, stream, "shop/sync") as sync_producer,
                ):
                    for n in range(20):
                        sync_producer.publish({"n": f"s{n}"}, key=f"k{n}")

            await trio.to_thread.run_sync(publish_sync)

            with trio.fail_after(30):
                while sync_redis.llen(f"{stream}:results") < 40:
                    await trio.sleep(0.1)
            assert sync_redis.llen(f"{stream}:results") == 40
        finally:
            worker.send_signal(signal.SIGTERM)
            await exited(worker)
        assert worker.returncode == 0, log_path.read_text()

        # a producer without its credential is refused at once, not retried
        async with Coordinator(base, retries=0) as anonymous:
            with pytest.raises(CoordinatorRejected, match="UNAUTHENTICATED"):
                await anonymous.routing(stream)

        # curl (as a child process, without blocking the server running in this thread)
        async def curl(*extra: str) -> str:
            url = f"{base}/v1/streams/{stream}/routing"
            result = await trio.run_process(
                ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *extra, url], capture_stdout=True
            )
            return result.stdout.decode()

        assert await curl() == "401"
        assert await curl("-H", f"Authorization: Bearer {PRODUCER_TOKEN}") == "200"
        assert await curl("-H", f"Authorization: Bearer {MEMBER_TOKEN}") == "403"

        metrics = (await http.get("/metrics")).text
        assert 'rsc_auth_refusals_total{action="routing",reason="unauthenticated"}' in metrics


async def test_a_worker_waits_for_its_stream_and_stops_on_a_wrong_credential(
    standalone_url: str, prefix: str, tmp_path: Path
) -> None:
    stream = f"e2e-{prefix}"
    async with serve_on(secured(standalone_url)) as http:
        base = str(http.base_url).rstrip("/")
        # A credential that may not create: the worker waits until an operator creates the group.
        log_path = tmp_path / "waiting.log"
        worker = start_worker(base, standalone_url, stream, tmp_path, log_path)
        try:
            with trio.fail_after(10):
                while "retrying until it exists" not in log_path.read_text():
                    assert worker.poll() is None, log_path.read_text()
                    await trio.sleep(0.1)
            assert (
                await http.put(f"/v1/admin/streams/{stream}", json={"shardCount": 2}, auth=ADMIN)
            ).is_success
            put = await http.put(f"/v1/admin/streams/{stream}/groups/billing", json={}, auth=ADMIN)
            assert put.is_success
            with trio.fail_after(20):
                while not (await http.get(f"/v1/streams/{stream}/groups/billing")).json()["members"]:
                    await trio.sleep(0.1)
        finally:
            worker.send_signal(signal.SIGTERM)
            await exited(worker)
        assert worker.returncode == 0, log_path.read_text()

        # A wrong credential: the worker stops at once, with one line saying why.
        wrong_log = tmp_path / "wrong.log"
        wrong = start_worker(
            base, standalone_url, stream, tmp_path, wrong_log, token="not-the-right-token-at-all"
        )
        with trio.fail_after(20):
            while wrong.poll() is None:
                await trio.sleep(0.1)
        text = wrong_log.read_text()
        assert wrong.returncode == 1, text
        assert "the coordinator refused this worker: 401 UNAUTHENTICATED" in text
        assert "Traceback" not in text


async def test_producers_fail_fast_on_a_refused_credential(
    standalone_url: str, prefix: str, sync_redis: redis.Redis
) -> None:
    """A wrong credential, or one without the producer role, is no reason to wait for the start timeout."""
    stream = f"e2e-{prefix}"
    async with serve_on(secured(standalone_url)) as http:
        base = str(http.base_url).rstrip("/")
        assert (await http.put(f"/v1/admin/streams/{stream}", json={"shardCount": 2}, auth=ADMIN)).is_success
        for token, status in (("not-the-right-token-at-all", 401), (MEMBER_TOKEN, 403)):
            started = trio.current_time()
            async with Coordinator(base, token=token) as coordinator, open_redis(standalone_url) as r:
                with pytest.raises(CoordinatorRejected) as refused:
                    async with open_producer(coordinator, r, stream, start_timeout_s=30):
                        pass
            assert refused.value.status == status
            assert trio.current_time() - started < 5

            def start_sync(token: str = token) -> CoordinatorRejected:
                with SyncCoordinator(base, token=token) as sync_coordinator:
                    producer = SyncProducer(sync_coordinator, sync_redis, stream, start_timeout_s=30)
                    with pytest.raises(CoordinatorRejected) as sync_refused:
                        producer.start()
                    return sync_refused.value

            started = trio.current_time()
            assert (await trio.to_thread.run_sync(start_sync)).status == status
            assert trio.current_time() - started < 5
