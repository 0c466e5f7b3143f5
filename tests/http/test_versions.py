"""Versioning: the tables, protocol negotiation both ways, feature levels in Redis, the journal
schema and event upcasting, and the Admin API that finalizes a level.

The previous release itself runs beside this one in the compat tier (`tests/compat`)."""

from __future__ import annotations

import importlib.metadata
import json
import typing
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import redis as redis_py
import trio
from click.testing import CliRunner

import rsc
from rsc.actors.aggregates import GroupAggregate
from rsc.actors.effects.memory_effects import MemoryEffects
from rsc.actors.errors import NotFinalized, UnsupportedSchema
from rsc.actors.features import (
    COORDINATORS_KEY,
    FEATURES_KEY,
    FeatureLevelMoved,
    Features,
    StaticFeatures,
    UnsupportedFeatureLevel,
)
from rsc.actors.keys import COORDINATOR_TOKEN_KEY, STREAMS_KEY, AggregateId
from rsc.actors.redis_store import RedisStore
from rsc.actors.store import MemoryStore, check_levels, check_writable, level_of_events
from rsc.actors.store_connection import open_redis
from rsc.cli import main
from rsc.client.coordinator import Coordinator, Negotiation
from rsc.client.errors import CoordinatorRejected
from rsc.client.sync import SyncCoordinator
from rsc.events import codec, events
from rsc.events.model import ClientInfo, HeartbeatStatus
from rsc.events.versions import (
    ADVANCE_LEVEL,
    EVENT_LEVELS,
    GROUP_OPS_LEVEL,
    MAX_FEATURE_LEVEL,
    PROTOCOL_VERSION,
    EventVersion,
    UnsupportedEventVersion,
    current_event_version,
    negotiated,
    upcast,
)
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse, ProducerHeartbeatRequest, ShardAssignment
from rsc.journal import verify
from tests import redis_servers
from tests.actorkit import Member, registry_on
from tests.httpkit import FAST, serve_on

AUTH = ("admin", "s3cret")


# --- the tables -------------------------------------------------------------


def test_the_release_is_named_in_one_place() -> None:
    """`rsc --version`, the package metadata and `rsc.__version__` agree (`/v1/version` says
    `rsc.__version__`: tests/http/test_http.py); the changelog has a section for it."""
    printed = CliRunner().invoke(main, ["--version"]).output
    assert printed.strip() == f"rsc, version {rsc.__version__}"
    assert importlib.metadata.version("rsc") == rsc.__version__
    changelog = (Path(__file__).parents[2] / "CHANGELOG.md").read_text()
    assert f"— {rsc.__version__}" in changelog or f"[{rsc.__version__}]" in changelog


def _durable(union: Any) -> set[str]:
    return {cls.__name__ for cls in typing.get_args(union) if cls.durable}


def test_every_journaled_event_type_belongs_to_a_feature_level() -> None:
    journaled = _durable(events.GroupEvent) | _durable(events.StreamEvent)
    assert journaled == set(EVENT_LEVELS), "add the new event type to EVENT_LEVELS with a new level"
    assert all(1 <= level <= MAX_FEATURE_LEVEL for level in EVENT_LEVELS.values())


def test_a_newer_protocol_version_is_answered_in_the_newest_an_older_one_refused() -> None:
    assert [negotiated(v) for v in (0, 1, 2, 3, 99)] == [None, 1, 2, 2, 2]
    assert PROTOCOL_VERSION == 2


def _add(field: str, value: Any) -> Any:
    return lambda data: {**data, field: value}


TEST_VERSIONS = {
    "MemberLeft": (
        EventVersion(2, 2, _add("reason", "left")),
        EventVersion(
            3, 3, lambda data: {k: v for k, v in data.items() if k != "reason"} | {"why": data["reason"]}
        ),
    )
}


def test_upcasting_brings_every_older_version_to_the_newest() -> None:
    v1 = {"type": "MemberLeft", "memberId": "a", "groupEpoch": 3}
    assert upcast("MemberLeft", 1, dict(v1), TEST_VERSIONS) == {**v1, "why": "left"}
    assert upcast("MemberLeft", 2, {**v1, "reason": "x"}, TEST_VERSIONS) == {**v1, "why": "x"}
    assert upcast("MemberLeft", 3, {**v1, "why": "y"}, TEST_VERSIONS) == {**v1, "why": "y"}
    assert upcast("MemberJoined", 1, {"a": 1}, TEST_VERSIONS) == {"a": 1}  # no versions: as it is
    with pytest.raises(UnsupportedEventVersion, match=r"MemberLeft version 4: .* reads versions 1 to 3"):
        upcast("MemberLeft", 4, dict(v1), TEST_VERSIONS)
    # A writer writes the newest version its finalized level allows.
    assert [current_event_version("MemberLeft", level, TEST_VERSIONS) for level in (1, 2, 3)] == [1, 2, 3]


def test_a_journal_entry_of_an_unknown_event_version_is_refused_by_name() -> None:
    aggregate = GroupAggregate.__new__(GroupAggregate)
    data = json.dumps({"type": "MemberLeft", "memberId": "a", "groupEpoch": 3})
    assert aggregate.event_from_json(data, 1) == events.MemberLeft("a", 3)
    with pytest.raises(UnsupportedSchema, match="MemberLeft version 2"):
        aggregate.event_from_json(data, 2)


# --- feature levels and the journal in Redis ---------------------------------------


@pytest.fixture
def fresh_url() -> Iterator[str]:
    """A Redis of its own: the feature level is one per deployment."""
    with redis_servers.standalone() as url:
        yield url


@pytest.fixture
async def fresh(fresh_url: str) -> AsyncIterator[Any]:
    async with open_redis(fresh_url) as client:
        yield client


GROUP = AggregateId("orders", "billing")
JOINED = events.MemberJoined("a", "i", ClientInfo("t", "1"), 1, 1)


def entry(event: Any) -> tuple[str, str]:
    return type(event).__name__, codec.to_json(event, events.GroupEvent)


async def test_a_new_deployment_starts_at_the_highest_level_an_upgraded_one_at_1(fresh: Any) -> None:
    assert (await Features(fresh).load()).level == MAX_FEATURE_LEVEL
    await fresh.delete([FEATURES_KEY])
    await fresh.set(COORDINATOR_TOKEN_KEY, "7")  # a coordinator ran (or only took the lease): still new
    assert (await Features(fresh).load()).level == MAX_FEATURE_LEVEL
    await fresh.delete([FEATURES_KEY])
    await fresh.sadd(STREAMS_KEY, ["orders"])  # streams made by 0.1.0: an upgrade
    state = await Features(fresh, initial_level=MAX_FEATURE_LEVEL).load()
    assert (state.level, state.written) == (1, 1)
    await fresh.hset(FEATURES_KEY, {"level": "9"})  # finalized by a newer release
    with pytest.raises(UnsupportedFeatureLevel, match=r"finalized at feature level 9"):
        await Features(fresh).load()


async def test_level_1_writes_what_0_1_0_wrote_level_2_the_versioned_journal(fresh_url: str) -> None:
    settings = attrs.evolve(FAST, redis_url=fresh_url, admin_password="s3cret", initial_feature_level=1)
    checker = redis_py.Redis.from_url(fresh_url, decode_responses=True)
    snapshot_key, journal_key = GROUP.snapshot_key, GROUP.journal_key
    async with serve_on(settings) as client:
        await client.post("/v1/heartbeat", json=hb("orders", "a", 2))
        assert checker.hget(snapshot_key, "schemaVersion") == "1"
        assert {frozenset(fields) for _, fields in checker.xrange(journal_key)} == {
            frozenset({"kind", "rev", "data"})  # exactly what 0.1.0 writes
        }
        raised = await client.put("/v1/admin/features", json={"level": 2}, auth=AUTH)
        assert raised.status_code == 200, raised.text
        await client.post("/v1/heartbeat", json=hb("orders", "b", 2))
        # Raised to 2: appends name each event's version and the snapshot says schema 2.
        assert checker.hget(snapshot_key, "schemaVersion") == "2"
        assert checker.xrange(journal_key)[-1][1]["v"] == "1"
        assert checker.hget(FEATURES_KEY, "written") == "2"
        # Level 2 data exists: no way back to 1 (a 0.1.0 coordinator refuses schema 2).
        lowered = await client.put("/v1/admin/features", json={"level": 1}, auth=AUTH)
        assert (lowered.status_code, lowered.json()["error"]) == (409, "FEATURE_LEVEL_IN_USE")
    checker.close()
    # Old and new entries read back side by side; verify says what it saw.
    async with open_redis(fresh_url) as client_redis:
        store = RedisStore(client_redis)
        loaded = await store.load(GROUP)
        assert loaded.schema == 2
        assert {e.version for e in loaded.events} <= {1}
        verdict = await verify(store, GROUP)
        assert verdict.ok, verdict.problems
        assert verdict.describe_versions().startswith("journal schema 2, event versions v1 x")
        with pytest.raises(FeatureLevelMoved, match="cannot go below"):
            await Features(client_redis).finalize(1, "test")


async def test_a_level_lowered_by_another_coordinator_is_honoured_before_the_first_write(
    fresh: Any,
) -> None:
    features = Features(fresh)
    # A new deployment: at the highest level, nothing above the baseline written yet.
    assert (await features.load()).level == MAX_FEATURE_LEVEL
    await fresh.hset(FEATURES_KEY, {"level": "1"})  # lowered elsewhere; this one has not seen it
    assert await features.schema_for_write() == 1
    assert (await fresh.hget(FEATURES_KEY, "written")) == "1"
    assert features.level == 1


async def test_a_schema_newer_than_this_release_reads_is_refused_with_its_level(fresh: Any) -> None:
    store = RedisStore(fresh, features=StaticFeatures(1))
    await store.append(GROUP, 0, [entry(JOINED)])
    await fresh.hset(GROUP.snapshot_key, {"schemaVersion": "3"})
    with pytest.raises(UnsupportedSchema, match=r"schemaVersion 3 .*reads schemas 1 to 2"):
        await store.load(GROUP)
    verdict = await verify(store, GROUP)
    assert not verdict.ok
    assert "schemaVersion 3" in verdict.problems[0]


def test_an_event_type_of_a_higher_level_is_never_written(monkeypatch: pytest.MonkeyPatch) -> None:
    check_writable(["MemberLeft", "StreamCreated"], 1)
    # as if MemberLeft belonged to level 2
    monkeypatch.setattr("rsc.actors.store.EVENT_LEVELS", {**EVENT_LEVELS, "MemberLeft": 2})
    with pytest.raises(NotFinalized, match="needs feature level 2"):
        check_writable(["MemberLeft"], 1)
    check_writable(["MemberLeft"], 2)
    with pytest.raises(NotFinalized, match="belongs to no feature level"):
        check_writable(["SomethingNew"], MAX_FEATURE_LEVEL)


async def test_an_actor_refuses_to_persist_what_the_level_does_not_allow(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: Any
) -> None:
    monkeypatch.setattr("rsc.actors.store.EVENT_LEVELS", {**EVENT_LEVELS, "MemberJoined": 2})
    store = MemoryStore(level=1)
    async with registry_on(store, MemoryEffects()) as registry:
        with pytest.raises(NotFinalized, match="MemberJoined needs feature level 2"):
            await Member(registry, "orders", "billing", "a").heartbeat()
    assert not any(e.kind == "MemberJoined" for a in store.aggregates.values() for e in a.entries)


# --- the wire: negotiation on the server ---------------------------------------------


@pytest.fixture
async def client(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url)) as http:
        yield http


NEW_CLIENT = ClientInfo("rsc-python", rsc.__version__, MAX_FEATURE_LEVEL)


def hb(prefix: str, member: str, version: int, **extra: Any) -> dict[str, Any]:
    request = HeartbeatRequest(version, prefix, "billing", member, "i", 0, client=NEW_CLIENT)
    return codec.wire.unstructure(request) | extra


async def test_each_protocol_version_is_answered_in_its_own_shape(
    client: httpx.AsyncClient, prefix: str
) -> None:
    v1 = (await client.post("/v1/heartbeat", json=hb(prefix, "a", 1))).json()
    assert "protocolVersion" not in v1
    assert "featureLevel" not in v1
    assert "revokeTimeoutMs" not in v1
    v2 = (await client.post("/v1/heartbeat", json=hb(prefix, "b", 2))).json()
    assert v2["protocolVersion"] == 2
    assert v2["revokeTimeoutMs"] == 20_000  # the group's (tests/httpkit.py sets it)
    assert 1 <= v2["featureLevel"] <= MAX_FEATURE_LEVEL
    newer = (await client.post("/v1/heartbeat", json=hb(prefix, "c", 7))).json()
    assert newer["protocolVersion"] == 2  # the client steps down to it
    batch = [hb(prefix, "d", 1), hb(prefix, "e", 2), hb(prefix, "f", 0)]
    items = (await client.post("/v1/heartbeats", json={"heartbeats": batch})).json()["responses"]
    assert "protocolVersion" not in items[0]
    assert "revokeTimeoutMs" not in items[0]
    assert items[1]["protocolVersion"] == 2
    assert items[1]["revokeTimeoutMs"] == 20_000
    assert items[2]["error"] == "UNSUPPORTED_PROTOCOL_VERSION"
    assert items[2]["status"] == 400
    producer = codec.wire.unstructure(ProducerHeartbeatRequest(1, prefix, "p"))
    assert "protocolVersion" not in (await client.post("/v1/producers/heartbeat", json=producer)).json()
    producer["protocolVersion"] = 2
    assert (await client.post("/v1/producers/heartbeat", json=producer)).json()["protocolVersion"] == 2


async def test_unknown_fields_are_ignored_by_the_server_and_the_client(
    client: httpx.AsyncClient, prefix: str
) -> None:
    extra = {"fromTheFuture": {"x": 1}, "client": {"name": "n", "version": "9", "somethingNew": True}}
    response = await client.post("/v1/heartbeat", json=hb(prefix, "a", 2, **extra))
    assert response.status_code == 200, response.text
    answer = response.json() | {"aFieldOfProtocol9": [1, 2]}
    answer["assignment"]["alsoNew"] = 1
    parsed = codec.converter.structure(answer, HeartbeatResponse)
    assert parsed.status is HeartbeatStatus.OK


async def test_views_show_each_clients_version_and_feature_level(
    client: httpx.AsyncClient, prefix: str
) -> None:
    old = {"name": "rsc-python", "version": "0.1.0"}  # as 0.1.0 sends it: no featureLevel
    await client.post("/v1/heartbeat", json=hb(prefix, "old", 1, client=old))
    await client.post(
        "/v1/heartbeat", json=hb(prefix, "new", 2, client={**old, "version": "0.2.0", "featureLevel": 2})
    )
    group = (await client.get(f"/v1/streams/{prefix}/groups/billing")).json()
    clients = {m["memberId"]: m["client"] for m in group["members"]}
    assert clients["old"] == {**old, "featureLevel": 1}
    assert clients["new"] == {**old, "version": "0.2.0", "featureLevel": 2}


# --- the wire: the client steps down --------------------------------------------------


def _old_server(seen: list[int], slow: bool = False) -> httpx.MockTransport:
    """The HTTP interface of a coordinator that speaks protocol version 1 only (as 0.1.0 does)."""

    def refusal() -> httpx.Response:
        error = {"error": "UNSUPPORTED_PROTOCOL_VERSION", "message": "protocolVersion 2 is not in [1, 1]"}
        return httpx.Response(400, json=error)

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        response = HeartbeatResponse(HeartbeatStatus.OK, 1, 1, 1, 1000, 10_000, 1, ShardAssignment(), 1)
        return codec.wire.unstructure(response)

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/v1/heartbeats":
            out = []
            for item in body["heartbeats"]:
                seen.append(item["protocolVersion"])
                out.append(refusal().json() if item["protocolVersion"] != 1 else answer(item))
            return httpx.Response(200, json={"responses": out})
        seen.append(body["protocolVersion"])
        if body["protocolVersion"] != 1:
            return refusal()
        if request.url.path == "/v1/producers/heartbeat":
            return httpx.Response(
                200,
                json={
                    "status": "OK",
                    "producerId": body["producerId"],
                    "metadataVersion": 1,
                    "routing": "jump-v1",
                    "shardCount": 1,
                    "paused": False,
                    "heartbeatIntervalMs": 1000,
                    "leaseTtlMs": 10000,
                },
            )
        return httpx.Response(200, json=answer(body))

    if not slow:
        return httpx.MockTransport(handle)

    async def handle_later(request: httpx.Request) -> httpx.Response:
        await trio.sleep(0.01)  # requests sent together are in flight together
        return handle(request)

    return httpx.MockTransport(handle_later)


REQUEST = HeartbeatRequest(PROTOCOL_VERSION, "orders", "billing", "a", "i", 0)


async def test_a_client_facing_an_older_coordinator_steps_down() -> None:
    seen: list[int] = []
    async with Coordinator("http://old", transport=_old_server(seen)) as coordinator:
        assert (await coordinator.heartbeat(REQUEST)).status is HeartbeatStatus.OK
        assert seen == [2, 1]  # refused, then the same coordinator in version 1
        assert coordinator.negotiation.version == 1
        await coordinator.heartbeat(REQUEST)
        assert seen == [2, 1, 1]  # remembered
        coordinator.negotiation = Negotiation()
        both = await coordinator.heartbeats([REQUEST, REQUEST])
        assert [type(b) for b in both] == [HeartbeatResponse, HeartbeatResponse]
        assert seen[3:] == [2, 2, 1, 1]
    seen.clear()
    with SyncCoordinator("http://old", transport=_old_server(seen)) as sync:
        answer = sync.producer_heartbeat(ProducerHeartbeatRequest(PROTOCOL_VERSION, "orders", "p"))
        assert answer.status is HeartbeatStatus.OK
        assert seen == [2, 1]


async def test_requests_in_flight_when_the_client_steps_down_are_sent_again() -> None:
    """A worker's members share one client: several requests go out in version 2 at once, the
    first refusal steps down, and the others, refused too, are sent again in version 1."""
    seen: list[int] = []
    answers: list[Any] = []
    async with Coordinator("http://old", transport=_old_server(seen, slow=True)) as coordinator:

        async def beat() -> None:
            answers.append(await coordinator.heartbeat(REQUEST))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(beat)
    assert [a.status for a in answers] == [HeartbeatStatus.OK] * 5
    assert seen.count(1) == 5
    assert seen.count(2) > 1, seen  # they were in flight together (else this proves nothing)
    assert coordinator.negotiation.version == 1


async def test_a_bad_version_of_the_callers_own_does_not_step_the_client_down() -> None:
    seen: list[int] = []
    async with Coordinator("http://old", transport=_old_server(seen)) as coordinator:
        with pytest.raises(CoordinatorRejected):
            await coordinator.heartbeat(attrs.evolve(REQUEST, protocol_version=0))
        assert coordinator.negotiation.version == PROTOCOL_VERSION


def test_negotiation_follows_the_answer_and_tries_the_newest_again_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr("rsc.client.coordinator.time.monotonic", lambda: clock[0])
    negotiation = Negotiation(retry_newest_s=300)
    body = {"protocolVersion": PROTOCOL_VERSION}
    assert negotiation.stamp(body) == body
    negotiation.answered({"protocolVersion": 1})  # a newer server answering in 1: speak 1
    assert negotiation.stamp(body) == {"protocolVersion": 1}
    clock[0] += 301
    assert negotiation.stamp(body) == body  # upgraded meanwhile? try again
    assert negotiation.stamp({"noVersion": 1}) == {"noVersion": 1}


# --- finalizing a level through the Admin API ------------------------------------------------


@pytest.fixture
async def level_1(fresh_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = attrs.evolve(FAST, redis_url=fresh_url, admin_password="s3cret", initial_feature_level=1)
    async with serve_on(settings) as http:
        yield http


async def test_raising_the_level_waits_for_every_member_and_producer_then_is_audited(
    level_1: httpx.AsyncClient, prefix: str, fresh_url: str
) -> None:
    client = level_1
    status = (await client.get("/v1/admin/features", auth=AUTH)).json()
    assert (status["level"], status["written"], status["supported"]) == (1, 1, [1, MAX_FEATURE_LEVEL])
    [coordinator] = status["parties"]
    assert (coordinator["kind"], coordinator["version"], coordinator["featureLevel"]) == (
        "coordinator",
        rsc.__version__,
        MAX_FEATURE_LEVEL,
    )
    old = {"name": "rsc-python", "version": "0.1.0"}
    joined = (await client.post("/v1/heartbeat", json=hb(prefix, "old-one", 1, client=old))).json()
    producer = codec.wire.unstructure(ProducerHeartbeatRequest(1, prefix, "old-producer")) | {"client": old}
    await client.post("/v1/producers/heartbeat", json=producer)

    refused = await client.put("/v1/admin/features", json={"level": 2}, auth=AUTH)
    assert refused.status_code == 409
    assert refused.json()["error"] == "FEATURE_LEVEL_NOT_SUPPORTED"
    assert {b["name"] for b in refused.json()["details"]["blockers"]} == {
        f"{prefix}/billing/old-one",
        f"{prefix}/old-producer",
    }
    assert "old-one" in refused.json()["message"]

    leave = hb(prefix, "old-one", 1, client=old) | {"memberEpoch": -1}
    assert joined["memberEpoch"] >= 1
    await client.post("/v1/heartbeat", json=leave)
    await client.post("/v1/producers/heartbeat", json=producer | {"leave": True})
    raised = await client.put("/v1/admin/features", json={"level": 2}, auth=AUTH)
    assert raised.status_code == 200, raised.text
    assert (raised.json()["level"], raised.json()["previous"]) == (2, 1)
    assert (await client.get("/v1/version")).json()["features"]["finalized"] == 2
    heartbeat = (await client.post("/v1/heartbeat", json=hb(prefix, "new-one", 2))).json()
    assert heartbeat["featureLevel"] == 2
    # Level 2 data is written now: no way back to 1.
    lowered = await client.put("/v1/admin/features", json={"level": 1}, auth=AUTH)
    assert (lowered.status_code, lowered.json()["error"]) == (409, "FEATURE_LEVEL_IN_USE")
    unknown = await client.put("/v1/admin/features", json={"level": MAX_FEATURE_LEVEL + 1}, auth=AUTH)
    assert (unknown.status_code, unknown.json()["error"]) == (400, "UNSUPPORTED_FEATURE_LEVEL")
    for bad in ({"level": "2"}, {"level": 0}, {}, [2]):
        response = await client.put("/v1/admin/features", json=bad, auth=AUTH)
        assert (response.status_code, response.json()["error"]) == (400, "INVALID_REQUEST"), bad
    assert (await client.put("/v1/admin/features", json={"level": 2})).status_code == 401
    records = (
        await client.get("/v1/admin/audit", params={"pathPrefix": "/v1/admin/features"}, auth=AUTH)
    ).json()
    puts = [r for r in records["records"] if r["method"] == "PUT"]
    assert len(puts) >= 8
    assert {r["outcome"] for r in puts} >= {"ok", "rejected"}
    checker = redis_py.Redis.from_url(fresh_url, decode_responses=True)
    assert checker.hget(FEATURES_KEY, "changedBy") == "admin"
    assert checker.hlen(COORDINATORS_KEY) == 1
    checker.close()


async def test_lowering_is_allowed_while_nothing_of_the_higher_level_was_written(fresh_url: str) -> None:
    settings = attrs.evolve(FAST, redis_url=fresh_url, admin_password="s3cret")
    async with serve_on(settings) as client:  # a new deployment: the highest level, nothing written yet
        status = (await client.get("/v1/admin/features", auth=AUTH)).json()
        assert (status["level"], status["written"]) == (MAX_FEATURE_LEVEL, 1)
        lowered = await client.put("/v1/admin/features", json={"level": 1}, auth=AUTH)
        assert lowered.status_code == 200, lowered.text
        assert lowered.json()["level"] == 1
        # At level 1 the coordinator writes schema 1: a 0.1.0 coordinator can still take over.
        await client.post("/v1/heartbeat", json=hb("lowered", "a", 2))
    checker = redis_py.Redis.from_url(fresh_url, decode_responses=True)
    snapshot = AggregateId("lowered", "billing").snapshot_key
    assert checker.hget(snapshot, "schemaVersion") == "1"
    assert checker.hget(FEATURES_KEY, "written") == "1"
    assert checker.hlen(COORDINATORS_KEY) == 0  # unregistered on the way out
    checker.close()


async def test_data_of_a_newer_event_version_marks_its_level_written(fresh: Any) -> None:
    """A level-8 target (`TargetAssignmentUpdated` version 2, `advances`) written marks level 8
    written, in Redis and in memory: the level can no longer be lowered below it, where an
    N-1 coordinator would misread the journal (review finding: only event types counted)."""
    target = (
        "TargetAssignmentUpdated",
        codec.to_json(events.TargetAssignmentUpdated(1, {}, 0, True), events.GroupEvent),
    )
    for store in (RedisStore(fresh), MemoryStore()):
        await store.append(GROUP, 0, [target])
        state = await store.features.current()
        assert state.written == ADVANCE_LEVEL
        with pytest.raises(FeatureLevelMoved, match="cannot go below"):
            await store.features.finalize(ADVANCE_LEVEL - 1, "test")
    assert level_of_events(["TargetAssignmentUpdated"], ADVANCE_LEVEL - 1) == 1
    assert level_of_events(["TargetAssignmentUpdated", "GroupPaused"], ADVANCE_LEVEL - 1) == GROUP_OPS_LEVEL


def test_a_field_of_a_newer_event_version_is_never_written_below_its_level() -> None:
    """An event decided at level 8 (a target that moves quiet members, an advance naming the
    epoch heard) is refused at a lower level (a level lowered between decision and write)."""
    below = ADVANCE_LEVEL - 1
    check_levels([events.TargetAssignmentUpdated(1, {}, 0), events.MemberEpochAdvanced("a", 2)], below)
    for decided in (events.TargetAssignmentUpdated(1, {}, 0, True), events.MemberEpochAdvanced("a", 2, 1)):
        with pytest.raises(NotFinalized, match="needs feature level 8"):
            check_levels([decided], below)
        check_levels([decided], ADVANCE_LEVEL)
