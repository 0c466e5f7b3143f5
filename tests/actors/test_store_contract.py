"""The contract of the `Store` port, run on MemoryStore, standalone Redis (through coredis, and
through the lean connection) and a cluster."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Callable

import pytest
import redis as redis_py
import trio

from rsc.actors.errors import ConcurrencyConflict, TermFenced
from rsc.actors.keys import AggregateId
from rsc.actors.redis_store import RedisStore
from rsc.actors.store import FenceToken, MemoryStore, Store
from rsc.actors.store_connection import RedisClient, open_lean, open_redis
from rsc.resp import Multiplexed
from tests import redis_servers

#: Makes another writer on the same data, with its own fence-token provider.
Writers = Callable[[FenceToken | None], Store]


#: Where the contract runs: in memory; on standalone Redis through coredis, and through the
#: coordinator's lean connection (`open_lean`, as it runs there); on the cluster.
WHERE = ["memory", "standalone", "lean", "cluster"]


@contextlib.asynccontextmanager
async def redis_of(request: pytest.FixtureRequest) -> AsyncIterator[tuple[RedisClient, Multiplexed | None]]:
    """The coredis client, and the lean connection for "lean", of the test's parameter."""
    url = request.getfixturevalue("standalone_url" if request.param == "lean" else f"{request.param}_url")
    async with open_redis(url) as client, open_lean(client) as lean:
        yield client, lean if request.param == "lean" else None


@pytest.fixture(params=WHERE)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore(retention=20)
        return
    async with redis_of(request) as (client, lean):
        yield RedisStore(client, retention=20, lean=lean)


@pytest.fixture(params=WHERE)
async def writers(request: pytest.FixtureRequest) -> AsyncIterator[Writers]:
    if request.param == "memory":
        yield MemoryStore(retention=20).fenced_by
        return
    async with redis_of(request) as (client, lean):
        yield lambda fence_token: RedisStore(client, retention=20, fence_token=fence_token, lean=lean)


def token(value: int) -> FenceToken:
    return lambda: value


def events(*numbers: int) -> list[tuple[str, str]]:
    return [("Happened", f'{{"n":{n}}}') for n in numbers]


async def test_a_new_aggregate_is_empty(store: Store, prefix: str) -> None:
    loaded = await store.load(AggregateId(prefix, "g"))
    assert (loaded.revision, loaded.checkpoint, loaded.events) == (0, None, ())


async def test_append_then_load_in_order(store: Store, prefix: str) -> None:
    agg = AggregateId(prefix, "g")
    first = await store.append(agg, 0, events(1, 2))
    second = await store.append(agg, 2, events(3))
    assert (first.revision, second.revision) == (2, 3)
    loaded = await store.load(agg)
    assert loaded.revision == 3
    assert loaded.last_id == second.last_id
    assert [e.data for e in loaded.events] == ['{"n":1}', '{"n":2}', '{"n":3}']
    assert [e.revision for e in loaded.events] == [1, 2, 3]


async def test_wrong_expected_revision_conflicts_and_writes_nothing(store: Store, prefix: str) -> None:
    agg = AggregateId(prefix)
    await store.append(agg, 0, events(1))
    with pytest.raises(ConcurrencyConflict) as info:
        await store.append(agg, 0, events(2))
    assert info.value.actual == 1
    assert [e.data for e in (await store.load(agg)).events] == ['{"n":1}']


async def test_two_concurrent_writers_exactly_one_wins(store: Store, prefix: str) -> None:
    agg = AggregateId(prefix, "g")
    await store.append(agg, 0, events(0))
    outcomes: list[str] = []

    async def writer(n: int) -> None:
        loaded = await store.load(agg)
        await trio.sleep(0)
        try:
            await store.append(agg, loaded.revision, events(n))
            outcomes.append("won")
        except ConcurrencyConflict:
            outcomes.append("conflict")

    async with trio.open_nursery() as nursery:
        for n in (1, 2):
            nursery.start_soon(writer, n)
    assert sorted(outcomes) == ["conflict", "won"]
    assert (await store.load(agg)).revision == 2


async def test_checkpoint_replaces_the_snapshot_state(store: Store, prefix: str) -> None:
    agg = AggregateId(prefix, "g")
    await store.append(agg, 0, events(1, 2), checkpoint='{"sum":3}')
    await store.append(agg, 2, events(3))
    loaded = await store.load(agg)
    assert loaded.checkpoint is not None
    assert (loaded.checkpoint.data, loaded.checkpoint.revision) == ('{"sum":3}', 2)
    assert [e.data for e in loaded.events] == ['{"n":3}']


async def test_a_fenced_load_reads_what_an_unfenced_reader_reads(writers: Writers, prefix: str) -> None:
    """The coordinator's load (fence raised and everything read in one script) and a reader's
    (`rsc journal`: plain reads) see the same aggregate: revision, last id, checkpoint, the
    events after it with their versions, schema."""
    agg = AggregateId(prefix, "g")
    writer = writers(token(4))
    await writer.append(agg, 0, events(1, 2), checkpoint='{"sum":3}')
    await writer.append(agg, 2, events(3, 4))
    fenced, plain = await writer.load(agg), await writers(None).load(agg)
    assert fenced == plain
    assert fenced.checkpoint is not None
    assert fenced.checkpoint.revision == 2
    assert [(e.data, e.revision) for e in fenced.events] == [('{"n":3}', 3), ('{"n":4}', 4)]
    with pytest.raises(TermFenced):  # the load raised the fence to 4
        await writers(token(3)).append(agg, 4, events(5))


async def test_retention_bounds_the_journal_and_keeps_it_replayable(store: Store, prefix: str) -> None:
    agg = AggregateId(prefix, "g")
    revision = 0
    for n in range(100):
        checkpoint = f'{{"upTo":{revision + 1}}}' if (revision + 1) % 5 == 0 else None
        revision = (await store.append(agg, revision, events(n), checkpoint=checkpoint)).revision
    journal = await store.read(agg)
    assert journal[0].is_checkpoint  # the oldest retained entry is a checkpoint
    kept = [e for e in journal if not e.is_checkpoint]
    assert 20 <= len(kept) <= 25  # retention 20, plus at most one checkpoint interval
    # replay from the oldest retained entry reaches the head with nothing missing
    revisions = [journal[0].revision] + [e.revision for e in kept]
    assert revisions == list(range(journal[0].revision, 101))
    loaded = await store.load(agg)
    assert loaded.checkpoint is not None
    assert loaded.checkpoint.revision + len(loaded.events) == loaded.revision == 100


async def test_read_a_range(store: Store, prefix: str) -> None:
    agg = AggregateId(prefix, "g")
    await store.append(agg, 0, events(1, 2, 3, 4))
    everything = await store.read(agg)
    middle = await store.read(agg, everything[1].entry_id, everything[2].entry_id)
    assert [e.data for e in middle] == ['{"n":2}', '{"n":3}']
    assert len(await store.read(agg, count=3)) == 3


async def test_aggregates_do_not_share_revisions(store: Store, prefix: str) -> None:
    await store.append(AggregateId(prefix, "a"), 0, events(1))
    await store.append(AggregateId(prefix, "b"), 0, events(1))
    await store.append(AggregateId(prefix), 0, events(1))
    assert (await store.load(AggregateId(prefix, "a"))).revision == 1


# --- fencing ------------------------------------------------------------------


async def test_a_deposed_token_cannot_append_once_the_new_one_has_only_loaded(
    writers: Writers, prefix: str
) -> None:
    agg = AggregateId(prefix, "g")
    old, new = writers(token(1)), writers(token(2))
    await old.append(agg, 0, events(1))
    loaded = await new.load(agg)  # the new term reads: from now on the old one is fenced
    with pytest.raises(TermFenced) as info:
        await old.append(agg, loaded.revision, events(2))
    assert (info.value.fence, info.value.token) == (2, 1)
    with pytest.raises(TermFenced):
        await old.load(agg)
    assert [e.data for e in (await new.load(agg)).events] == ['{"n":1}']
    await new.append(agg, 1, events(3))
    assert (await new.load(agg)).revision == 2


async def test_the_fence_is_checked_before_the_revision(writers: Writers, prefix: str) -> None:
    agg = AggregateId(prefix, "g")
    old, new = writers(token(1)), writers(token(2))
    await old.append(agg, 0, events(1))
    await new.append(agg, 1, events(2))
    with pytest.raises(TermFenced):
        await old.append(agg, 1, events(3))  # stale revision too: the fence says more
    with pytest.raises(TermFenced):
        await old.append(agg, 2, events(3))  # right revision, old token
    assert (await new.load(agg)).revision == 2


async def test_the_same_or_a_higher_token_writes_and_raises_the_fence(writers: Writers, prefix: str) -> None:
    agg = AggregateId(prefix, "g")
    first, same, higher = writers(token(5)), writers(token(5)), writers(token(9))
    await first.append(agg, 0, events(1))
    await same.append(agg, 1, events(2))
    await higher.append(agg, 2, events(3))
    with pytest.raises(TermFenced) as info:
        await first.append(agg, 3, events(4))
    assert info.value.fence == 9


async def test_loading_an_aggregate_that_does_not_exist_fences_nothing(writers: Writers, prefix: str) -> None:
    agg = AggregateId(prefix, "g")
    assert (await writers(token(7)).load(agg)).revision == 0
    await writers(None).append(agg, 0, events(1))  # token 0 still writes: no fence was raised
    with pytest.raises(ConcurrencyConflict):
        await writers(token(7)).append(agg, 0, events(2))  # a new aggregate is fenced by its revision


async def test_an_unfenced_reader_reads_a_fenced_aggregate_but_cannot_write_it(
    writers: Writers, prefix: str
) -> None:
    agg = AggregateId(prefix, "g")
    await writers(token(3)).append(agg, 0, events(1, 2))
    reader = writers(None)  # as `rsc journal`
    assert (await reader.load(agg)).revision == 2
    assert len(await reader.read(agg)) == 2
    with pytest.raises(TermFenced):
        await reader.append(agg, 2, events(3))
    await writers(token(3)).append(agg, 2, events(3))  # the reader raised no fence


async def test_a_writer_without_a_term_neither_loads_nor_appends(writers: Writers, prefix: str) -> None:
    agg = AggregateId(prefix, "g")

    def no_term() -> int:
        raise TermFenced("no active term")

    await writers(token(1)).append(agg, 0, events(1))
    standby = writers(no_term)
    with pytest.raises(TermFenced):
        await standby.load(agg)
    with pytest.raises(TermFenced):
        await standby.append(agg, 1, events(2))
    with pytest.raises(TermFenced):
        await standby.load(AggregateId(prefix, "new"))
    assert (await writers(token(1)).load(agg)).revision == 1


async def test_the_coordinator_loads_an_aggregate_in_one_round_trip() -> None:
    """Restart and takeover load every aggregate: one command each (fence, snapshot and
    journal tail in one script), as a private Redis's MONITOR sees them."""
    with redis_servers.standalone() as url:
        async with open_redis(url) as client:
            store = RedisStore(client, retention=20, fence_token=token(2))
            agg = AggregateId("counted", "g")
            await store.append(agg, 0, events(1, 2), checkpoint='{"sum":3}')
            await store.append(agg, 2, events(3))
            await store.load(agg)  # (the first may load the script)
            watcher = redis_py.Redis.from_url(url)

            def sent_until_done() -> list[str]:
                with watcher.monitor() as monitor:
                    ready.set()
                    sent = []
                    for command in monitor.listen():
                        if command["command"] == "ECHO done":
                            return sent
                        if command["client_type"] != "lua":  # (what scripts call, shown apart)
                            sent.append(command["command"].split()[0].upper())
                return sent

            ready = threading.Event()
            async with trio.open_nursery() as nursery:
                seen: list[list[str]] = []

                async def watch() -> None:
                    seen.append(await trio.to_thread.run_sync(sent_until_done))

                nursery.start_soon(watch)
                await trio.to_thread.run_sync(ready.wait)
                await trio.sleep(0.1)  # (MONITOR is on once its OK came back)
                loaded = await store.load(agg)
                await client.echo("done")
            watcher.close()
    assert loaded.revision == 3
    assert seen == [["EVALSHA"]]
