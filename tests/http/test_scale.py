"""`GET /v1/streams/{p}/groups/{g}/scale` against real Redis: its figures are the sums a test
computes from Redis, capped as specified; the KEDA examples in examples/k8s parse and ask the
endpoint (with the monitor credential of their TriggerAuthentication) or metrics that exist."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import httpx
import pytest
import yaml

from rsc.events.auth import credential
from tests.httpkit import FAST, serve_on

ROOT = Path(__file__).resolve().parents[2]
AUTH = ("admin", "pw")
MONITOR = "keda-monitor-token-0123"


@pytest.fixture
async def http(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    credentials = (credential("keda", ["monitor"], token=MONITOR),)
    settings = attrs.evolve(
        FAST, redis_url=standalone_url, admin_password="pw", credentials=credentials, protect_views=True
    )
    async with serve_on(settings) as client:
        yield client


async def test_the_figures_are_redis_sums_capped_at_the_shards(
    http: httpx.AsyncClient, prefix: str, sync_redis: Any
) -> None:
    monitor = {"Authorization": f"Bearer {MONITOR}"}
    assert (await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 4}, auth=AUTH)).is_success
    assert (
        await http.put(f"/v1/admin/streams/{prefix}/groups/g", json={"startFrom": "earliest"}, auth=AUTH)
    ).is_success
    routing = (await http.get(f"/v1/streams/{prefix}/routing", headers=monitor)).json()
    keys = [s["key"] for s in routing["shards"]]
    for n, key in enumerate(keys[:3]):  # three busy shards, one idle
        for i in range(5 + n):
            sync_redis.xadd(key, {"i": str(i)})
    sync_redis.xreadgroup("g", "m", {keys[0]: ">"}, count=2)  # two pending on the first
    path = f"/v1/streams/{prefix}/groups/g/scale"
    assert (await http.get(path)).status_code == 401  # protected views: a monitor credential
    found = (await http.get(path, params={"membersPerReplica": 2}, headers=monitor)).json()
    lag = sum(g["lag"] for k in keys for g in sync_redis.xinfo_groups(k) if g["name"] == "g")
    pending = sum(g["pending"] for k in keys for g in sync_redis.xinfo_groups(k) if g["name"] == "g")
    assert (found["lag"], found["pending"]) == (lag, pending) == (5 + 6 + 7 - 2, 2)
    assert (found["shards"], found["members"], found["desiredMembers"], found["desiredReplicas"]) == (
        4,
        0,
        3,
        2,
    )
    for key in keys:  # everything everywhere: still never more members than shards
        for i in range(3):
            sync_redis.xadd(key, {"i": str(i)})
    assert (await http.get(path, headers=monitor)).json()["desiredMembers"] == 4
    paused = await http.post(f"/v1/admin/streams/{prefix}/groups/g/pause", auth=AUTH)
    assert paused.status_code == 200
    assert (await http.get(path, headers=monitor)).json()["desiredMembers"] == 0  # no more than it has
    bad = await http.get(path, params={"membersPerReplica": 0}, headers=monitor)
    assert bad.status_code == 400
    assert (await http.get(f"/v1/streams/{prefix}/groups/nope/scale", headers=monitor)).status_code == 404


async def test_the_keda_examples_parse_and_ask_what_exists(
    http: httpx.AsyncClient, prefix: str, sync_redis: Any
) -> None:
    documents = [
        d
        for f in sorted((ROOT / "examples" / "k8s").glob("keda-*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
    ]
    kinds = [d["kind"] for d in documents]
    assert kinds.count("ScaledObject") == 2
    assert "TriggerAuthentication" in kinds
    auth = next(d for d in documents if d["kind"] == "TriggerAuthentication")
    triggers = [t for d in documents if d["kind"] == "ScaledObject" for t in d["spec"]["triggers"]]
    metrics_api = next(t for t in triggers if t["type"] == "metrics-api")
    assert metrics_api["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert metrics_api["metadata"]["authMode"] == "bearer"
    assert [p["parameter"] for p in auth["spec"]["secretTargetRef"]] == ["token"]
    # ask what KEDA would ask, on a stream and group of this test's
    assert (await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)).is_success
    assert (await http.put(f"/v1/admin/streams/{prefix}/groups/billing", json={}, auth=AUTH)).is_success
    url = urlsplit(metrics_api["metadata"]["url"])
    path = url.path.replace("/orders/", f"/{prefix}/")
    answer = await http.get(f"{path}?{url.query}", headers={"Authorization": f"Bearer {MONITOR}"})
    assert answer.status_code == 200, answer.text
    assert metrics_api["metadata"]["valueLocation"] in answer.json()
    prometheus = next(t for t in triggers if t["type"] == "prometheus")
    exported = (await http.get("/metrics", auth=AUTH)).text
    for metric in ("rsc_group_lag", "rsc_group_pending"):
        assert metric in prometheus["metadata"]["query"]
        assert f"# TYPE {metric} gauge" in exported
