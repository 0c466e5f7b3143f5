"""Data-plane side effects the actors perform after persisting events.

Every operation is idempotent, so that a crash between a journal write and
its effect is repaired by running the effect again on recovery:

* shard keys exist (created empty, never touching an existing stream);
* each group's consumer group exists on each readable shard key;
* each shard's owner token for a group equals the member the shard is
  installed to, and is absent when no one holds it.

`RedisEffects` does this on Redis; `MemoryEffects` is the fake used by the
time-driven actor tests. Given the coordinator's fence-token provider,
`RedisEffects` writes only while this process holds an active term (it
raises `TermFenced` otherwise), so an actor of a deposed coordinator resumed
after a pause does not rewrite owner tokens after its deadline.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import attrs
import coredis
from coredis.tokens import PureToken

from rsc.actors.errors import StoreUnavailable, TermFenced
from rsc.actors.keys import DEFAULT_KEYS, KeySpace, owner_key
from rsc.actors.store_connection import RedisClient, redis_errors
from rsc.connect import error_code
from rsc.events import codec
from rsc.events.slots import Primary, Topology
from rsc.events.wire import OwnerToken, dead_letter_key, seal_key

# Create the stream key empty if it does not exist (XADD then trim to 0 keeps the key).
ENSURE_STREAM = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XADD', KEYS[1], 'MAXLEN', '0', '*', 'rsc', 'created')
end
return 1
"""

# Create a consumer group on a shard key unless it exists (never moves an existing one).
ENSURE_GROUP = """
local r = redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], ARGV[2], 'MKSTREAM')
if type(r) == 'table' and r.err then
  if string.sub(r.err, 1, 9) == 'BUSYGROUP' then return 0 end
  return redis.error_reply(r.err)
end
return 1
"""

# Destroy a consumer group on a shard key if both exist, and the group's owner token.
DESTROY_GROUP = """
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
return redis.call('XGROUP', 'DESTROY', KEYS[1], ARGV[1])
"""

#: The field of an owner-token hash that keeps the highest coordinator token that wrote it
#: (not a group name: those start with a letter or digit).
# The drain evidence of one shard, read on its own node in one script (KEYS: shard, seal):
# {sealed 0/1, the stream's last entry id ('' if the key does not exist or is empty),
#  per consumer group on the key {name, pending, entries after its last-delivered id (0/1)}}.
DRAIN_EVIDENCE = """
local sealed = redis.call('EXISTS', KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 0 then return {sealed, '', {}} end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local groups = {}
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  local after = redis.call('XRANGE', KEYS[1], '(' .. info['last-delivered-id'], '+', 'COUNT', 1)
  groups[#groups + 1] = {info['name'], info['pending'], #after}
end
return {sealed, last[1] and last[1][1] or '', groups}
"""

# Replay dead letters onto their shard (KEYS: shard, its dead-letter stream; same slot). ARGV:
# how many at most, then the dead-letter ids to take (none: the oldest). Each is appended to
# the shard again with its original fields (the rsc* bookkeeping fields dropped), then
# deleted from the dead-letter stream, atomically: none lost, none replayed twice.
REPLAY_DEAD_LETTERS = """
local entries
if #ARGV > 1 then
  entries = {}
  for i = 2, #ARGV do
    local found = redis.call('XRANGE', KEYS[2], ARGV[i], ARGV[i])
    if found[1] then entries[#entries + 1] = found[1] end
  end
else
  entries = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', tonumber(ARGV[1]))
end
local out = {}
for _, e in ipairs(entries) do
  local fields = {}
  for i = 1, #e[2], 2 do
    if string.sub(e[2][i], 1, 3) ~= 'rsc' then
      fields[#fields + 1] = e[2][i]
      fields[#fields + 1] = e[2][i + 1]
    end
  end
  if #fields == 0 then fields = {'rscEmpty', '1'} end
  local id = redis.call('XADD', KEYS[1], '*', unpack(fields))
  redis.call('XDEL', KEYS[2], e[1])
  out[#out + 1] = {e[1], id}
end
return out
"""

# Delete the consumers of a group on one shard that are not live members and have nothing
# pending (KEYS: shard; ARGV: group, then the live member ids). The pending count is read and
# the consumer deleted in one step, so a consumer that still has entries is never deleted
# (that would fake a clean PEL): the new owner claims them first, then it goes. How many went.
PRUNE_CONSUMERS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if not ok then return 0 end
local keep = {}
for i = 2, #ARGV do keep[ARGV[i]] = true end
local gone = 0
for _, c in ipairs(consumers) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if not keep[info['name']] and tonumber(info['pending']) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    gone = gone + 1
  end
end
return gone
"""

OWNER_FENCE_FIELD = "__fence"

# The fencing check of every owner-token write, in the shard key's own slot: a writer whose
# coordinator token (ARGV[n]; '' = no fencing) is below the one stored is refused, and a
# higher one is stored. So a deposed coordinator that resumes mid-write cannot overwrite the
# owner tokens its successor wrote, even between its last term check and the write.
_FENCE = """
local function fenced(key, mine)
  if mine == '' then return false end
  local stored = tonumber(redis.call('HGET', key, '__fence') or '0')
  local writer = tonumber(mine)
  if writer < stored then return stored end
  if writer > stored then redis.call('HSET', key, '__fence', writer) end
  return false
end
"""

# Set a group's owner token. ARGV: group, token JSON, coordinator token.
SET_OWNER = f"""{_FENCE}
local above = fenced(KEYS[1], ARGV[3])
if above then return redis.error_reply('FENCED owner token of ' .. KEYS[1] .. ' fence ' .. above) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

# Delete a group's owner token whoever it names. ARGV: group, coordinator token.
DELETE_OWNER = f"""{_FENCE}
local above = fenced(KEYS[1], ARGV[2])
if above then return redis.error_reply('FENCED owner token of ' .. KEYS[1] .. ' fence ' .. above) end
return redis.call('HDEL', KEYS[1], ARGV[1])
"""

# Delete the owner token of a group only if it still names the same member incarnation.
# ARGV: group, member id, incarnation, coordinator token.
CLEAR_OWNER = f"""{_FENCE}
local above = fenced(KEYS[1], ARGV[4])
if above then return redis.error_reply('FENCED owner token of ' .. KEYS[1] .. ' fence ' .. above) end
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then return 0 end
local token = cjson.decode(current)
if token['memberId'] == ARGV[2] and token['incarnation'] == ARGV[3] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""

#: Commands per pipeline when creating many shard keys or consumer groups.
CHUNK = 512


@attrs.frozen
class GroupLag:
    """One consumer group on one shard key, as XINFO GROUPS reports it (`consumers`: the
    consumer names it holds; departed members' are pruned once nothing is pending under them)."""

    group: str
    pending: int
    lag: int | None
    last_delivered_id: str
    consumers: int = 0


@attrs.frozen
class GroupDrain:
    """One consumer group on a DRAINING shard: entries read but not acknowledged, and whether
    any entry is left to deliver after its last-delivered id."""

    group: str
    pending: int
    undelivered: bool


@attrs.frozen
class DrainEvidence:
    """What Redis says, in one script on the shard's own node, about a DRAINING shard."""

    sealed: bool
    #: The key holds something: an entry, or entries still pending in a group (emptied by XDEL).
    exists: bool
    groups: tuple[GroupDrain, ...] = ()

    def drained(self, groups: Iterable[str]) -> bool:
        """No entry pending or left to deliver in any consumer group on the key, and each of
        `groups` (the stream's) present there, unless the key holds nothing at all."""
        if not self.exists:
            return True
        present = {g.group for g in self.groups}
        if not set(groups) <= present:
            return False
        return all(g.pending == 0 and not g.undelivered for g in self.groups)


@attrs.frozen
class ShardStats:
    """What Redis says about one shard key (for monitoring; `lag` may be null or stale)."""

    length: int
    groups: tuple[GroupLag, ...]
    primary_node: str | None = None


class Effects(Protocol):
    async def register_stream(self, stream_prefix: str) -> None: ...

    async def unregister_stream(self, stream_prefix: str) -> None:
        """Forget the stream, and release the quota of whoever created it."""
        ...

    async def stream_count(self) -> int:
        """How many streams exist (the registry's set)."""
        ...

    async def created_count(self, owner: str) -> int:
        """How many existing streams `owner` created (its `streams` quota's use)."""
        ...

    async def record_created(self, owner: str, stream_prefix: str) -> None:
        """`owner` created `stream_prefix` (counted until the stream is deleted)."""
        ...

    async def delete_streams(self, shard_keys: Iterable[str]) -> None:
        """Delete shard keys with everything kept next to them (owner tokens)."""
        ...

    async def expire_streams(self, shard_keys: Iterable[str], after_ms: int) -> None:
        """Have Redis delete retired shard keys (with their owner tokens and seal) `after_ms`
        from now; a key that has a time to live already keeps it."""
        ...

    async def destroy_consumer_groups(self, shard_keys: Iterable[str], group: str) -> None:
        """Destroy `group`'s consumer group (and its pending entries) and owner token on each key."""
        ...

    async def streams(self) -> set[str]:
        """Every registered stream prefix."""
        ...

    async def ping(self) -> bool:
        """Whether the data plane answers."""
        ...

    async def topology(self) -> Topology | None:
        """The Redis Cluster primaries and their slots; None on standalone Redis."""
        ...

    async def shard_stats(self, shard_keys: Iterable[str]) -> dict[str, ShardStats]:
        """Length, consumer groups and primary node of each shard key."""
        ...

    async def ensure_streams(self, shard_keys: Iterable[str]) -> None: ...

    async def seal(self, shard_keys: Iterable[str], version: int) -> None:
        """Seal the shard keys: producers' appends to them are refused from now on."""
        ...

    async def drain_evidence(self, shard_keys: Iterable[str]) -> dict[str, DrainEvidence]:
        """Each key's drain evidence (`DRAIN_EVIDENCE`), read on its own node."""
        ...

    async def dead_letter_counts(self, shard_keys: Iterable[str]) -> dict[str, int]:
        """How many entries each shard's dead-letter stream (`<shard key>:dlq`) holds."""
        ...

    async def prune_consumers(self, shard_keys: Iterable[str], group: str, live: Iterable[str]) -> int:
        """Delete `group`'s consumers on `shard_keys` that are not `live` members and have nothing
        pending (`PRUNE_CONSUMERS`); how many were deleted."""
        ...

    async def dead_letters(self, shard_key: str, count: int) -> list[tuple[str, dict[str, str]]]:
        """The oldest `count` entries of a shard's dead-letter stream."""
        ...

    async def replay_dead_letters(
        self, shard_key: str, ids: Sequence[str], count: int
    ) -> list[tuple[str, str]]:
        """Append dead letters (`ids`, or the oldest `count`) to the shard again and delete them
        from the dead-letter stream, atomically; (dead-letter id, new id) of each."""
        ...

    async def ensure_consumer_groups(self, shard_keys: Iterable[str], group: str, start_id: str) -> None: ...

    async def find_shard_keys(self, stream_prefix: str) -> dict[int, str]:
        """The shard keys of `stream_prefix` Redis holds (index -> key), found by their names
        (`SCAN`, on every primary): what is left of a stream whose aggregate Redis lost."""
        ...

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


@attrs.frozen
class ShardKeyPattern:
    """Shard key names of one stream (`rsc.events.placement.shard_key`):
    `<namespace><prefix>:{<prefix>:<index>[:<attempt>]}`."""

    glob: str
    regex: re.Pattern[str]

    def index_of(self, key: str) -> int | None:
        found = self.regex.fullmatch(key)
        return int(found.group(1)) if found else None


def shard_key_pattern(stream_prefix: str, namespace: str) -> ShardKeyPattern:
    escaped = re.sub(r"([*?\[\]\\])", r"\\\1", f"{namespace}{stream_prefix}:{{{stream_prefix}:")
    regex = re.compile(re.escape(f"{namespace}{stream_prefix}:{{{stream_prefix}:") + r"(\d+)(?::\d+)?\}")
    return ShardKeyPattern(escaped + "*}", regex)


def token_text(token: OwnerToken) -> str:
    return codec.to_json(token)


class RedisEffects:
    """`Effects` on Redis through coredis; one call per shard key (each in its own slot)."""

    def __init__(
        self, redis: RedisClient, fence_token: Callable[[], int] | None = None, keys: KeySpace = DEFAULT_KEYS
    ) -> None:
        self.redis = redis
        #: Where the keys are (the namespace new shard keys get, through `topology`).
        self.keys = keys
        #: Raises `TermFenced` when this coordinator holds no active term (None: always write).
        self.fence_token = fence_token
        #: Told of an owner-token fence above our token (`rsc.actors.redis_store.FenceFloor`).
        self.on_fenced: Callable[[int], Awaitable[bool]] | None = None
        self._ensure_stream = redis.register_script(ENSURE_STREAM)
        self._clear_owner = redis.register_script(CLEAR_OWNER)
        self._set_owner = redis.register_script(SET_OWNER)
        self._delete_owner = redis.register_script(DELETE_OWNER)
        self._ensure_group = redis.register_script(ENSURE_GROUP)
        self._destroy_group = redis.register_script(DESTROY_GROUP)
        self._drain_evidence = redis.register_script(DRAIN_EVIDENCE)
        self._replay = redis.register_script(REPLAY_DEAD_LETTERS)
        self._prune = redis.register_script(PRUNE_CONSUMERS)

    async def register_stream(self, stream_prefix: str) -> None:
        self._in_term()
        await _guard(self.redis.sadd(self.keys.streams, [stream_prefix]))

    async def unregister_stream(self, stream_prefix: str) -> None:
        self._in_term()
        await _guard(self.redis.srem(self.keys.streams, [stream_prefix]))
        with redis_errors("releasing a stream quota"):
            owner = await self.redis.hget(self.keys.creators, stream_prefix)
            if owner is not None:
                await self.redis.srem(self.keys.created(owner), [stream_prefix])
                await self.redis.hdel(self.keys.creators, [stream_prefix])

    async def stream_count(self) -> int:
        with redis_errors("counting streams"):
            return int(await self.redis.scard(self.keys.streams))

    async def created_count(self, owner: str) -> int:
        with redis_errors("counting a stream quota"):
            return int(await self.redis.scard(self.keys.created(owner)))

    async def record_created(self, owner: str, stream_prefix: str) -> None:
        self._in_term()
        with redis_errors("recording a stream quota"):
            # One slot ({coordinator}): both or neither.
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.sadd(self.keys.created(owner), [stream_prefix])
                pipe.hset(self.keys.creators, {stream_prefix: owner})

    def _in_term(self) -> None:
        if self.fence_token is not None:
            self.fence_token()

    def _token_arg(self) -> str:
        """This term's coordinator token for the owner-token scripts ('' without fencing)."""
        return "" if self.fence_token is None else str(self.fence_token())

    async def delete_streams(self, shard_keys: Iterable[str]) -> None:
        for chunk in _chunks(shard_keys):
            async with self._pipeline() as pipe:
                for key in chunk:
                    pipe.delete([key, owner_key(key), seal_key(key), dead_letter_key(key)])

    async def expire_streams(self, shard_keys: Iterable[str], after_ms: int) -> None:
        if after_ms <= 0:
            await self.delete_streams(shard_keys)
            return
        for chunk in _chunks(shard_keys):
            async with self._pipeline() as pipe:
                for key in chunk:
                    for each in (key, owner_key(key), seal_key(key)):
                        pipe.pexpire(each, after_ms, condition=PureToken.NX)

    async def seal(self, shard_keys: Iterable[str], version: int) -> None:
        for chunk in _chunks(shard_keys):
            async with self._pipeline() as pipe:
                for key in chunk:
                    pipe.set(seal_key(key), str(version), condition=PureToken.NX)  # the first stays

    async def drain_evidence(self, shard_keys: Iterable[str]) -> dict[str, DrainEvidence]:
        out: dict[str, DrainEvidence] = {}
        for chunk in _chunks(shard_keys):
            with redis_errors("reading drain evidence"):
                async with self.redis.pipeline(transaction=False) as pipe:
                    for key in chunk:
                        self._drain_evidence(keys=[key, seal_key(key)], client=pipe)
            for key, (sealed, last, groups) in zip(chunk, pipe.results or (), strict=True):
                found = tuple(GroupDrain(str(g[0]), int(g[1]), bool(int(g[2]))) for g in groups)
                # A key emptied (XDEL, XTRIM) while entries are pending still holds those.
                holds = bool(last) or any(g.pending for g in found)
                out[key] = DrainEvidence(bool(int(sealed)), holds, found)
        return out

    async def dead_letter_counts(self, shard_keys: Iterable[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for chunk in _chunks(shard_keys):
            with redis_errors("reading dead-letter streams"):
                async with self.redis.pipeline(transaction=False) as pipe:
                    for key in chunk:
                        pipe.xlen(dead_letter_key(key))
            out.update(zip(chunk, (int(n) for n in pipe.results or ()), strict=True))
        return out

    async def prune_consumers(self, shard_keys: Iterable[str], group: str, live: Iterable[str]) -> int:
        keep = sorted(live)
        gone = 0
        for chunk in _chunks(shard_keys):
            with redis_errors("pruning departed consumers"):
                async with self.redis.pipeline(transaction=False) as pipe:
                    for key in chunk:
                        self._prune(keys=[key], args=[group, *keep], client=pipe)
            gone += sum(int(n) for n in pipe.results or ())
        return gone

    async def dead_letters(self, shard_key: str, count: int) -> list[tuple[str, dict[str, str]]]:
        with redis_errors("reading a dead-letter stream"):
            entries = await self.redis.xrange(dead_letter_key(shard_key), count=count)
        return [(str(e.identifier), {str(k): str(v) for k, v in e.field_values.items()}) for e in entries]

    async def replay_dead_letters(
        self, shard_key: str, ids: Sequence[str], count: int
    ) -> list[tuple[str, str]]:
        with redis_errors("replaying dead letters"):
            done = await self._replay(keys=[shard_key, dead_letter_key(shard_key)], args=[count, *ids])
        return [(str(old), str(new)) for old, new in done]

    async def destroy_consumer_groups(self, shard_keys: Iterable[str], group: str) -> None:
        for chunk in _chunks(shard_keys):
            async with self._pipeline() as pipe:
                for key in chunk:
                    self._destroy_group(keys=[key, owner_key(key)], args=[group], client=pipe)

    async def streams(self) -> set[str]:
        with redis_errors("listing streams"):
            return set(await self.redis.smembers(self.keys.streams))

    async def ping(self) -> bool:
        try:
            with redis_errors("ping"):
                await self.redis.ping()
        except StoreUnavailable:
            return False
        return True

    async def shard_stats(self, shard_keys: Iterable[str]) -> dict[str, ShardStats]:
        keys = list(shard_keys)
        topology = await self.topology()
        stats: dict[str, ShardStats] = {}
        for chunk in _chunks(keys):  # XLEN and XINFO GROUPS of 512 keys per round trip and node
            with redis_errors("reading shard statistics"):
                async with self.redis.pipeline(transaction=False, raise_on_error=False) as pipe:
                    for key in chunk:
                        pipe.xlen(key)
                        pipe.xinfo_groups(key)
            results = pipe.results or ()
            for key, xlen, xinfo in zip(chunk, results[::2], results[1::2], strict=True):
                length, infos = xlen, xinfo
                if isinstance(xlen, BaseException) or isinstance(xinfo, BaseException):
                    _raise_unless_missing(xlen, xinfo)
                    length, infos = 0, ()  # the key does not exist (yet)
                groups = tuple(
                    GroupLag(
                        str(i["name"]),
                        int(i["pending"]),
                        i.get("lag"),
                        str(i["last-delivered-id"]),
                        int(i.get("consumers", 0)),
                    )
                    for i in infos
                )
                node = (
                    None
                    if topology is None or not topology.primaries
                    else (topology.node_of(key) or "unknown")
                )
                stats[key] = ShardStats(int(length), groups, node)
        return stats

    async def topology(self) -> Topology | None:
        """The cluster's primaries and the namespace of new shard keys (None: standalone Redis
        and no namespace)."""
        namespace = self.keys.namespace
        if not isinstance(self.redis, coredis.RedisCluster):
            return Topology((), namespace) if namespace else None
        with redis_errors("reading the cluster layout"):
            try:
                found = topology_from_shards(await self.redis.cluster_shards())
            except coredis.exceptions.ResponseError:  # before Redis 7: no CLUSTER SHARDS
                found = topology_from_slots(await self.redis.cluster_slots())
        return attrs.evolve(found, namespace=namespace)

    async def ensure_streams(self, shard_keys: Iterable[str]) -> None:
        for chunk in _chunks(shard_keys):
            async with self._pipeline() as pipe:
                for key in chunk:
                    self._ensure_stream(keys=[key], client=pipe)

    async def ensure_consumer_groups(self, shard_keys: Iterable[str], group: str, start_id: str) -> None:
        for chunk in _chunks(shard_keys):
            async with self._pipeline() as pipe:
                for key in chunk:
                    self._ensure_group(keys=[key], args=[group, start_id], client=pipe)

    async def find_shard_keys(self, stream_prefix: str) -> dict[int, str]:
        pattern = shard_key_pattern(stream_prefix, self.keys.namespace)
        found: dict[int, str] = {}
        with redis_errors("looking for shard keys"):
            async for key in self.redis.scan_iter(match=pattern.glob, count=1_000, type_="stream"):
                index = pattern.index_of(str(key))
                if index is not None:
                    found.setdefault(index, str(key))
        return found

    async def set_owners(self, group: str, tokens: Mapping[str, OwnerToken]) -> None:
        fence = self._token_arg()
        async with self._pipeline() as pipe:
            for key, token in tokens.items():
                self._set_owner(keys=[owner_key(key)], args=[group, token_text(token), fence], client=pipe)

    async def clear_owners(self, group: str, tokens: Mapping[str, OwnerToken]) -> None:
        fence = self._token_arg()
        async with self._pipeline() as pipe:
            for key, token in tokens.items():
                args = [group, token.member_id, token.incarnation, fence]
                self._clear_owner(keys=[owner_key(key)], args=args, client=pipe)

    async def owners(self, group: str, shard_keys: Iterable[str]) -> dict[str, OwnerToken]:
        keys = list(shard_keys)
        async with self._pipeline() as pipe:
            requests = [pipe.hget(owner_key(key), group) for key in keys]
        texts = [await request for request in requests]
        return {k: codec.from_json(t, OwnerToken) for k, t in zip(keys, texts, strict=True) if t is not None}

    async def sync_owners(
        self, group: str, shard_keys: Iterable[str], tokens: Mapping[str, OwnerToken]
    ) -> None:
        fence = self._token_arg()
        async with self._pipeline() as pipe:
            for key in sorted(set(shard_keys) | set(tokens)):
                if key in tokens:
                    args = [group, token_text(tokens[key]), fence]
                    self._set_owner(keys=[owner_key(key)], args=args, client=pipe)
                else:
                    self._delete_owner(keys=[owner_key(key)], args=[group, fence], client=pipe)

    @contextlib.asynccontextmanager
    async def _pipeline(self) -> AsyncIterator[Any]:
        """One round trip per node for many single-key commands (they run when the block exits)."""
        self._in_term()
        try:
            with redis_errors("side effect"):
                async with self.redis.pipeline(transaction=False) as pipe:
                    yield pipe
        except coredis.exceptions.ResponseError as exc:
            if error_code(exc) == "FENCED":
                found = re.search(r" fence (\d+)", str(exc))  # the figure the refusal carries
                fence = int(found.group(1)) if found else None
                if fence is not None and self.on_fenced is not None:
                    await self.on_fenced(fence)  # Redis lost the token counter: the next try passes
                raise TermFenced(f"a newer coordinator term wrote there: {exc}", fence) from exc
            raise


async def _guard(awaitable: object) -> None:
    with redis_errors("side effect"):
        await awaitable  # type: ignore[misc]


def _raise_unless_missing(xlen: object, xinfo: object) -> None:
    """Raise the error of `XLEN` or `XINFO GROUPS` of one key, unless the key does not exist:
    then `XLEN` answers 0 and `XINFO` refuses with the generic `ERR` (Redis gives "no such key"
    no code of its own; any other refusal has one, e.g. `WRONGTYPE`, and is raised)."""
    if isinstance(xlen, BaseException):
        raise StoreUnavailable(f"reading shard statistics: {xlen}") from xlen
    missing = xlen == 0 and isinstance(xinfo, coredis.exceptions.ResponseError) and error_code(xinfo) == "ERR"
    if isinstance(xinfo, BaseException) and not missing:
        raise StoreUnavailable(f"reading shard statistics: {xinfo}") from xinfo


def _chunks(keys: Iterable[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    for key in keys:
        batch.append(key)
        if len(batch) == CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


def topology_from_shards(shards: Iterable[Mapping[str, Any]]) -> Topology:
    """The primaries from a CLUSTER SHARDS reply (Redis 7+)."""
    primaries = []
    for shard in shards:
        primary = next((n for n in shard["nodes"] if n["role"] == "master"), None)
        bounds = shard["slots"]
        if primary is None or not bounds:
            continue
        ranges = tuple((int(low), int(high)) for low, high in zip(bounds[::2], bounds[1::2], strict=True))
        primaries.append(Primary(f"{primary['ip']}:{primary['port']}", ranges))
    return Topology(tuple(sorted(primaries, key=lambda p: p.first_slot)))


def topology_from_slots(slots: Mapping[tuple[int, int], Sequence[Mapping[str, Any]]]) -> Topology:
    """The primaries from a CLUSTER SLOTS reply (any version; a range's first node is its primary)."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for (low, high), nodes in slots.items():
        if nodes:
            ranges.setdefault(f"{nodes[0]['host']}:{nodes[0]['port']}", []).append((int(low), int(high)))
    primaries = (Primary(node, tuple(sorted(r))) for node, r in ranges.items())
    return Topology(tuple(sorted(primaries, key=lambda p: p.first_slot)))


class MemoryEffects:
    """A fake `Effects` that keeps everything in dicts (for time-driven actor tests)."""

    def __init__(self) -> None:
        self.registered: set[str] = set()
        self.shard_keys: set[str] = set()
        self.consumer_groups: dict[tuple[str, str], str] = {}
        self.tokens: dict[tuple[str, str], OwnerToken] = {}
        self.sealed: dict[str, int] = {}
        #: What `drain_evidence` says of a key (default: sealed as sealed here, nothing left).
        self.evidence: dict[str, DrainEvidence] = {}
        #: Retired keys and the time to live they were given.
        self.expiring: dict[str, int] = {}
        #: Streams by who created them, and who created each (`record_created`).
        self.created: dict[str, set[str]] = {}
        self.creators: dict[str, str] = {}

    async def seal(self, shard_keys: Iterable[str], version: int) -> None:
        for key in shard_keys:
            self.sealed[key] = version

    async def drain_evidence(self, shard_keys: Iterable[str]) -> dict[str, DrainEvidence]:
        return {k: self.evidence.get(k, DrainEvidence(k in self.sealed, False)) for k in shard_keys}

    async def register_stream(self, stream_prefix: str) -> None:
        self.registered.add(stream_prefix)

    async def unregister_stream(self, stream_prefix: str) -> None:
        self.registered.discard(stream_prefix)
        owner = self.creators.pop(stream_prefix, None)
        if owner is not None:
            self.created[owner].discard(stream_prefix)

    async def stream_count(self) -> int:
        return len(self.registered)

    async def created_count(self, owner: str) -> int:
        return len(self.created.get(owner, ()))

    async def record_created(self, owner: str, stream_prefix: str) -> None:
        self.created.setdefault(owner, set()).add(stream_prefix)
        self.creators[stream_prefix] = owner

    async def delete_streams(self, shard_keys: Iterable[str]) -> None:
        gone = set(shard_keys)
        self.shard_keys -= gone
        self.consumer_groups = {k: v for k, v in self.consumer_groups.items() if k[0] not in gone}
        self.tokens = {k: v for k, v in self.tokens.items() if k[0] not in gone}

    async def expire_streams(self, shard_keys: Iterable[str], after_ms: int) -> None:
        for key in shard_keys:
            self.expiring.setdefault(key, after_ms)

    async def dead_letter_counts(self, shard_keys: Iterable[str]) -> dict[str, int]:
        return dict.fromkeys(shard_keys, 0)

    async def prune_consumers(self, shard_keys: Iterable[str], group: str, live: Iterable[str]) -> int:
        return 0

    async def dead_letters(self, shard_key: str, count: int) -> list[tuple[str, dict[str, str]]]:
        return []

    async def replay_dead_letters(
        self, shard_key: str, ids: Sequence[str], count: int
    ) -> list[tuple[str, str]]:
        return []

    async def destroy_consumer_groups(self, shard_keys: Iterable[str], group: str) -> None:
        for key in shard_keys:
            self.consumer_groups.pop((key, group), None)
            self.tokens.pop((key, group), None)

    async def streams(self) -> set[str]:
        return set(self.registered)

    async def ping(self) -> bool:
        return True

    async def shard_stats(self, shard_keys: Iterable[str]) -> dict[str, ShardStats]:
        return {key: ShardStats(0, ()) for key in shard_keys}

    async def topology(self) -> Topology | None:
        return None

    async def ensure_streams(self, shard_keys: Iterable[str]) -> None:
        self.shard_keys.update(shard_keys)

    async def ensure_consumer_groups(self, shard_keys: Iterable[str], group: str, start_id: str) -> None:
        for key in shard_keys:
            self.shard_keys.add(key)
            self.consumer_groups.setdefault((key, group), start_id)

    async def find_shard_keys(self, stream_prefix: str) -> dict[int, str]:
        pattern = shard_key_pattern(stream_prefix, "")
        return {i: k for k in sorted(self.shard_keys) if (i := pattern.index_of(k)) is not None}

    async def set_owners(self, group: str, tokens: Mapping[str, OwnerToken]) -> None:
        for key, token in tokens.items():
            self.tokens[key, group] = token

    async def clear_owners(self, group: str, tokens: Mapping[str, OwnerToken]) -> None:
        for key, token in tokens.items():
            current = self.tokens.get((key, group))
            if current and (current.member_id, current.incarnation) == (token.member_id, token.incarnation):
                del self.tokens[key, group]

    async def owners(self, group: str, shard_keys: Iterable[str]) -> dict[str, OwnerToken]:
        return {k: self.tokens[k, group] for k in shard_keys if (k, group) in self.tokens}

    async def sync_owners(
        self, group: str, shard_keys: Iterable[str], tokens: Mapping[str, OwnerToken]
    ) -> None:
        for key in set(shard_keys) | set(tokens):
            if key in tokens:
                self.tokens[key, group] = tokens[key]
            else:
                self.tokens.pop((key, group), None)
