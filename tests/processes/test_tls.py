"""TLS on both sides: `rsc serve` over HTTPS (clients check it with a CA bundle) and Redis over `rediss://`."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import attrs
import httpx
import pytest
import redis
import trio

from rsc.client.coordinator import Coordinator
from rsc.client.errors import CoordinatorUnavailable
from rsc.client.member import MemberSettings
from rsc.client.poller import Message, PollerSettings
from rsc.client.producer import open_producer
from rsc.client.worker import App
from rsc.config import Settings
from rsc.connect import open_redis
from rsc.coordinator_process import serve
from rsc.events.wire import HeartbeatRequest
from tests import redis_servers
from tests.httpkit import FAST, hb

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@attrs.frozen
class Pki:
    ca: Path
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def pki() -> Iterator[Pki]:
    """A private CA and a server certificate for 127.0.0.1 and localhost, made with openssl."""
    with tempfile.TemporaryDirectory(prefix="rsc-pki-") as workdir:
        d = Path(workdir)

        def run(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=rsc test CA",
            "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
            "-out", "server.csr")  # fmt: skip
        (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.ext", "-out", "server.pem")  # fmt: skip
        yield Pki(d / "ca.pem", d / "server.pem", d / "server.key")


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[str]:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            lambda task_status: serve(settings, "127.0.0.1:0", shutdown=shutdown, task_status=task_status)
        )
        yield urls[0]
        shutdown.set()


async def test_https_with_a_ca_bundle(pki: Pki, standalone_url: str, prefix: str) -> None:
    settings = attrs.evolve(FAST, redis_url=standalone_url, certfile=str(pki.cert), keyfile=str(pki.key))
    async with serving(settings) as url:
        assert url.startswith("https://")
        async with Coordinator(url, ca_bundle=str(pki.ca)) as coordinator:
            request = HeartbeatRequest(1, prefix, "billing", "a", "inc-1", 0)
            response = await coordinator.heartbeat(request)
            assert response.member_epoch > 0
        async with Coordinator(url, retries=0) as unverified:  # the system CAs do not know ours
            with pytest.raises(CoordinatorUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
                await unverified.heartbeat(request)  # and the message says why
        async with httpx.AsyncClient() as plain:  # plain HTTP to the HTTPS port
            insecure_url = url.replace("https://", "http://")
            with pytest.raises(httpx.HTTPError):
                await plain.post(f"{insecure_url}/v1/heartbeat", json=hb(prefix, "b", 0))


@contextlib.contextmanager
def tls_redis(pki: Pki) -> Iterator[str]:
    """A redis-server that speaks only TLS; yields its `rediss://` URL (trusting the test CA)."""
    with tempfile.TemporaryDirectory(prefix="rsc-redis-tls-") as workdir:
        port = redis_servers.free_port()
        args = [
            redis_servers.REDIS_SERVER, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(pki.cert), "--tls-key-file", str(pki.key),
            "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "no",
            "--save", "", "--appendonly", "no", "--dir", workdir,
        ]  # fmt: skip
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with redis.Redis(port=port, ssl=True, ssl_ca_certs=str(pki.ca)) as client:
                        client.ping()
                    break
                except redis.ConnectionError:
                    assert time.monotonic() < deadline, "the TLS redis-server did not start"
                    time.sleep(0.05)
            yield f"rediss://127.0.0.1:{port}?ssl_ca_certs={pki.ca}"
        finally:
            process.terminate()
            process.wait(timeout=10)


async def test_the_coordinator_talks_to_redis_over_tls(pki: Pki, prefix: str) -> None:
    with tls_redis(pki) as url:
        settings = attrs.evolve(FAST, redis_url=url)
        async with serving(settings) as base, httpx.AsyncClient(base_url=base) as client:
            joined = await client.post("/v1/heartbeat", json=hb(prefix, "a", 0))
            assert joined.status_code == 200, joined.text
            assert (await client.get("/readyz")).status_code == 200
            assert (await client.get(f"/v1/streams/{prefix}")).json()["metadataVersion"] == 1


async def test_clients_publish_and_consume_over_rediss(pki: Pki, prefix: str) -> None:
    """The client side of `rediss://`: the trio producer and a member's poller through rsc.connect."""
    with tls_redis(pki) as url:
        settings = attrs.evolve(FAST, redis_url=url)
        async with serving(settings) as base:
            seen: list[str] = []
            app = App(base, url, member_settings=MemberSettings(heartbeat_interval_ms=100))

            @app.listener(stream=prefix, group="billing", poller=PollerSettings())
            async def handle(message: Message) -> None:
                seen.append(message.fields["n"])

            async with trio.open_nursery() as nursery:
                await nursery.start(app.run)
                async with (
                    Coordinator(base) as coordinator,
                    open_redis(url) as redis_client,
                    open_producer(coordinator, redis_client, prefix, "tls/0") as producer,
                ):
                    assert producer._writer is not None  # the lean append writer, over TLS too
                    assert producer._writer.endpoint.ssl_context is not None
                    for n in range(20):
                        await producer.publish({"n": str(n)}, key=f"k{n}")
                with trio.fail_after(20):
                    while len(seen) < 20:
                        await trio.sleep(0.05)
                app.stop()
            assert sorted(seen, key=int) == [str(n) for n in range(20)]
