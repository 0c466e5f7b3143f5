"""Redis key names of key layout v1 (documented in docs/persistence.md).

Every control-plane key of one aggregate shares one hash tag, so the journal,
the snapshot and the checkpoint index live in one slot and one Lua script can
change them atomically on a cluster. Names use `/` between parts because
stream and group names cannot contain it.
"""

from __future__ import annotations

import attrs

from rsc.events.wire import owner_key

#: The key layout: every control-plane key starts `rsc:v1:`. The journal's schema is versioned
#: on its own (`rsc.events.versions`, per aggregate in its snapshot hash).
KEY_LAYOUT = 1
PREFIX = f"rsc:v{KEY_LAYOUT}"
#: The set of every stream prefix the coordinator has created.
STREAMS_KEY = f"{PREFIX}:streams"
#: The coordinator lease (JSON holder, token, url; expires) and the counter its tokens come
#: from. One hash tag, so that one script changes both on a cluster.
COORDINATOR_LEASE_KEY = f"{PREFIX}:{{coordinator}}:lease"
COORDINATOR_TOKEN_KEY = f"{PREFIX}:{{coordinator}}:token"


@attrs.frozen
class AggregateId:
    """A stream aggregate (`group` is None) or a group aggregate."""

    stream_prefix: str
    group: str | None = None

    @property
    def tag(self) -> str:
        if self.group is None:
            return f"s/{self.stream_prefix}"
        return f"g/{self.stream_prefix}/{self.group}"

    @property
    def snapshot_key(self) -> str:
        return f"{PREFIX}:{{{self.tag}}}:snapshot"

    @property
    def journal_key(self) -> str:
        return f"{PREFIX}:{{{self.tag}}}:journal"

    @property
    def checkpoints_key(self) -> str:
        return f"{PREFIX}:{{{self.tag}}}:checkpoints"

    def __str__(self) -> str:
        return self.tag


# The owner-token key is part of the wire contract (clients' ack scripts use it).
__all__ = [
    "COORDINATOR_LEASE_KEY",
    "COORDINATOR_TOKEN_KEY",
    "PREFIX",
    "KEY_LAYOUT",
    "STREAMS_KEY",
    "AggregateId",
    "owner_key",
]
