"""The Python worker under the conformance contract (docs/clients.md): `python -m
rsc.conformance.python_client` runs `rsc worker rsc.conformance.python_client:app` with its
settings taken from the contract's variables, and writes a JSON line on stdout when each
handler call starts and ends. Handlers in flight follow the group's `maxConcurrency` (the
coordinator's answer), so RSC_CONCURRENCY is not read.

RSC_MEMBER_ID becomes the worker's instance id (its member ids start with it), and the
worker is static exactly when RSC_STATIC=1 (an instance id alone would make it static).

With RSC_ROLE=producer it publishes instead (the contract's producer role): RSC_PUBLISH_COUNT
messages in calls of RSC_PUBLISH_BATCH through the synchronous producer, one "ack" (or
"fail") line per message, then exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time

import trio

from rsc.client.poller import Message, PollerSettings
from rsc.client.worker import App

app = App()
_HANDLER_S = int(os.environ.get("RSC_HANDLER_MS", "0")) / 1000


def record_line(event: str, message: Message) -> bytes:
    """The contract's JSON line for one handler event (docs/clients.md), with its newline; the
    chaos suite's worker writes the same records (tests/chaos/chaosapp.py)."""
    line = {
        "ev": event,
        "pid": os.getpid(),
        "member": message.member_id,
        "shard": message.shard,
        "key": message.key,
        "id": message.id,
        "t": time.clock_gettime(time.CLOCK_MONOTONIC),
        "mid": message.fields.get("mid"),
        "bkey": message.fields.get("bkey"),
        "seq": message.fields.get("seq"),
        "deliveries": message.deliveries,
    }
    return (json.dumps(line, separators=(",", ":")) + "\n").encode()


def record(event: str, message: Message) -> None:
    """One JSON line on stdout, written with one system call."""
    os.write(1, record_line(event, message))


@app.listener(
    stream=os.environ.get("RSC_STREAM", "conformance"),
    group=os.environ.get("RSC_GROUP", "conformance"),
    name="conformance",
    poller=PollerSettings(retry_after_ms=500, reclaim_every_s=0.5),
)
async def handle(message: Message) -> None:
    record("start", message)
    try:
        await trio.sleep(_HANDLER_S)
    except BaseException:
        record("abort", message)
        raise
    record("end", message)


def produce() -> int:
    """The producer role: publish, one line per message, exit 0 (2 for a refused credential)."""
    from rsc.client.errors import CoordinatorRejected, RscError  # noqa: PLC0415
    from rsc.client.sync import SyncCoordinator, SyncProducer  # noqa: PLC0415
    from rsc.sync_connect import sync_redis  # noqa: PLC0415

    env = os.environ
    producer_id = env.get("RSC_PRODUCER_ID") or f"conformance-producer-{os.getpid()}"
    count, batch = int(env.get("RSC_PUBLISH_COUNT", "200")), int(env.get("RSC_PUBLISH_BATCH", "1"))
    interval_s = int(env.get("RSC_PUBLISH_INTERVAL_MS", "0")) / 1000
    coordinator = SyncCoordinator(
        env.get("RSC_COORDINATOR_URL", "http://127.0.0.1:8080"), token=env.get("RSC_TOKEN")
    )
    data = sync_redis(env.get("RSC_REDIS_URL", "redis://127.0.0.1:6379"))
    try:
        producer = SyncProducer(coordinator, data, env.get("RSC_STREAM", "conformance"), producer_id).start()
    except CoordinatorRejected as exc:
        print(f"the coordinator refused the credential: {exc}", file=sys.stderr)
        return 2
    with producer:
        for start in range(1, count + 1, batch):
            numbers = range(start, min(start + batch, count + 1))
            messages = [
                ({"mid": f"{producer_id}-{n}", "bkey": f"k{n % 16}", "seq": str(n)}, f"k{n % 16}")
                for n in numbers
            ]
            try:
                ids: list[str | None] = list(producer.publish_many(messages))
                event = "ack"
            except RscError as exc:
                print(f"publish failed: {exc}", file=sys.stderr)
                ids, event = [None] * len(messages), "fail"
            t = time.clock_gettime(time.CLOCK_MONOTONIC)
            lines = [
                json.dumps({"ev": event, "mid": fields["mid"], "id": entry, "t": t}, separators=(",", ":"))
                + "\n"
                for (fields, _), entry in zip(messages, ids, strict=True)
            ]
            os.write(1, "".join(lines).encode())
            if interval_s:
                time.sleep(interval_s)
    return 0


def main() -> None:
    """Run the worker CLI on this module's app, the contract's variables mapped to its own (or,
    with RSC_ROLE=producer, the producer role)."""
    if os.environ.get("RSC_ROLE") == "producer":
        sys.exit(produce())
    from rsc.cli import main as cli  # noqa: PLC0415  (the CLI imports this module's app)

    os.environ["RSC_INSTANCE_ID"] = os.environ.get("RSC_MEMBER_ID") or f"conformance-{os.getpid()}"
    os.environ["RSC_STATIC"] = "1" if os.environ.get("RSC_STATIC") == "1" else "0"
    level = os.environ.get("RSC_LOG_LEVEL", "warning")
    sys.argv = ["rsc", "worker", "rsc.conformance.python_client:app", "--log-level", level]
    cli()


if __name__ == "__main__":
    main()
