"""Shared fixtures: private Redis servers (standalone and a 3-primary cluster)."""

from __future__ import annotations

import gc
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis as redis_py
import trio
from hypothesis import settings
from redis.cluster import RedisCluster

from rsc import journal
from rsc.actors.redis_store import RedisStore
from rsc.actors.store_connection import RedisClient, open_lean, open_redis
from rsc.resp import Multiplexed
from tests import redis_servers

#: The tiers, one folder each (docs/development.md says which to run when); each test is
#: marked with its folder's tier, so `-m core`, `-m "http or clients"`... select them too.
TIERS = ("core", "actors", "http", "clients", "processes", "chaos", "browser", "compat", "conformance")
#: Tiers of real processes, several servers, a browser or the previous release: `make test`
#: runs them, `make test-fast` (`-m "not slow"`, the inner loop) leaves them out.
SLOW_TIERS = frozenset({"processes", "chaos", "browser", "compat", "conformance"})
#: In-process modules that take long all the same (several servers, long scenarios, many
#: examples): left out of `make test-fast` too.
SLOW_MODULES = frozenset(
    {
        "test_actors_redis",
        "test_admin_strict",
        "test_client_http",
        "test_docs_examples",
        "test_poller_faults",
        "test_group_operations_end_to_end",
        "test_idempotence",
        "test_poller_wakeup",
        "test_producer_faults",
        "test_producers_http",
        "test_redis_calls",
        "test_retention_end_to_end",
        "test_scale_out",
        "test_schemathesis",
        "test_security",
        "test_store_contract",
        "test_sync_producer",
    }
)


# `make test-fast` runs property tests with fewer examples (`--hypothesis-profile=fast`).
settings.register_profile("fast", max_examples=10)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.path.parent.name
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test module belongs in a tier's folder: {TIERS}")
        item.add_marker(getattr(pytest.mark, tier))
        if tier in SLOW_TIERS or item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What exists once every test module is imported (modules, hypothesis strategies) lives
    for the session: frozen out of the collector's sight, the collection after each test
    scans only what tests made (several times faster; it runs after every test)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collect after each test, so a leaked socket or channel fails the test that leaked it."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def standalone_url() -> Iterator[str]:
    with redis_servers.standalone() as url:
        yield url
        verify_every_aggregate(url)


@pytest.fixture(scope="session")
def cluster_url() -> Iterator[str]:
    with redis_servers.cluster() as url:
        yield url
        verify_every_aggregate(url)


def verify_every_aggregate(url: str) -> None:
    """At the end of the session, `rsc journal verify` must pass for every aggregate the tests left."""

    async def work() -> list[journal.Verdict]:
        async with open_redis(url) as client:
            store = RedisStore(client)
            return [await journal.verify(store, a) for a in await journal.every_aggregate(client, store)]

    verdicts = trio.run(work)
    failed = [v for v in verdicts if not v.ok]
    assert not failed, failed


@pytest.fixture(params=["standalone", "cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    """Each test using this runs once on standalone Redis and once on the cluster."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[RedisClient]:
    async with open_redis(redis_url) as client:
        yield client


@pytest.fixture
async def lean(redis: RedisClient) -> AsyncIterator[Multiplexed | None]:
    """The coordinator's lean connection beside `redis` (`open_lean`): one on standalone Redis,
    None on the cluster (coredis does everything there). Tests that pass it to `RedisStore` and
    `RedisEffects` run both ways: lean on standalone, coredis on the cluster."""
    async with open_lean(redis) as connection:
        yield connection


@pytest.fixture
def sync_redis(standalone_url: str) -> Iterator[redis_py.Redis]:
    """A redis-py client on the private standalone server, for independent checks of Redis state."""
    client = redis_py.Redis.from_url(standalone_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def checker(redis_url: str) -> Iterator[redis_py.Redis]:
    """An independent redis-py client on `redis_url`: a `RedisCluster` on the cluster."""
    with redis_py.Redis.from_url(redis_url, decode_responses=True) as plain:
        clustered = bool(plain.info("cluster").get("cluster_enabled"))
        if not clustered:
            yield plain
            return
    with RedisCluster.from_url(redis_url, decode_responses=True) as cluster:
        yield cluster  # type: ignore[misc]  # the same commands, cluster-routed


@pytest.fixture
def prefix() -> str:
    """A stream prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:10]}"
