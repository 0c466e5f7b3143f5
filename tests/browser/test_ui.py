"""The dashboard in a real browser: headless Chromium (Debian's package, driven by Playwright)
opens `/ui` on a real coordinator, shows who owns which shard, and follows a member joining
and another leaving within seconds. `/docs` renders Swagger UI over `/openapi.json`."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
from playwright.sync_api import sync_playwright

from rsc.actors.dataset import DATA_LOSS, ROLLBACK
from tests.httpkit import FAST, hb, serve_on

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on the PATH: `apt-get install chromium` (.ci/run installs it)"
)


def owners(page: Any, prefix: str) -> dict[int, str]:
    cells = page.eval_on_selector_all(
        f'table[data-stream="{prefix}"] tr[data-shard]',
        "rows => rows.map(r => [Number(r.dataset.shard), r.querySelector('td.owner').textContent])",
    )
    return {int(shard): owner for shard, owner in cells}


def every_stream_and_the_docs(page: Any, base: str, prefix: str) -> None:
    page.goto(f"{base}/ui?stream={prefix},{prefix}-typo")  # a name no stream has is said
    page.wait_for_selector("#unknown-streams", timeout=10_000)
    assert page.inner_text("#unknown-streams") == f"no stream named {prefix}-typo"
    page.wait_for_selector(f'div[data-stream-card="{prefix}"]', timeout=10_000)
    # its retention policy, in one line (a stream created at feature level 5: the default)
    assert page.inner_text(f'p[data-retention="{prefix}"]') == "retention: keep acknowledged"
    page.goto(f"{base}/ui")  # every stream, this one among them
    page.wait_for_selector(f'div[data-stream-card="{prefix}"]', timeout=20_000)
    page.goto(f"{base}/docs")
    page.wait_for_selector("text=rsc coordinator", timeout=10_000)
    assert page.locator(".opblock").count() > 20  # every route, from /openapi.json


@pytest.fixture
def no_data_loss() -> Iterator[None]:
    """What this process noticed Redis lose is forgotten before and after (it is global)."""
    DATA_LOSS.reset()
    yield
    DATA_LOSS.reset()


def data_loss_is_shown(page: Any, prefix: str, tmp_path: Path) -> None:
    """What Redis lost is said on the page (from /readyz), newest first; nothing before."""
    assert page.locator("#redis").is_hidden()
    trio.from_thread.run_sync(DATA_LOSS.noticed, ROLLBACK, f"test: an older copy of {prefix}")
    page.wait_for_selector('#data-loss [data-loss-kind="rollback"]', timeout=5_000)
    assert f"test: an older copy of {prefix}" in page.inner_text("#redis")
    page.screenshot(path=str(tmp_path / "ui-data-loss.png"), full_page=True)


@pytest.mark.timeout(120)
async def test_the_dashboard_shows_owners_and_follows_a_join_and_a_leave(
    standalone_url: str, prefix: str, tmp_path: Path, no_data_loss: None
) -> None:
    settings = attrs.evolve(FAST, redis_url=standalone_url, member_lease_ttl_ms=60_000)
    async with serve_on(settings) as http:
        base = str(http.base_url).rstrip("/")

        def in_the_browser() -> None:
            with httpx.Client(base_url=base, timeout=10) as client, sync_playwright() as playwright:

                def beat(member: str, epoch: int, **extra: Any) -> dict[str, Any]:
                    response = client.post("/v1/heartbeat", json=hb(prefix, member, epoch, **extra))
                    assert response.status_code == 200, response.text
                    answer: dict[str, Any] = response.json()
                    return answer

                a = beat("a", 0)
                a = beat("a", a["memberEpoch"], ownedShards=a["assignment"]["assigned"])
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                page = browser.new_page()
                page.goto(f"{base}/ui?stream={prefix}")  # the shared Redis holds many streams
                owner_of = f'table[data-stream="{prefix}"] tr[data-shard] td.owner'
                page.wait_for_selector(owner_of, timeout=10_000)
                assert owners(page, prefix) == dict.fromkeys(range(4), "a")

                b = beat("b", 0)  # b joins: a is asked to revoke two shards
                a = beat("a", a["memberEpoch"], ownedShards=[0, 1, 2, 3])
                moving = a["assignment"]["revoke"]
                assert len(moving) == 2
                page.wait_for_selector(f'table[data-stream="{prefix}"] td.owner.revoking', timeout=5_000)
                during = owners(page, prefix)  # the handoff, shard by shard: from whom, to whom
                assert {s: during[s] for s in moving} == dict.fromkeys(moving, "a → b"), during
                handing = f'div[data-stream-card="{prefix}"] tr[data-member="a"] td.handing'
                assert page.inner_text(handing) == ", ".join(map(str, sorted(moving)))
                page.screenshot(path=str(tmp_path / "ui-handoff.png"), full_page=True)
                kept = sorted(set(range(4)) - set(moving))
                a = beat("a", a["memberEpoch"], ownedShards=kept, revokedShards=moving)
                b = beat("b", b["memberEpoch"])
                assert sorted(b["assignment"]["assigned"]) == sorted(moving)
                expected = {s: ("b" if s in moving else "a") for s in range(4)}
                page.wait_for_function(
                    """([sel, want]) => [...document.querySelectorAll(sel)]
                        .map(c => c.textContent).join(",") === want""",
                    arg=[owner_of, ",".join(expected[s] for s in range(4))],
                    timeout=5_000,
                )
                assert owners(page, prefix) == expected
                page.screenshot(path=str(tmp_path / "ui-after-join.png"), full_page=True)

                beat("a", -1)  # a leaves: b takes everything
                b = beat("b", b["memberEpoch"], ownedShards=b["assignment"]["assigned"])
                b = beat("b", b["memberEpoch"], ownedShards=b["assignment"]["assigned"])
                assert sorted(b["assignment"]["assigned"]) == [0, 1, 2, 3]
                page.wait_for_function(
                    """([sel]) => [...document.querySelectorAll(sel)].every(c => c.textContent === "b")""",
                    arg=[owner_of],
                    timeout=5_000,
                )
                members = page.eval_on_selector_all(
                    f'div[data-stream-card="{prefix}"] table[data-members="billing"] tr[data-member]',
                    "rows => rows.map(r => r.dataset.member)",
                )
                assert members == ["b"]
                page.screenshot(path=str(tmp_path / "ui.png"), full_page=True)

                data_loss_is_shown(page, prefix, tmp_path)
                every_stream_and_the_docs(page, base, prefix)
                browser.close()

        await trio.to_thread.run_sync(in_the_browser)
    assert (tmp_path / "ui.png").stat().st_size > 10_000


@pytest.mark.timeout(120)
async def test_a_protected_dashboard_asks_for_a_credential_and_shows_the_audit_log(
    standalone_url: str, prefix: str, tmp_path: Path
) -> None:
    """With `protect_views`, the page says why it sees nothing and takes a credential; signed in
    as the admin it shows the streams and the recent admin changes (not reads)."""
    settings = attrs.evolve(FAST, redis_url=standalone_url, protect_views=True, admin_password="pw")
    async with serve_on(settings) as http:
        base = str(http.base_url).rstrip("/")
        created = await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=("admin", "pw"))
        assert created.status_code == 200

        def in_the_browser() -> None:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                page = browser.new_page()
                page.goto(f"{base}/ui?stream={prefix}")
                page.wait_for_selector("#signin:not([hidden])", timeout=10_000)
                assert "protect_views" in page.inner_text("#signin-why")
                assert "401" in page.inner_text("#error")
                assert "sign in as the admin" in page.inner_text("#audit")
                page.fill("#credential", "admin:wrong")
                page.click("#signin button[type=submit]")
                page.wait_for_selector("#signin:not([hidden])", timeout=5_000)
                assert "that credential was refused" in page.inner_text("#signin-why")
                page.fill("#credential", "admin:pw")
                page.click("#signin button[type=submit]")
                page.wait_for_selector(f'div[data-stream-card="{prefix}"]', timeout=10_000)
                assert page.inner_text("#error") == ""
                row = f'table[data-audit] tr[data-audit-path="/v1/admin/streams/{prefix}"]'
                page.wait_for_selector(row, timeout=15_000)
                assert "PUT" in page.inner_text(row)
                assert "GET /v1/admin/audit" not in page.inner_text("#audit")  # its own reads are not shown
                page.screenshot(path=str(tmp_path / "ui-protected.png"), full_page=True)
                browser.close()

        await trio.to_thread.run_sync(in_the_browser)
