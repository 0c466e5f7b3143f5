"""Owner tokens: which member incarnation owns each shard for each consumer group.

Keys: `<shard key>:rsc:v1:owners` (`rsc.actors.keys.owner_key`, in the shard key's slot), a
hash of consumer group -> token JSON (`rsc.events.wire.OwnerToken`), and the fence field
`OWNER_FENCE_FIELD`: the highest coordinator token that wrote the hash. Every write goes
through a script that refuses a writer whose token is below it (`FENCED`), so a deposed
coordinator that resumes mid-write cannot overwrite the tokens its successor wrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from rsc.actors.effects.pipelines import CoordinatorScript, RedisEffectsBase
from rsc.actors.keys import owner_key
from rsc.actors.store_connection import ScriptCall
from rsc.events import codec
from rsc.events.wire import OwnerToken

#: The field of an owner-token hash that keeps the highest coordinator token that wrote it
#: (not a group name: those start with a letter or digit). The scripts are given it (ARGV[1]).
OWNER_FENCE_FIELD = "__fence"


class OwnerTokens(Protocol):
    """The owner tokens of a group's shards.

    Every write raises `TermFenced` outside an active term or when a newer term wrote the
    hash (its fence above our token); every call raises `StoreUnavailable` when Redis does
    not answer (and coredis' `ResponseError` when Redis refuses a command)."""

    async def set_owners(self, group: str, tokens: Mapping[str, OwnerToken]) -> None:
        """Write `tokens` (shard key -> token) for `group`."""
        ...

    async def clear_owners(self, group: str, tokens: Mapping[str, OwnerToken]) -> None:
        """Remove each token of `group` if it still names the given member incarnation."""
        ...

    async def owners(self, group: str, shard_keys: Iterable[str]) -> dict[str, OwnerToken]:
        """The tokens of `group` that exist on `shard_keys`."""
        ...

    async def sync_owners(
        self, group: str, shard_keys: Iterable[str], tokens: Mapping[str, OwnerToken]
    ) -> None:
        """Make the tokens of `group` on `shard_keys` exactly `tokens`."""
        ...


def token_text(token: OwnerToken) -> str:
    """The token as the owner-token hash holds it (JSON)."""
    return codec.to_json(token)


class RedisOwnerTokens(RedisEffectsBase):
    """`OwnerTokens` on Redis: one fenced script per shard key, pipelined per node."""

    _set_owner = CoordinatorScript("set_owner")
    _delete_owner = CoordinatorScript("delete_owner")
    _clear_owner = CoordinatorScript("clear_owner")

    async def set_owners(self, group: str, tokens: Mapping[str, OwnerToken]) -> None:
        """See `OwnerTokens.set_owners`."""
        fence = self._token_arg()
        await self._scripts(
            [
                (self._set_owner, [owner_key(key)], [OWNER_FENCE_FIELD, fence, group, token_text(token)])
                for key, token in tokens.items()
            ]
        )

    async def clear_owners(self, group: str, tokens: Mapping[str, OwnerToken]) -> None:
        """See `OwnerTokens.clear_owners`."""
        fence = self._token_arg()
        await self._scripts(
            [
                (
                    self._clear_owner,
                    [owner_key(key)],
                    [OWNER_FENCE_FIELD, fence, group, t.member_id, t.incarnation],
                )
                for key, t in tokens.items()
            ]
        )

    async def owners(self, group: str, shard_keys: Iterable[str]) -> dict[str, OwnerToken]:
        """See `OwnerTokens.owners` (read in a term only: `TermFenced` outside one)."""
        keys = list(shard_keys)
        async with self._pipeline() as pipe:
            requests = [pipe.hget(owner_key(key), group) for key in keys]
        texts = [await request for request in requests]
        return {k: codec.from_json(t, OwnerToken) for k, t in zip(keys, texts, strict=True) if t is not None}

    async def sync_owners(
        self, group: str, shard_keys: Iterable[str], tokens: Mapping[str, OwnerToken]
    ) -> None:
        """See `OwnerTokens.sync_owners`."""
        fence = self._token_arg()
        calls: list[ScriptCall] = []
        for key in sorted(set(shard_keys) | set(tokens)):
            if key in tokens:
                args = [OWNER_FENCE_FIELD, fence, group, token_text(tokens[key])]
                calls.append((self._set_owner, [owner_key(key)], args))
            else:
                calls.append((self._delete_owner, [owner_key(key)], [OWNER_FENCE_FIELD, fence, group]))
        await self._scripts(calls)
