"""The worker of the compose example: log each order it handles."""

import logging

from rsc import App, Message

app = App()
log = logging.getLogger("orders")


@app.listener(stream="orders", group="billing", concurrency=2)
async def handle(message: Message) -> None:
    log.info("order %s from shard %s: %s", message.id, message.shard, dict(message.fields))
