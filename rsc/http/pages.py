"""Pages for people: the live dashboard at `/ui` and the API reference (Swagger UI) at `/docs`.

Both are static: `/ui` is one HTML file with plain JavaScript that polls the JSON views every
second (`/v1/streams...`), `/docs` is Swagger UI (the `swagger-ui-bundle` package's files)
over `/openapi.json`. Nothing is built at run time and nothing is fetched from elsewhere.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import swagger_ui_bundle  # the static files of Swagger UI, vendored by that package
from quart import Response
from quart_trio import QuartTrio

from rsc.http.errors import ApiError

UI = Path(__file__).with_name("ui.html")
DOCS = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rsc API</title>
<link rel="stylesheet" href="/docs/static/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="/docs/static/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({url: "/docs/openapi.json", dom_id: "#swagger-ui", deepLinking: true});
</script>
</body></html>
"""
#: The Swagger UI files served, by name (nothing else under that directory is reachable).
_TYPES = {
    ".css": "text/css",
    ".js": "application/javascript",
    ".png": "image/png",
    ".map": "application/json",
}


@functools.cache
def _swagger_files() -> dict[str, Path]:
    root = Path(swagger_ui_bundle.swagger_ui_path)
    return {p.name: p for p in root.iterdir() if p.suffix in _TYPES}


def add_page_routes(app: QuartTrio, document: Callable[[], dict[str, Any]]) -> None:
    """`/` (to `/ui`), `/ui`, `/docs` and Swagger UI's files; `document`: the OpenAPI one."""

    @app.get("/")
    async def home() -> Response:
        return Response("", status=302, headers={"Location": "/ui"})

    @app.get("/ui")
    async def dashboard() -> Response:
        return Response(UI.read_bytes(), content_type="text/html; charset=utf-8")

    @app.get("/docs")
    async def docs() -> Response:
        return Response(DOCS, content_type="text/html; charset=utf-8")

    @app.get("/docs/openapi.json")
    async def docs_document() -> Response:
        # The Swagger UI vendored here (4.x) reads OpenAPI 3.0 only; the document is 3.1 and
        # uses nothing 3.0 lacks but `type: null` in nullable fields, which it shows as it is.
        labelled = {**document(), "openapi": "3.0.3"}
        return Response(json.dumps(labelled, separators=(",", ":")), content_type="application/json")

    @app.get("/docs/static/<name>")
    async def docs_static(name: str) -> Response:
        found = _swagger_files().get(name)
        if found is None:
            raise ApiError(404, "NOT_FOUND", f"no file {name!r}")
        response = Response(found.read_bytes(), content_type=_TYPES[found.suffix])
        response.headers["Cache-Control"] = "public, max-age=86400"
        return response
