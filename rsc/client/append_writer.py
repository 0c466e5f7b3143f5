"""The trio producer's append scripts, written on its own lean connection to a standalone Redis.

Why not coredis for this one command: coredis checks and packs every argument in Python (a
batch of 1,000 messages is about 4,000 arguments: 7 us a message, measured in
docs/performance.md), and its connection queues a whole pipeline before writing it. Here
hiredis packs each shard's `SEALED_APPEND` call in C and it is written as soon as it is packed,
so Redis runs the first shard's scripts while the next is packed; hiredis parses the replies.
coredis keeps everything else (layout heartbeats are HTTP; the script load, every other
command), and the whole publish on a cluster, behind Sentinel, over a Unix socket, with a
credential provider, or when hiredis is missing: `AppendWriter.for_client` answers None and the
producer pipelines through coredis as before. Same script, same replies, same errors.

A connection (`rsc.resp.Connection`) is opened as coredis opens it, from the client's own
settings. A connection that failed in any way is closed, never reused half read. Failures
leave as the coredis exceptions the rest of the client maps (`rsc.client.redis_calls.redis_call`):
`ConnectionError` or `TimeoutError` when Redis could not answer, the coredis class of a refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import trio

from rsc.resp import Connection, Endpoint, pack, refusal

__all__ = ["AppendWriter", "Endpoint"]


class AppendWriter:
    """Sends batches of packed commands, each batch on one connection of its own pool."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._idle: list[Connection] = []
        #: Whether a call's connection is kept for the next (between `keep` and `aclose`);
        #: otherwise it is closed when the call ends, so nothing is left open to leak.
        self._keeping = False

    @classmethod
    def for_client(cls, client: Any) -> AppendWriter | None:
        """A writer to the Redis `client` talks to, or None where it does not apply (see the
        module doc): the caller then sends through `client`."""
        endpoint = Endpoint.of(client)
        return None if endpoint is None else cls(endpoint)

    async def call(
        self, commands: Iterable[Callable[[], tuple[str | bytes | int | float, ...]]]
    ) -> list[Any]:
        """Run the commands the callables of `commands` build, in order: one reply each, in
        order (an error reply as its exception).

        Each command is built, packed and written before the next is built. An error reply
        comes as the coredis exception for its code. Raises
        `coredis.exceptions.ConnectionError` when Redis cannot be reached or stops answering (the
        connection is then closed), and
        `coredis.exceptions.ResponseError` when it refuses the connection's handshake."""
        connection = self._idle.pop() if self._idle else await Connection.open(self.endpoint)
        try:
            sent = 0
            for command in commands:
                await connection.send(pack([command()]))
                sent += 1
            replies = [refusal(r) for r in await connection.replies(sent, self.endpoint.command_timeout)]
        except BaseException:
            await trio.aclose_forcefully(connection.stream)
            raise
        if self._keeping:
            self._idle.append(connection)
        else:
            await trio.aclose_forcefully(connection.stream)
        return replies

    def keep(self) -> None:
        """Keep connections open between calls, until `aclose` (the owner must call it)."""
        self._keeping = True

    async def aclose(self) -> None:
        """Close the idle connections and stop keeping them (a call in flight closes its own
        when it ends); a call after this one still works, on a connection of its own closed
        when it ends. Closes even in a cancelled scope."""
        self._keeping = False
        idle, self._idle = self._idle, []
        for connection in idle:
            await trio.aclose_forcefully(connection.stream)
