"""`RedisEffects`: the `Effects` port on Redis through coredis, each concern's Redis half at once.

Given the coordinator's fence-token provider, it writes only while this process holds an
active term (`TermFenced` otherwise): see `rsc.actors.effects.pipelines`.
"""

from __future__ import annotations

from rsc.actors.effects.catalog import RedisStreamCatalog
from rsc.actors.effects.dlq import RedisDeadLetters
from rsc.actors.effects.inspection import RedisInspection
from rsc.actors.effects.owners import RedisOwnerTokens
from rsc.actors.effects.positions import RedisPositions
from rsc.actors.effects.shard_keys import RedisShardKeys
from rsc.actors.effects.trimming import RedisTrimming


class RedisEffects(
    RedisStreamCatalog,
    RedisShardKeys,
    RedisOwnerTokens,
    RedisDeadLetters,
    RedisInspection,
    RedisTrimming,
    RedisPositions,
):
    """`Effects` on Redis: `RedisEffects(redis, fence_token, keys)`; one call per shard key
    (each in its own slot), pipelined per node. Each concern's `__init__` registers its
    scripts (cooperatively, through `super()`)."""
