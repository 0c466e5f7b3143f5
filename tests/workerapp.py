"""The App the worker-process tests run with `rsc worker tests.workerapp:app`.

It records every handled entry in a Redis list (`RSC_TEST_RESULTS`) as
"<shard key> <entry id> <pid>" so the test can check nothing was lost; or, with
`RSC_TEST_RESULTS_FILE`, as lines of that file (for tests that take Redis down), where
`RSC_TEST_RECORD_ORDER=1` adds the entry's `bkey` and `seq` fields (per-key order checks:
lines are appended when a handler finishes, so the file is the order of completion).
"""

from __future__ import annotations

import os

import trio

from rsc.client.member import MemberSettings
from rsc.client.poller import Message, PollerSettings
from rsc.client.worker import App
from rsc.sync_connect import sync_redis

# RSC_TEST_NO_SELF_FENCE=1 switches self-fencing off, to show the owner token alone stopping a late member.
SELF_FENCE = os.environ.get("RSC_TEST_NO_SELF_FENCE") != "1"
app = App(
    member_settings=MemberSettings(
        heartbeat_interval_ms=200, lease_ttl_ms=2_000, safety_margin=0.2 if SELF_FENCE else -1000.0
    )
)
results = sync_redis(os.environ.get("RSC_REDIS_URL", "redis://127.0.0.1:6379"), decode_responses=True)
KEY = os.environ.get("RSC_TEST_RESULTS", "rsc-test:results")
RESULTS_FILE = os.environ.get("RSC_TEST_RESULTS_FILE")
DELAY = float(os.environ.get("RSC_TEST_DELAY", "0.002"))
RECORD_ORDER = os.environ.get("RSC_TEST_RECORD_ORDER") == "1"


@app.listener(
    stream=os.environ.get("RSC_TEST_STREAM", "orders"),
    group="billing",
    concurrency=int(os.environ.get("RSC_TEST_CONCURRENCY", "1")),
    poller=PollerSettings(retry_after_ms=500, reclaim_every_s=0.5),
)
async def handle(message: Message) -> None:
    await trio.sleep(DELAY)
    if message.fields.get("poison") == "1":  # fails every time: retried, then dead-lettered
        raise ValueError("a poison entry")
    line = f"{message.key} {message.id} {os.getpid()}"
    if RECORD_ORDER:
        line += f" {message.fields.get('bkey', '-')} {message.fields.get('seq', '-')}"
    if RESULTS_FILE:
        fd = os.open(RESULTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{line}\n".encode())
        finally:
            os.close(fd)
    else:
        await trio.to_thread.run_sync(results.rpush, KEY, line)
