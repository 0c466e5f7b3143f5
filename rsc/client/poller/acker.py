"""The acker: acknowledges handled entries through the fenced `ack` script, one call per bundle."""

from __future__ import annotations

import contextlib

import trio

from rsc.client.errors import Fenced, RedisCommandFailed, RedisUnavailable
from rsc.client.poller.scripts import MemberScripts
from rsc.client.poller.settings import ACK_CHUNK, REFUSAL_RETRY_S
from rsc.client.poller.state import PollerState, Shard, together

__all__ = ["Acker"]


class Acker:
    """Acknowledges what was handled every `ack_every_s`, and sleeps while nothing was."""

    def __init__(self, state: PollerState, scripts: MemberScripts) -> None:
        self.state = state
        self.scripts = scripts

    async def run(self) -> None:
        state = self.state
        while True:
            if not any(shard.home.acks for shard in state.book):
                await state.acks_waiting.wait()
                state.acks_waiting = trio.Event()
            await trio.sleep(state.settings.ack_every_s)
            now = trio.current_time()
            bundles: dict[int, list[Shard]] = {}
            for shard in state.book:
                home = shard.home
                if home.acks and not home.ack_lock.locked() and now >= home.ack_retry_at:
                    bundles.setdefault(shard.bundle, []).append(shard)
            await together([(self.flush, bundle) for bundle in bundles.values()])

    async def flush(self, shards: list[Shard]) -> bool:
        """Acknowledge what these shards (of one bundle) handled, the call in flight first; False
        when Redis did not take it all (what it did not take is kept and sent again)."""
        state = self.state
        async with contextlib.AsyncExitStack() as locks:
            for shard in shards:
                await locks.enter_async_context(shard.home.ack_lock)
            taken = True
            shards = list(shards)
            while True:
                for shard in shards:
                    shard.home.acking.clear()  # the call in flight before this one has ended
                chunk: list[tuple[Shard, list[str]]] = []
                room = ACK_CHUNK
                for shard in shards:
                    home = shard.home
                    if home.acks and room > 0:
                        ids, home.acks = home.acks[:room], home.acks[room:]
                        chunk.append((shard, ids))
                        room -= len(ids)
                if not chunk:
                    break
                for shard, ids in chunk:
                    shard.home.acking.update(ids)
                try:
                    replies = await self.scripts.ack(chunk)
                except (RedisUnavailable, RedisCommandFailed) as exc:
                    delay = state.health.wait_after(exc)
                    for shard, ids in chunk:
                        shard.home.acks[:0] = ids  # XACK is idempotent: sent again once Redis answers
                        shard.home.ack_retry_at = trio.current_time() + delay
                    return False
                except BaseException:
                    for shard, ids in chunk:
                        shard.home.acks[:0] = ids  # cancelled mid-call: not lost
                    raise
                for (shard, ids), reply in zip(chunk, replies, strict=True):
                    if isinstance(reply, int):
                        continue
                    shards.remove(shard)
                    shard.home.acks[:0] = ids
                    taken = False
                    if isinstance(reply, Fenced):
                        # Kept: acknowledged once the coordinator writes our token again, or
                        # dropped with the shard when the member is told it is not ours; tried
                        # again no sooner than a refusal's retry meanwhile.
                        state.fenced(shard, reply)
                        shard.home.ack_retry_at = trio.current_time() + REFUSAL_RETRY_S
                    else:
                        shard.home.ack_retry_at = trio.current_time() + state.health.wait_after(reply)
            if taken:
                state.health.ok()
            return taken
