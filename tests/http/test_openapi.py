"""/openapi.json documents every route, and real responses validate against it."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import jsonschema
import pytest

from rsc.actors.deployment import Deployment
from rsc.http.admin import add_admin_routes
from rsc.http.app import create_app
from rsc.http.authenticate import AdminAccount
from rsc.http.openapi import add_openapi_route, document
from tests.actorkit import registry_on
from tests.httpkit import FAST, beat, hb, serve_on

AUTH = ("admin", "pw")


@pytest.fixture
async def client(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url, admin_password="pw")) as http:
        yield http


async def test_every_route_is_documented_and_nothing_else() -> None:
    async with registry_on() as registry:
        app = create_app(Deployment(registry))
        add_admin_routes(app, Deployment(registry), AdminAccount("admin", "pw"), audit=None)  # type: ignore[arg-type]
        add_openapi_route(app)
    served = {
        (method.lower(), re.sub(r"<(?:\w+:)?(\w+)>", lambda m: "{" + _camel(m.group(1)) + "}", rule.rule))
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static"
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    }
    documented = {(method, path) for path, ops in document()["paths"].items() for method in ops}
    assert served == documented


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def validate(doc: dict[str, Any], path: str, method: str, status: str, body: Any) -> None:
    content = doc["paths"][path][method]["responses"][status]["content"]["application/json"]
    jsonschema.validate(body, {**content["schema"], "components": doc["components"]})


async def test_real_responses_validate(client: httpx.AsyncClient, prefix: str) -> None:
    doc = (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    s, a = "/v1/streams/{streamPrefix}", "/v1/admin/streams/{streamPrefix}"
    first = await beat(client, hb(prefix, "a", 0))
    validate(doc, "/v1/heartbeat", "post", "200", first)
    await beat(client, hb(prefix, "b", 0))
    batch = await client.post("/v1/heartbeats", json={"heartbeats": [hb(prefix, "a", 1), {"nope": 1}]})
    validate(doc, "/v1/heartbeats", "post", "200", batch.json())
    checks = [
        (f"/v1/streams/{prefix}/routing", f"{s}/routing"),
        ("/v1/streams", "/v1/streams"),
        (f"/v1/streams/{prefix}", s),
        (f"/v1/streams/{prefix}/groups/billing", f"{s}/groups/{{consumerGroup}}"),
        ("/v1/version", "/v1/version"),
        ("/healthz", "/healthz"),
        ("/readyz", "/readyz"),
    ]
    for url, path in checks:
        response = await client.get(url)
        assert response.status_code == 200, url
        validate(doc, path, "get", "200", response.json())
    put = await client.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 6}, auth=AUTH)
    validate(doc, a, "put", "200", put.json())
    group = await client.put(
        f"/v1/admin/streams/{prefix}/groups/billing", json={"maxConcurrency": 2}, auth=AUTH
    )
    validate(doc, f"{a}/groups/{{consumerGroup}}", "put", "200", group.json())
    records = await client.get("/v1/admin/audit", auth=AUTH)
    validate(doc, "/v1/admin/audit", "get", "200", records.json())
    refused = await client.post("/v1/heartbeat", json={"memberEpoch": "x"})
    assert refused.status_code == 400
    validate(doc, "/v1/heartbeat", "post", "4XX", refused.json())
