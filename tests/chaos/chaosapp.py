"""The App the chaos suite runs with `rsc worker tests.chaos.chaosapp:app`.

Every handler call is recorded in this process's JSON-lines file
(`RSC_CHAOS_RECORDS`): a "start" record before the handler's work and an
"end" record after it, or an "abort" record if it was cancelled. Each record
is one `os.write` on a descriptor opened with O_APPEND, so a kill -9 loses at
most the record being written. Times are `CLOCK_MONOTONIC`, comparable across
the processes of one Linux host. Between start and end the handler sleeps a
random delay (`RSC_CHAOS_DELAY_MS`, "min,max"), so a handler is usually in
flight when a fault hits.

While the file `block-<pid>` exists in `RSC_CHAOS_CONTROL`, the next handler
call of this process on an entry with the field `block=1`, after its delay,
blocks the whole event loop (as a long GC pause or CPU-bound work would) until
the file is removed, then returns normally; a "block" record marks when it
began. (The suite writes such an entry at the head of a batch of its shard,
so that entries of that shard are queued behind the blocked call.)
"""

from __future__ import annotations

import os
import random
import time

import trio

from rsc.client.member import MemberSettings
from rsc.client.poller import Message, PollerSettings
from rsc.client.worker import App
from rsc.conformance.python_client import record_line

RECORDS = os.environ.get("RSC_CHAOS_RECORDS", f"chaos-records-{os.getpid()}.jsonl")
_low, _, _high = os.environ.get("RSC_CHAOS_DELAY_MS", "30,100").partition(",")
DELAY_S = (int(_low) / 1000, int(_high or _low) / 1000)
_fd = os.open(RECORDS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
CONTROL = os.environ.get("RSC_CHAOS_CONTROL")

app = App(member_settings=MemberSettings(heartbeat_interval_ms=200, lease_ttl_ms=2_000))


def record(event: str, message: Message) -> None:
    """One JSON line (the conformance contract's record), written with one system call."""
    os.write(_fd, record_line(event, message))


@app.listener(
    stream=os.environ.get("RSC_CHAOS_STREAM", "chaos"),
    group=os.environ.get("RSC_CHAOS_GROUP", "billing"),
    concurrency=int(os.environ.get("RSC_CHAOS_CONCURRENCY", "2")),
    name="chaos",
    poller=PollerSettings(retry_after_ms=500, reclaim_every_s=0.5),
)
async def handle(message: Message) -> None:
    record("start", message)
    try:
        await trio.sleep(random.uniform(*DELAY_S))
    except BaseException:  # cancelled (the shard was lost, or the worker stops): the call ends here
        record("abort", message)
        raise
    block = os.path.join(CONTROL, f"block-{os.getpid()}") if CONTROL else None
    if block is not None and message.fields.get("block") == "1" and os.path.exists(block):
        record("block", message)
        while os.path.exists(block):
            time.sleep(0.005)  # blocks the event loop: no heartbeat, no other task, until removed
    record("end", message)  # (no checkpoint after a block: the call returns normally)
