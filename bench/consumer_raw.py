"""The hand-written baseline: coredis XREADGROUP COUNT 100 round robin over the shard keys, batched XACK."""

from __future__ import annotations

import sys

import trio

sys.path.insert(0, __file__.rsplit("/", 2)[0])

from rsc.connect import open_redis


async def main(url: str, group: str, keys: list[str], total: int) -> None:
    done = 0
    async with open_redis(url) as redis:
        for key in keys:
            await redis.xgroup_create(key, group, "0")
        while done < total:
            for key in keys:
                reply = await redis.xreadgroup(group, "raw", streams={key: ">"}, count=100)
                if not reply:
                    continue
                ids = [entry.identifier for entry in reply[key]]
                await redis.xack(key, group, ids)
                done += len(ids)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[4:], int(sys.argv[3]))
