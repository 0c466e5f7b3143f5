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


def check_namespace(namespace: str) -> str:
    """`namespace` as every key starts with it: "" (none), or ending in ":" (one is added).

    Raises ValueError for braces (a key's hash tag is what its cluster slot is computed
    from: a brace in the namespace would change it) and for whitespace.
    """
    if any(c in namespace for c in "{}") or any(c.isspace() for c in namespace):
        raise ValueError(f"key_prefix {namespace!r} may not contain braces or whitespace")
    return namespace if not namespace or namespace.endswith(":") else f"{namespace}:"


@attrs.frozen
class KeySpace:
    """Where rsc's keys are: every key starts with `namespace` ("" by default, e.g. "demo:").

    One Redis can hold several independent deployments (a demo beside production, one per
    test run), each seeing only its own streams, journals, lease, audit and shard keys.
    The shard keys a coordinator names carry it too (`shard_key`), and everything clients
    write derives from those (owner tokens, seals, dead letters).
    """

    namespace: str = attrs.field(default="", converter=check_namespace)

    @property
    def root(self) -> str:
        return f"{self.namespace}{PREFIX}"

    @property
    def streams(self) -> str:
        """The set of every stream prefix the coordinator has created."""
        return f"{self.root}:streams"

    @property
    def coordinator_lease(self) -> str:
        return f"{self.root}:{{coordinator}}:lease"

    @property
    def coordinator_token(self) -> str:
        return f"{self.root}:{{coordinator}}:token"

    @property
    def features(self) -> str:
        return f"{self.root}:{{coordinator}}:features"

    @property
    def coordinators(self) -> str:
        return f"{self.root}:{{coordinator}}:coordinators"

    @property
    def dataset(self) -> str:
        """The dataset marker (hash `id`, `seq`): gone or older means Redis lost data."""
        return f"{self.root}:{{coordinator}}:dataset"

    def created(self, owner: str) -> str:
        """The set of the streams `owner` (a credential, `anonymous`, `admin`) created that exist."""
        return f"{self.root}:{{coordinator}}:created:{owner}"

    @property
    def creators(self) -> str:
        """Hash: stream prefix -> who created it (to release its quota when it is deleted)."""
        return f"{self.root}:{{coordinator}}:creators"

    @property
    def audit(self) -> str:
        return f"{self.root}:audit"

    def snapshot(self, aggregate: AggregateId) -> str:
        return f"{self.root}:{{{aggregate.tag}}}:snapshot"

    def journal(self, aggregate: AggregateId) -> str:
        return f"{self.root}:{{{aggregate.tag}}}:journal"

    def checkpoints(self, aggregate: AggregateId) -> str:
        return f"{self.root}:{{{aggregate.tag}}}:checkpoints"


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

    # The keys in the default key space (tests and tools; the coordinator asks its `KeySpace`).
    @property
    def snapshot_key(self) -> str:
        return DEFAULT_KEYS.snapshot(self)

    @property
    def journal_key(self) -> str:
        return DEFAULT_KEYS.journal(self)

    @property
    def checkpoints_key(self) -> str:
        return DEFAULT_KEYS.checkpoints(self)

    def __str__(self) -> str:
        return self.tag


DEFAULT_KEYS = KeySpace()


# The owner-token key is part of the wire contract (clients' ack scripts use it).
__all__ = [
    "COORDINATOR_LEASE_KEY",
    "COORDINATOR_TOKEN_KEY",
    "DEFAULT_KEYS",
    "PREFIX",
    "KEY_LAYOUT",
    "STREAMS_KEY",
    "AggregateId",
    "KeySpace",
    "check_namespace",
    "owner_key",
]
