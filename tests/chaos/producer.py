"""A producer process for the chaos suite: `python -m tests.chaos.producer --out FILE ...`.

It publishes through rsc's synchronous producer (`SyncProducer`, redis-py) to
`--keys` business keys in turn, each message carrying its key (`bkey`), a
per-key sequence number (`seq`) and a unique id (`mid`), at `--rate`
messages a second. Each publish appends one JSON line to `--out` (O_APPEND,
one `os.write`): "ack" with the entry id once Redis acknowledged it, or
"fail" when it raised (during a Redis outage); it keeps going either way.
SIGUSR1 asks for a burst (`--burst` messages per key in one pipeline), so
that the harness can fill the workers' queues just before a fault; SIGUSR2
switches between `--rate` and `--fast-rate` (a rebalance under load). SIGTERM
stops it cleanly (flush, leave); it exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from rsc.client.sync import SyncCoordinator, SyncProducer
from rsc.sync_connect import sync_redis


class Journal:
    """The producer's record file: one JSON line per publish, one write each."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, **record: Any) -> None:
        record["t"] = time.clock_gettime(time.CLOCK_MONOTONIC)
        os.write(self.fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--name", required=True, help="producer id, also the prefix of its business keys")
    parser.add_argument("--out", required=True)
    parser.add_argument("--keys", type=int, default=8)
    parser.add_argument("--rate", type=float, default=15.0, help="messages per second")
    parser.add_argument("--fast-rate", type=float, default=60.0, help="messages per second after SIGUSR2")
    parser.add_argument("--burst", type=int, default=3, help="messages per key on SIGUSR1")
    args = parser.parse_args(argv)

    # Signal handlers only flip flags (they run between bytecodes of the main thread: taking a
    # lock there could deadlock).
    flags = {"stop": False, "burst": False, "fast": False}

    def flip(name: str, value: bool | None = None) -> Callable[..., None]:
        return lambda *_: flags.__setitem__(name, not flags[name] if value is None else value)

    signal.signal(signal.SIGTERM, flip("stop", True))
    signal.signal(signal.SIGINT, flip("stop", True))
    signal.signal(signal.SIGUSR1, flip("burst", True))
    signal.signal(signal.SIGUSR2, flip("fast"))

    journal = Journal(args.out)
    keys = [f"{args.name}:k{i}" for i in range(args.keys)]
    seqs = dict.fromkeys(keys, 0)
    client = sync_redis(args.redis, socket_timeout=2, socket_connect_timeout=2)

    def message(key: str) -> tuple[dict[str, str], str]:
        seqs[key] += 1
        seq = seqs[key]
        return {"bkey": key, "seq": str(seq), "mid": f"{key}/{seq}", "producer": args.name}, key

    def publish(messages: list[tuple[dict[str, str], str]]) -> None:
        started = time.clock_gettime(time.CLOCK_MONOTONIC)  # (a fault judges by when a call began)
        try:
            routes = [producer.shard_key(key) for _, key in messages]  # advisory: the layout may change
            ids = producer.publish_many(messages)
        except Exception as exc:  # PublishFailed during an outage, or anything else: keep going
            for fields, _ in messages:
                journal.write(
                    ev="fail",
                    bkey=fields["bkey"],
                    seq=int(fields["seq"]),
                    mid=fields["mid"],
                    error=f"{type(exc).__name__}: {exc}"[:300],
                )
            return
        for (fields, _), entry_id, route in zip(messages, ids, routes, strict=True):
            journal.write(
                ev="ack",
                t0=started,
                id=entry_id,
                key=route,
                bkey=fields["bkey"],
                seq=int(fields["seq"]),
                mid=fields["mid"],
            )

    with SyncCoordinator(args.coordinator, timeout_s=2.0) as coordinator:
        producer = SyncProducer(coordinator, client, args.stream, args.name, start_timeout_s=30.0)
        with producer:
            print(f"producer {args.name}: publishing", flush=True)
            next_at = time.monotonic()
            n = 0
            while not flags["stop"]:
                if flags["burst"]:
                    flags["burst"] = False
                    publish([message(key) for key in keys for _ in range(args.burst)])
                publish([message(keys[n % len(keys)])])
                n += 1
                period = 1.0 / (args.fast_rate if flags["fast"] else args.rate)
                next_at = max(next_at + period, time.monotonic() - 1.0)  # no catch-up storm
                time.sleep(max(0.0, next_at - time.monotonic()))
        print(f"producer {args.name}: stopped after {n} messages", flush=True)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
