"""The `Effects` port: everything the actors and the HTTP layer ask of the data plane.

One protocol per concern, composed: a caller that needs one concern may take the narrower
protocol. `rsc.actors.effects.redis_effects.RedisEffects` implements it on Redis,
`rsc.actors.effects.memory_effects.MemoryEffects` in memory (actor tests).
"""

from __future__ import annotations

from typing import Protocol

from rsc.actors.effects.catalog import StreamCatalog
from rsc.actors.effects.dlq import DeadLetters
from rsc.actors.effects.inspection import Inspection
from rsc.actors.effects.owners import OwnerTokens
from rsc.actors.effects.positions import Positions
from rsc.actors.effects.shard_keys import ShardKeys
from rsc.actors.effects.trimming import Trimming


class Effects(StreamCatalog, ShardKeys, OwnerTokens, DeadLetters, Inspection, Trimming, Positions, Protocol):
    """The stream catalog, shard keys and consumer groups, owner tokens, dead letters,
    retention's trims, groups' positions, and what Redis says about them (each method's
    docstring says what it raises)."""
