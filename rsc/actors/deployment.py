"""The one door between the HTTP layer and the actors: `Deployment`.

`rsc.http` asks everything of the coordinator's actors through a `Deployment` (heartbeats and
producer heartbeats, the views, the Admin API's changes, dead letters, feature levels, the
samples `/metrics` shows) and imports from `rsc.actors` only this module and
`rsc.actors.errors`. Each method is typed; nothing crossing it is `Any`. The `Registry`
behind it keeps the actors' lifecycle (start, stop, idle, terms) and its own callers in
`rsc.actors`; the composition root (`rsc.coordinator_process`) builds both.

The names the HTTP layer needs of the actors' types (`GroupActor`, `Reply`, `Leadership`...)
are re-exported here so that it never reaches past the port.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

import attrs

from rsc.actors import admin_changes, admin_queries, group_reset, retention
from rsc.actors.actor import Reply
from rsc.actors.admin_queries import Pending as PendingEntry
from rsc.actors.admin_queries import ShardFigures, StreamFacts
from rsc.actors.aggregates import GroupActor, GroupObserver, StreamActor
from rsc.actors.answers import Answer
from rsc.actors.answers import Pending as HeldAnswer
from rsc.actors.dataset import DATA_LOSS, KINDS
from rsc.actors.effects.inspection import GroupLag, ShardStats
from rsc.actors.features import FeatureState
from rsc.actors.health import REDIS_OUTAGE, store_failed
from rsc.actors.keys import DEFAULT_KEYS, KeySpace
from rsc.actors.leadership import Leadership
from rsc.actors.registry import Registry
from rsc.actors.retention import GroupLoss, RetentionFigures
from rsc.actors.store_connection import RedisClient, raise_first, redis_errors
from rsc.actors.stream_dead_letters import DeadLetterCount, DeadLetterEntry, ReplayOutcome
from rsc.events.commands import GroupCommand, StreamCommand
from rsc.events.errors import CoordinationError
from rsc.events.events import GroupEvent, StreamEvent
from rsc.events.group import GroupState
from rsc.events.group_position import ResetPlan, ResetTarget
from rsc.events.model import GroupConfig, Layout, ReshardMode, Timing
from rsc.events.quotas import Quota
from rsc.events.scaling import Scale
from rsc.events.stream import StreamState
from rsc.events.versions import Party

__all__ = [
    "DATA_LOSS",
    "DEFAULT_KEYS",
    "KINDS",
    "REDIS_OUTAGE",
    "ActorFigures",
    "Answer",
    "DeadLetterCount",
    "DeadLetterEntry",
    "Deployment",
    "Registry",
    "FeatureState",
    "GroupActor",
    "GroupFollowUps",
    "GroupLag",
    "GroupLoss",
    "HeldAnswer",
    "KeySpace",
    "Leadership",
    "PendingEntry",
    "RedisClient",
    "ReplayOutcome",
    "Reply",
    "ResetPlan",
    "RetentionFigures",
    "ShardFigures",
    "ShardStats",
    "StreamActor",
    "StreamFacts",
    "raise_first",
    "redis_errors",
    "as_deployment",
    "store_failed",
]


#: Commands a decided batch of group events calls for, decided in the same batch and write
#: (`Actor.follow_ups`): the held heartbeats' rechecks.
GroupFollowUps = Callable[[GroupState, Sequence[GroupEvent]], Sequence[tuple[GroupCommand, Answer]]]


@attrs.frozen
class ActorFigures:
    """One actor of this process as `/metrics` shows it: its aggregate (`stream` or
    `stream/group`), its inbox and write counters, whether it has started (loaded and
    recovered), and its state (None: not loaded yet)."""

    aggregate: str
    inbox_depth: int
    writes: int
    conflicts: int
    started: bool
    state: GroupState | StreamState | None


class Deployment:
    """What the HTTP layer may ask of the coordinator's actors (see the module)."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    # --- time and settings --------------------------------------------------

    def now_ms(self) -> int:
        """The coordinator's clock, in ms since the epoch."""
        return self._registry.clock.now_ms()

    @property
    def timing(self) -> Timing:
        """The protocol's timing (lease, heartbeat interval...)."""
        return self._registry.settings.timing

    # --- asking the actors ----------------------------------------------------

    async def ask_group(
        self,
        stream_prefix: str,
        group: str,
        command: GroupCommand,
        create: bool = True,
        expect: int | None = None,
        seen_version: int = 0,
        rebuild: bool = True,
        quota: Quota | None = None,
    ) -> Reply[GroupState, GroupEvent]:
        """`command`'s reply from the group's actor (`Registry.ask_group`)."""
        return await self._registry.ask_group(
            stream_prefix, group, command, create, expect, seen_version, rebuild, quota
        )

    async def ask_group_many(
        self,
        stream_prefix: str,
        group: str,
        commands: Sequence[GroupCommand],
        create: bool = True,
        seen_version: int = 0,
        rebuild: bool = True,
        quota: Quota | None = None,
    ) -> list[Reply[GroupState, GroupEvent] | CoordinationError]:
        """The replies of `commands`, decided together (`Registry.ask_group_many`)."""
        return await self._registry.ask_group_many(
            stream_prefix, group, commands, create, seen_version, rebuild, quota
        )

    async def ask_stream(
        self,
        stream_prefix: str,
        command: StreamCommand,
        create: bool | None = None,
        expect: int | None = None,
        seen_version: int = 0,
        quota: Quota | None = None,
    ) -> Reply[StreamState, StreamEvent]:
        """`command`'s reply from the stream's actor (`Registry.ask_stream`)."""
        return await self._registry.ask_stream(stream_prefix, command, create, expect, seen_version, quota)

    async def group(
        self,
        stream_prefix: str,
        group: str,
        config: GroupConfig | None = None,
        create: bool = True,
        only_new: bool = False,
        quota: Quota | None = None,
    ) -> GroupActor:
        """The group's actor, started (`Registry.group`)."""
        return await self._registry.group(stream_prefix, group, config, create, only_new, quota=quota)

    async def stream(
        self,
        stream_prefix: str,
        create: bool | None = None,
        shard_count: int | None = None,
        only_new: bool = False,
        quota: Quota | None = None,
    ) -> StreamActor:
        """The stream's actor, started (`Registry.stream`)."""
        return await self._registry.stream(stream_prefix, create, shard_count, only_new, quota=quota)

    def creating(self, stream_prefix: str) -> contextlib.AbstractContextManager[None]:
        """Mark the stream as being created for the block (`Registry.creating`)."""
        return self._registry.creating(stream_prefix)

    async def stream_prefixes(self) -> list[str]:
        """Every stream the coordinator has created, sorted."""
        return await self._registry.stream_prefixes()

    def behind_the_fleet(self, stream_prefix: str) -> None:
        """A party routes by a layout newer than the stored one (`Registry.behind_the_fleet`)."""
        self._registry.behind_the_fleet(stream_prefix)

    def trim_soon(self, stream_prefix: str, shards: Iterable[int] | None = None) -> None:
        """Have retention look at the stream's `shards` (None: every shard) early."""
        self._registry.trim_requests.ask(stream_prefix, shards)

    # --- observing ------------------------------------------------------------

    def observe_groups(self, observer: GroupObserver) -> None:
        """Tell `observer` of every persisted batch of group events (once, however often asked)."""
        if observer not in self._registry.group_observers:
            self._registry.group_observers.append(observer)

    def follow_up_groups(self, follow_ups: GroupFollowUps) -> None:
        """Ask `follow_ups` of every decided batch of group events, before it is written."""
        self._registry.group_follow_ups.append(follow_ups)

    def actor_figures(self) -> list[ActorFigures]:
        """Every actor of this process, started or starting."""
        found = []
        for aggregate_id, entry in list(self._registry.actors.items()):
            actor = entry.actor
            state = actor.state
            found.append(
                ActorFigures(
                    str(aggregate_id),
                    actor.inbox_depth,
                    actor.writes,
                    actor.conflicts,
                    entry.started,
                    state if isinstance(state, GroupState | StreamState) else None,
                )
            )
        return found

    def recovery(self) -> tuple[int, int]:
        """(running, repairing): the actors running now, and those of them still repairing
        their side effects after a load."""
        running = self._registry.running()
        return len(running), sum(1 for actor in running if actor.needs_repair)

    def layouts_seen(self) -> Mapping[str, Layout]:
        """The layout of each stream as last seen this term (a copy)."""
        return dict(self._registry.layouts)

    @property
    def retention_figures(self) -> RetentionFigures:
        """What retention did in this process."""
        return self._registry.retention_figures

    # --- feature levels -------------------------------------------------------

    async def feature_level(self) -> int:
        """The deployment's finalized feature level (read from Redis at most once a while)."""
        return await self._registry.feature_level()

    def known_feature_level(self) -> int:
        """The feature level as last learnt (never asks Redis)."""
        return self._registry.known_feature_level()

    async def peek_feature_state(self) -> FeatureState | None:
        """The feature level as Redis holds it now, read only (None: not recorded yet)."""
        return await self._registry.peek_feature_state()

    async def feature_state(self) -> FeatureState:
        """The finalized feature level and the highest written (`admin_queries.feature_state`)."""
        return await admin_queries.feature_state(self._registry)

    async def finalize_feature_level(
        self, level: int, by: str, parties: Callable[[], Awaitable[Sequence[Party]]]
    ) -> tuple[FeatureState, FeatureState]:
        """Finalize the feature `level` (`admin_queries.finalize_feature_level`)."""
        return await admin_queries.finalize_feature_level(self._registry, level, by, parties)

    async def live_parties(self) -> list[Party]:
        """Every live member and producer (`admin_queries.live_parties`)."""
        return await admin_queries.live_parties(self._registry)

    # --- views ------------------------------------------------------------------

    async def peek_streams(self, prefixes: Sequence[str]) -> dict[str, StreamState]:
        """The streams' states, read only (`admin_queries.peek_streams`)."""
        return await admin_queries.peek_streams(self._registry, prefixes)

    async def stream_facts(self, state: StreamState) -> StreamFacts:
        """What Redis says of the stream's shards (`admin_queries.stream_facts`)."""
        return await admin_queries.stream_facts(self._registry, state)

    async def shard_figures(self, keys: Sequence[str]) -> ShardFigures:
        """Lengths, group lags and dead letters of shard `keys` (`admin_queries.shard_figures`)."""
        return await admin_queries.shard_figures(self._registry, keys)

    async def redis_answers(self) -> bool:
        """Whether Redis answers a PING now."""
        return await admin_queries.redis_answers(self._registry)

    async def oldest_pending(
        self, stream_prefix: str, group: str, limit: int, payloads: bool = False
    ) -> list[PendingEntry]:
        """The group's oldest pending entries (`admin_queries.oldest_pending`)."""
        return await admin_queries.oldest_pending(self._registry, stream_prefix, group, limit, payloads)

    async def group_scale(self, stream_prefix: str, group: str, members_per_replica: int) -> Scale:
        """The group's work and the replicas it calls for (`admin_queries.group_scale`)."""
        return await admin_queries.group_scale(self._registry, stream_prefix, group, members_per_replica)

    async def group_loss(self, state: StreamState, group: str) -> GroupLoss:
        """What `group` lost to retention (`retention.group_loss`)."""
        return await retention.group_loss(self._registry, state, group)

    # --- dead letters -----------------------------------------------------------

    async def dead_letter_counts(self, stream_prefix: str) -> list[DeadLetterCount]:
        """The stream's dead letters, counted per shard."""
        return await admin_queries.dead_letter_counts(self._registry, stream_prefix)

    async def dead_letter_entries(
        self, stream_prefix: str, shard: int | None, limit: int, after: tuple[int, str] | None = None
    ) -> list[DeadLetterEntry]:
        """The stream's dead letters (`admin_queries.dead_letter_entries`)."""
        return await admin_queries.dead_letter_entries(self._registry, stream_prefix, shard, limit, after)

    async def replay_dead_letters(
        self, stream_prefix: str, shard: int | None, ids: Sequence[str], limit: int
    ) -> ReplayOutcome:
        """Dead letters published again (`admin_queries.replay_dead_letters`)."""
        return await admin_queries.replay_dead_letters(self._registry, stream_prefix, shard, ids, limit)

    # --- admin changes ----------------------------------------------------------

    async def delete_group(self, stream_prefix: str, group: str, expect: int | None = None) -> None:
        """Delete a group without live members (`admin_changes.delete_group`)."""
        await admin_changes.delete_group(self._registry, stream_prefix, group, expect)

    async def delete_stream(self, stream_prefix: str, expect: int | None = None) -> None:
        """Delete a stream without groups or live producers (`admin_changes.delete_stream`)."""
        await admin_changes.delete_stream(self._registry, stream_prefix, expect)

    async def change_shard_count(
        self,
        stream_prefix: str,
        shard_count: int,
        mode: ReshardMode = ReshardMode.ONLINE,
        migrations: bool = False,
        expect: int | None = None,
    ) -> Reply[StreamState, StreamEvent]:
        """Reshard (`admin_changes.change_shard_count`)."""
        return await admin_changes.change_shard_count(
            self._registry, stream_prefix, shard_count, mode, migrations, expect
        )

    async def resume_migration(
        self, stream_prefix: str, expect: int | None = None
    ) -> Reply[StreamState, StreamEvent]:
        """Resume a stalled migration (`admin_changes.resume_migration`)."""
        return await admin_changes.resume_migration(self._registry, stream_prefix, expect)

    async def abort_migration(
        self, stream_prefix: str, reason: str, expect: int | None = None
    ) -> Reply[StreamState, StreamEvent]:
        """Abort a migration that has not changed the layout yet (`admin_changes.abort_migration`)."""
        return await admin_changes.abort_migration(self._registry, stream_prefix, reason, expect)

    async def plan_reset(self, stream_prefix: str, group: str, target: ResetTarget) -> ResetPlan:
        """What a reset of `group` to `target` would do (`group_reset.plan_reset`)."""
        return await group_reset.plan_reset(self._registry, stream_prefix, group, target)

    async def reset_group(
        self,
        stream_prefix: str,
        group: str,
        target: ResetTarget,
        force: bool,
        by: str,
        expect: int | None = None,
    ) -> ResetPlan:
        """Reset `group` to `target` (`group_reset.reset_group`)."""
        return await group_reset.reset_group(self._registry, stream_prefix, group, target, force, by, expect)


def as_deployment(given: Deployment | Registry) -> Deployment:
    """`given` as a `Deployment`: a `Registry` (what `create_app` and `add_admin_routes` took
    before 0.3.0) is wrapped, with a `DeprecationWarning` (pass a `Deployment`)."""
    if isinstance(given, Deployment):
        return given
    warnings.warn(
        "passing a Registry to the HTTP layer is deprecated: pass rsc.actors.deployment.Deployment(registry)",
        DeprecationWarning,
        stacklevel=3,
    )
    return Deployment(given)
