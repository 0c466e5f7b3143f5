"""Recorded traffic of the baseline release: what its clients send and its coordinator answers.

    python -m tests.compat.corpus_tool record    # once per baseline: writes tests/compat/corpus/

`record` starts the baseline's coordinator (`tests.compat.baseline`) on a private Redis and
sends a fixed conversation, as the baseline's clients speak it (protocol version 1): members
join, heartbeat, are told to revoke, acknowledge, batch, leave; a producer registers,
acknowledges a layout and leaves; requests it refuses. Each request body is computed from the
answers before it, and stored with its answer. `replay` sends the same bodies, in order, to
a coordinator of this release on a fresh Redis (`tests/compat/test_compat.py` checks the
answers against the recorded ones and parses them with the old client's wire types).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.compat.baseline import ROOT, build
from tests.redis_servers import free_port, standalone

CORPUS = Path(__file__).with_name("corpus")
Exchange = dict[str, Any]


@contextlib.contextmanager
def coordinator(python: str, root: Path, redis_url: str) -> Iterator[httpx.Client]:
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "RSC_REDIS_URL": redis_url}
    command = [python, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
                deadline = time.monotonic() + 30
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        if http.get("/readyz").status_code == 200:
                            break
                    if process.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        raise RuntimeError(f"the coordinator did not start: {log.read().decode()}")
                    time.sleep(0.05)
                yield http
        finally:
            process.terminate()
            process.wait(timeout=20)


def _send(http: httpx.Client, note: str, method: str, path: str, body: Any = None) -> Exchange:
    response = http.request(method, path, json=body)
    return {
        "note": note,
        "method": method,
        "path": path,
        "request": body,
        "status": response.status_code,
        "response": response.json(),
    }


def _beat(member: str, epoch: int, **extra: Any) -> dict[str, Any]:
    return {
        "protocolVersion": 1,
        "streamPrefix": "corpus",
        "consumerGroup": "billing",
        "memberId": member,
        "incarnation": f"{member}-1",
        "memberEpoch": epoch,
        "client": {"name": "rsc-python", "version": "0.1.0"},
    } | extra


def conversation(http: httpx.Client) -> list[Exchange]:
    """The fixed conversation, each request made from the answers before it."""
    out: list[Exchange] = []

    def send(note: str, method: str, path: str, body: Any = None) -> Any:
        out.append(_send(http, note, method, path, body))
        return out[-1]["response"]

    a = send("first member joins", "POST", "/v1/heartbeat", _beat("a", 0))
    a = send(
        "it owns what it was assigned",
        "POST",
        "/v1/heartbeat",
        _beat("a", a["memberEpoch"], ownedShards=a["assignment"]["assigned"]),
    )
    b = send("a second member joins", "POST", "/v1/heartbeat", _beat("b", 0))
    owned_a = a["assignment"]["assigned"]
    a = send(
        "the first is asked to revoke",
        "POST",
        "/v1/heartbeat",
        _beat("a", a["memberEpoch"], ownedShards=owned_a),
    )
    kept = sorted(set(owned_a) - set(a["assignment"]["revoke"]))
    revoked = a["assignment"]["revoke"]
    a = send(
        "it acknowledges the revoke",
        "POST",
        "/v1/heartbeat",
        _beat("a", a["memberEpoch"], ownedShards=kept, revokedShards=revoked),
    )
    batch = [
        _beat("a", a["memberEpoch"], ownedShards=a["assignment"]["assigned"]),
        _beat("b", b["memberEpoch"]),
        _beat("c", 0, protocolVersion=0),
    ]
    send("a batch, one item refused", "POST", "/v1/heartbeats", {"heartbeats": batch})
    send("a stale epoch is fenced", "POST", "/v1/heartbeat", _beat("b", 999))
    send("an invalid request", "POST", "/v1/heartbeat", _beat("d", -5))
    send("an unsupported protocol version", "POST", "/v1/heartbeat", _beat("d", 0, protocolVersion=0))
    producer = {
        "protocolVersion": 1,
        "streamPrefix": "corpus",
        "producerId": "api-1",
        "client": {"name": "rsc-python", "version": "0.1.0"},
    }
    p = send("a producer registers", "POST", "/v1/producers/heartbeat", producer)
    send(
        "it acknowledges the layout",
        "POST",
        "/v1/producers/heartbeat",
        producer | {"metadataVersion": p["metadataVersion"]},
    )
    send("routing metadata", "GET", "/v1/streams/corpus/routing")
    send(
        "the producer leaves",
        "POST",
        "/v1/producers/heartbeat",
        producer | {"metadataVersion": p["metadataVersion"], "leave": True},
    )
    send("a member leaves", "POST", "/v1/heartbeat", _beat("a", -1))
    return out


def replay(
    recorded: list[Exchange], redis_url: str | None = None, python: str = sys.executable, root: Path = ROOT
) -> list[Exchange]:
    """The same requests, in order, answered by a coordinator of `root` on a fresh Redis."""
    del redis_url  # always a fresh one: the conversation starts from nothing
    with standalone() as url, coordinator(python, root, url) as http:
        return [_send(http, e["note"], e["method"], e["path"], e["request"]) for e in recorded]


def record(run: Callable[[httpx.Client], list[Exchange]] = conversation) -> Path:
    baseline = build()
    with standalone() as url, coordinator(str(baseline.python), baseline.source, url) as http:
        exchanges = run(http)
    CORPUS.mkdir(exist_ok=True)
    path = CORPUS / f"{baseline.tag}-members-and-producers.json"
    path.write_text(json.dumps(exchanges, indent=1) + "\n")
    return path


if __name__ == "__main__":
    if sys.argv[1:] != ["record"]:
        sys.exit("usage: python -m tests.compat.corpus_tool record")
    print(record())
