"""Deleting the Redis consumers that departed members leave behind, on a timer.

Each member reads under its member id as consumer name, so every restart under a new id (a new
pod IP, a new pid) would leave names behind on every shard it read.

Imports `rsc.events` and the actor modules below the registry; it is given the registry's
running actors as a function (no import back).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import trio

from rsc.actors.actor import Actor
from rsc.actors.effects.port import Effects
from rsc.actors.errors import ROUND_FAILURES, log_round_failure
from rsc.events.group import GroupState

log = logging.getLogger("rsc.registry")


async def prune_consumers(
    running: Callable[[], Sequence[Actor[Any, Any, Any]]],
    effects: Effects,
    every_s: float,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Delete the Redis consumers that members which left or were fenced leave behind, forever.

    Every `every_s` (0: never), for each of the `running` group actors, each readable shard's
    consumers that are not live members and have nothing pending are deleted in one script; one
    with entries pending stays until the shard's new owner has claimed them (its reclaimer).
    Only running actors are looked at: an idle group has nobody new to prune after. Raises
    nothing: a failed pruning is logged and tried again next round."""
    task_status.started()
    if every_s <= 0:
        return
    while True:
        await trio.sleep(every_s)
        for actor in running():
            state = actor.state
            if not isinstance(state, GroupState) or state.deleted:
                continue
            aggregate_id = actor.aggregate.aggregate_id
            keys = [s.key for s in state.layout.shards if s.readable]
            try:
                gone = await effects.prune_consumers(keys, state.group, state.members)
            except ROUND_FAILURES as exc:
                log_round_failure(log, f"pruning consumers of {aggregate_id}", exc)
                continue
            if gone:
                log.info("pruned %d departed consumer(s) of %s", gone, aggregate_id)
