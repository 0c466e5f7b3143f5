"""Redis key names of metadata schema v1 (documented in docs/persistence.md).

Every control-plane key of one aggregate shares one hash tag, so the journal,
the snapshot and the checkpoint index live in one slot and one Lua script can
change them atomically on a cluster. Names use `/` between parts because
stream and group names cannot contain it.
"""

from __future__ import annotations

import attrs

SCHEMA_VERSION = 1
PREFIX = f"rsc:v{SCHEMA_VERSION}"
#: The set of every stream prefix the coordinator has created.
STREAMS_KEY = f"{PREFIX}:streams"


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


def owner_key(shard_key: str) -> str:
    """The hash of owner tokens of one shard (field: group), in the shard key's slot."""
    return f"{shard_key}:{PREFIX}:owners"
