"""FastStream's Redis stream subscriber on the same keys: one group consumer per shard key, no-op handler.

Runs in its own virtualenv (FastStream is installed only for the benchmark).
"""

from __future__ import annotations

import asyncio
import sys

from faststream.redis import RedisBroker, StreamSub


async def main(url: str, group: str, keys: list[str]) -> None:
    broker = RedisBroker(url)
    for key in keys:

        @broker.subscriber(stream=StreamSub(key, group=group, consumer="fs", last_id="0", max_records=100))
        async def handle(body: object) -> None:
            return None

    async with broker:
        await broker.start()
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
