"""The App `bench/consumer.py` runs with `rsc worker`: one member, a no-op handler."""

from __future__ import annotations

import os

from rsc.client.poller import Message
from rsc.client.worker import App

app = App()


@app.listener(stream=os.environ["RSC_BENCH_STREAM"], group=os.environ["RSC_BENCH_GROUP"], concurrency=1)
async def handle(message: Message) -> None:
    return None
