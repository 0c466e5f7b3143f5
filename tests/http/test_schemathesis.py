"""A bounded schemathesis run against `rsc serve` (a real process) from its own OpenAPI document.

Every operation of `/openapi.json` gets generated requests (valid and
invalid); the server must never answer 5xx, and its answers must match the
documented status codes, content types and schemas.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from rsc.http.openapi import document

schema = schemathesis.openapi.from_dict(document())
ADMIN = "Basic " + base64.b64encode(b"admin:s3cret").decode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(standalone_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`rsc serve` as a child process on a free port, stopped with SIGTERM afterwards.

    Its log goes to a file (a pipe nobody reads would fill and block the server).
    """
    port = _free_port()
    env = {
        **os.environ,
        "RSC_REDIS_URL": standalone_url,
        "RSC_ADMIN_PASSWORD": "s3cret",
        "RSC_ADMIN_AUTH_MAX_FAILURES": "1000000",  # its negative cases send wrong credentials by design
        # It checks shapes, not limits: its cases come faster than any caller's rate limit.
        "RSC_RATE_LIMIT_ADMIN_WRITES_PER_S": "0",
        "RSC_RATE_LIMIT_VIEWS_PER_S": "0",
        "RSC_HEARTBEAT_INTERVAL_MS": "100",
        "RSC_MEMBER_LEASE_TTL_MS": "10000",
    }
    command = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    log = log_path.open("wb")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "rsc serve did not start"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
    text = log_path.read_text()
    assert process.returncode == 0, text
    assert "Traceback" not in text, text


@schema.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_the_api_holds_to_its_document(case: schemathesis.Case, server: str) -> None:
    # A list's `cursor` is opaque: only the `nextCursor` the server gave is one, so any other
    # string, schema-valid as it is, is rightly refused (400 INVALID_CURSOR, tests/http/test_paging.py).
    # A reset's `to.ids` names shards by index: one the stream does not have (it depends on what
    # earlier cases created) is rightly refused (400, tests/clients/test_group_operations_end_to_end.py).
    names_shards = (
        isinstance(case.body, dict) and isinstance(case.body.get("to"), dict) and "ids" in case.body["to"]
    )
    excluded = [positive_data_acceptance] if "cursor" in (case.query or {}) or names_shards else []
    case.call_and_validate(base_url=server, headers={"Authorization": ADMIN}, excluded_checks=excluded)
