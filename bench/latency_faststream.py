"""FastStream's Redis stream subscriber for bench/latency.py: one group consumer per shard key.

Runs in its own virtualenv (bench/.faststream-venv). The handler records publish -> handler
latency (`ts` is the publisher's `time.monotonic()`) and writes `phase latency_ms` lines to
OUT on SIGTERM.

    python latency_faststream.py REDIS_URL GROUP OUT KEY...
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from typing import Any

from faststream.redis import RedisBroker, StreamSub


async def main(url: str, group: str, out: str, keys: list[str]) -> None:
    records: list[tuple[str, float]] = []
    broker = RedisBroker(url)
    for key in keys:

        @broker.subscriber(stream=StreamSub(key, group=group, consumer="fs"))
        async def handle(body: Any) -> None:
            fields = body if isinstance(body, dict) else {}
            records.append((str(fields["phase"]), (time.monotonic() - float(fields["ts"])) * 1000))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with broker:
        await broker.start()
        await stop.wait()
    with open(out, "w") as file:
        file.writelines(f"{phase} {ms:.4f}\n" for phase, ms in records)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))
