"""`key_prefix` (`RSC_KEY_PREFIX`): every key rsc writes, coordinator and clients, starts with it.

The test drives every kind of key there is (journals, snapshots, checkpoints, the
stream registry, the lease and its token, the feature level, the coordinators'
registry, the audit log, shard keys, owner tokens, seals, dead letters) through a
coordinator with a namespace, then looks at every key Redis holds.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import attrs
import httpx
import pytest
import redis as redis_py
import trio

from rsc.actors.keys import KeySpace, check_namespace
from rsc.actors.store_connection import open_redis
from rsc.client.coordinator import Coordinator
from rsc.client.member import MemberSettings
from rsc.client.poller import Message, PollerSettings
from rsc.client.producer import open_producer
from rsc.client.worker import App
from rsc.config import ConfigError, Settings, validate
from tests import redis_servers
from tests.httpkit import FAST, serve_on

AUTH = ("admin", "pw")


@pytest.fixture(params=["standalone", "cluster"])
def target(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis of the test's own (standalone), or the shared cluster (keys are compared with
    what it held before)."""
    if request.param == "cluster":
        yield str(request.getfixturevalue("cluster_url"))
        return
    with redis_servers.standalone() as url:
        yield url


def every_key(url: str) -> set[str]:
    """Every key on `url`, or on every primary of its cluster."""
    with redis_py.Redis.from_url(url, decode_responses=True) as plain:
        if not plain.info("cluster").get("cluster_enabled"):
            return set(plain.scan_iter(count=1000))
        nodes = [line.split() for line in plain.execute_command("CLUSTER", "NODES").splitlines()]
    found: set[str] = set()
    for node in (fields[1] for fields in nodes if "master" in fields[2]):
        host, port = node.split("@")[0].rsplit(":", 1)
        with redis_py.Redis(host=host, port=int(port), decode_responses=True) as primary:
            found.update(primary.scan_iter(count=1000))
    return found


async def test_every_key_rsc_writes_is_under_the_namespace(target: str, prefix: str) -> None:
    namespace = f"ns-{prefix}:"
    before = every_key(target)
    settings = attrs.evolve(FAST, redis_url=target, admin_password="pw", key_prefix=namespace)
    async with serve_on(settings) as http:
        stream = f"/v1/admin/streams/{prefix}"
        assert (await http.put(stream, json={"shardCount": 4}, auth=AUTH)).status_code == 200
        assert (await http.put(f"{stream}/groups/billing", json={}, auth=AUTH)).status_code == 200
        layout = (await http.get(f"/v1/streams/{prefix}/routing")).json()
        assert all(s["key"].startswith(f"{namespace}{prefix}:{{") for s in layout["shards"])

        app = App(str(http.base_url), target, member_settings=MemberSettings(heartbeat_interval_ms=100))
        handled: list[str] = []
        poll = PollerSettings(retry_after_ms=50, reclaim_every_s=0.1, max_deliveries=1)

        @app.listener(stream=prefix, group="billing", poller=poll)
        async def handle(message: Message) -> None:
            if message.fields.get("poison"):
                raise RuntimeError("poison")  # to the dead-letter stream
            handled.append(message.id)

        async with (
            trio.open_nursery() as nursery,
            Coordinator(str(http.base_url)) as coordinator,
            open_redis(target) as data,
            open_producer(coordinator, data, prefix, "api/0") as producer,
        ):
            await nursery.start(app.run)
            for n in range(40):
                await producer.publish({"n": str(n)}, key=f"k{n}")
            await producer.publish({"poison": "1"}, key="p")
            with trio.fail_after(20):
                while len(handled) < 40:
                    await trio.sleep(0.05)
            # Scale in: seals and drains shards 2 and 3, then retires them.
            assert (await http.put(stream, json={"shardCount": 2}, auth=AUTH)).status_code == 200
            with trio.fail_after(30):
                while "DRAINING" in await shard_states(http, prefix):
                    await trio.sleep(0.1)
            await producer.publish({"n": "after"}, key="k1")
            dead = await http.get(f"{stream}/dlq", auth=AUTH)
            assert dead.status_code == 200, dead.text
            during = every_key(target)  # with the lease, released on the way out
            app.stop()

    new = every_key(target) - before
    outside = sorted(k for k in (new | during) - before if not k.startswith(namespace))
    assert not outside, outside
    kinds = {k.split("}")[-1] for k in (new | during)}
    # Each family of keys was written, so each was checked.
    for suffix in (":journal", ":snapshot", ":lease", ":token", ":features", ":rsc:v1:owners", ":dlq"):
        assert suffix in kinds, (suffix, sorted(kinds))
    assert any(k.endswith(":rsc:v1:seal") for k in new), sorted(new)
    assert f"{namespace}rsc:v1:audit" in new
    assert f"{namespace}rsc:v1:streams" in new

    _verify_and_purge(target, namespace, prefix, before, new)


async def shard_states(http: httpx.AsyncClient, prefix: str) -> set[str]:
    return {s["state"] for s in (await http.get(f"/v1/streams/{prefix}")).json()["shards"]}


def rsc(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rsc", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def _verify_and_purge(target: str, namespace: str, prefix: str, before: set[str], new: set[str]) -> None:
    """The journal tool reads the namespace; `rsc purge` removes it all, and only it."""
    where = ["--redis-url", target, "--key-prefix", namespace]
    verified = rsc("journal", "verify", *where)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"ok     s/{prefix}" in verified.stdout
    listed = rsc("purge", *where)
    assert listed.returncode == 0, listed.stderr
    assert f"{len(new)} key(s) under {namespace!r}" in listed.stdout
    assert every_key(target) - before == new  # listing deletes nothing
    purged = rsc("purge", *where, "--yes")
    assert purged.returncode == 0, purged.stderr
    assert every_key(target) == before


def test_purge_refuses_an_empty_prefix_and_a_running_coordinator(standalone_url: str) -> None:
    empty = rsc("purge", "--redis-url", standalone_url, "--key-prefix", "")
    assert empty.returncode == 2
    assert "an empty prefix would be every key in Redis" in empty.stderr
    keys = KeySpace("live-ns")
    with redis_py.Redis.from_url(standalone_url) as client:
        client.set(keys.coordinator_lease, '{"holder": "h", "token": 1}', px=60_000)
        try:
            held = rsc("purge", "--redis-url", standalone_url, "--key-prefix", "live-ns", "--yes")
        finally:
            client.delete(keys.coordinator_lease)
    assert held.returncode == 1
    assert "a coordinator holds the lease of 'live-ns:'" in held.stderr


def test_a_namespace_ends_in_a_colon_and_has_no_braces() -> None:
    assert check_namespace("") == ""
    assert check_namespace("demo") == "demo:"
    assert check_namespace("team-a:demo:") == "team-a:demo:"
    for bad in ("{demo}", "de mo", "a}"):
        with pytest.raises(ValueError, match="braces or whitespace"):
            check_namespace(bad)
        with pytest.raises(ConfigError, match="braces or whitespace"):
            validate(Settings(key_prefix=bad))
