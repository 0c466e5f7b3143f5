"""The Python snippets of docs/producers.md and docs/consumers.md, run as a user runs them (a
real process, the URLs from the environment) against a real coordinator and Redis: they use
the stable surface (`from rsc import ...`) and they work."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import attrs
import httpx
import pytest
import redis as redis_py
import trio

from tests import redis_servers
from tests.httpkit import FAST, serve_on

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def blocks(page: str) -> list[str]:
    return BLOCK.findall((ROOT / "docs" / page).read_text())


@pytest.fixture
def private_url() -> Iterator[str]:
    """A Redis of this test alone: the snippets use the stream name `orders`."""
    with redis_servers.standalone() as url:
        yield url


@pytest.fixture
async def http(private_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(FAST, redis_url=private_url)) as client:
        yield client


async def run(http: httpx.AsyncClient, redis_url: str, code: str, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code)
    env = {**os.environ, "RSC_COORDINATOR_URL": str(http.base_url), "RSC_REDIS_URL": redis_url}
    done = await trio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
        )
    )
    assert done.returncode == 0, done.stderr


async def test_the_producer_snippets_run_on_the_stable_surface(
    http: httpx.AsyncClient, private_url: str, tmp_path: Path
) -> None:
    trio_snippet = next(b for b in blocks("producers.md") if b.startswith("# publish.py"))
    sync_snippet = next(b for b in blocks("producers.md") if "connect_sync_producer" in b)
    for snippet in (trio_snippet, sync_snippet):
        assert "from rsc import" in snippet
        assert "rsc.client" not in snippet
        await run(http, private_url, snippet, tmp_path)
    keys = [s["key"] for s in (await http.get("/v1/streams/orders/routing")).json()["shards"]]
    with redis_py.Redis.from_url(private_url) as r:
        assert sum(r.xlen(k) for k in keys) == 1 + 1_000 + 1 + 1 + 100  # both snippets' messages


def test_the_listener_snippet_uses_the_stable_surface() -> None:
    listener = next(b for b in blocks("consumers.md") if b.startswith("# billing.py"))
    assert "from rsc import App, Message" in listener
    assert "rsc.client" not in listener
    compiled = compile(listener, "billing.py", "exec")  # (it runs under `rsc worker`, tested elsewhere)
    assert compiled is not None
