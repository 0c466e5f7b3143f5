"""The App `bench/latency.py` runs with `rsc worker`: the handler records publish -> handler latency.

Each message carries `ts` (the publisher's `time.monotonic()`, the same clock in every process
of the machine) and `phase`; the handler keeps `phase latency_ms` in memory and writes the
lines to `RSC_BENCH_OUT` when the worker exits (SIGTERM: `rsc worker` leaves gracefully).
"""

from __future__ import annotations

import atexit
import os
import time

from rsc.client.poller import Message
from rsc.client.worker import App

app = App()
OUT = os.environ["RSC_BENCH_OUT"]
records: list[tuple[str, float]] = []


@app.listener(
    stream=os.environ["RSC_BENCH_STREAM"],
    group=os.environ["RSC_BENCH_GROUP"],
    concurrency=int(os.environ.get("RSC_BENCH_MEMBERS", "1")),
)
async def handle(message: Message) -> None:
    records.append((message.fields["phase"], (time.monotonic() - float(message.fields["ts"])) * 1000))


@atexit.register
def write() -> None:
    with open(OUT, "w") as out:
        out.writelines(f"{phase} {ms:.4f}\n" for phase, ms in records)
