"""A deliberately broken client for the conformance kit's own tests: the Python worker under
the contract, broken as `RSC_BROKEN` says.

* `after-lease`: no self-fencing (the member's safety margin far below zero, and shards it
  loses are not stopped): after a pause past its lease it goes on handling what it had queued;
* `ignore-revokes`: a revoke is never carried out (the shards are neither stopped nor
  acknowledged), so the coordinator fences it when the revoke timeout ends;
* `not-idempotent`: its producer publishes without idempotence (a retry after a lost reply
  appends again);
* `modulo-routing`: its producer routes a key by its hash modulo the ACTIVE shards, not jump-v1
  (P2);
* `ignore-seal`: its producer's appends name another seal key, so a shard's seal never refuses
  them (P3);
* `ignore-pause`: its producer never takes the stream's pause (P4);
* `reorder`: its worker handles each read batch of a shard last entry first (M10);
* `unreported-version`: its producer reports layout version 0 in every heartbeat instead of the
  one it routes with (P1): the coordinator then never answers it SYNC_METADATA.

The kit must fail it on the scenarios that check those rules (tests/conformance/test_kit.py).
"""

from __future__ import annotations

import os
from typing import Any

import trio

from rsc.client.member import MemberSettings
from rsc.client.poller.poller import Poller
from rsc.conformance import python_client

BROKEN = os.environ.get("RSC_BROKEN", "")

if BROKEN == "after-lease":
    python_client.app.member_settings = MemberSettings(safety_margin=-1000.0)

    async def keep(self: Poller, shards: frozenset[int]) -> None:
        return None  # a lost shard's queue is handled on

    Poller.lost = keep  # type: ignore[method-assign]
elif BROKEN == "ignore-revokes":

    async def never(self: Poller, shards: frozenset[int], within_s: float) -> None:
        await trio.sleep_forever()

    Poller.revoke = never  # type: ignore[method-assign]
elif BROKEN == "not-idempotent":
    from rsc.client.producer_state import ProducerState

    ProducerState.idempotent = property(lambda self: False, lambda self, value: None)  # type: ignore[assignment]
elif BROKEN == "unreported-version":
    import attrs

    from rsc.client.producer_state import ProducerState

    honest = ProducerState.request

    def unreported(self: ProducerState, *, leave: bool = False) -> Any:
        return attrs.evolve(honest(self, leave=leave), metadata_version=0)

    ProducerState.request = unreported  # type: ignore[method-assign]
elif BROKEN == "modulo-routing":
    from rsc.client.producer_state import ProducerState
    from rsc.events.routing import key_hash

    def modulo(self: ProducerState, key: Any) -> str:
        active = self.router.active
        raw = key.encode() if isinstance(key, str) else key
        return active[key_hash(raw) % len(active)].key

    ProducerState.shard_key = modulo  # type: ignore[method-assign]
elif BROKEN == "ignore-seal":
    from rsc.client import append_calls

    append_calls.seal_key = lambda key: f"{key}:rsc:v1:not-the-seal"  # type: ignore[attr-defined]
elif BROKEN == "ignore-pause":
    from rsc.client.producer_state import ProducerState

    ProducerState.paused = property(lambda self: False, lambda self, value: None)  # type: ignore[assignment]
elif BROKEN == "reorder":
    from rsc.client.poller.state import PollerState

    queue_in_order = PollerState.enqueue

    def reversed_batches(self: PollerState, shard: Any, messages: Any) -> None:
        before = len(shard.home.queue)
        queue_in_order(self, shard, messages)
        tail = list(shard.home.queue)[before:]
        for _ in tail:
            shard.home.queue.pop()
        shard.home.queue.extend(reversed(tail))

    PollerState.enqueue = reversed_batches  # type: ignore[method-assign]
else:
    raise SystemExit(f"RSC_BROKEN={BROKEN!r}: see the module's doc for the names")

if __name__ == "__main__":
    python_client.main()
