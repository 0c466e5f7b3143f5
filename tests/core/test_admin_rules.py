"""The rules of an operator's changes (`rsc.events.admin_rules`), pure: no server, no Redis.

Which spec field needs which feature level, the `shards_per_stream` quota of a spec, when a
spec reshards, that `startFrom` is fixed when a group is created (checked by the group
aggregate too), and which feature levels may be finalized while whom is running.
"""

from __future__ import annotations

import pytest

from rsc.events import admin_rules, group
from rsc.events.admin_rules import FeatureGate, Reshard
from rsc.events.commands import ChangeShardCount, ConfigureGroup, CreateGroup, CreateStream
from rsc.events.errors import (
    FeatureLevelNotSupported,
    FeatureLevelRequired,
    ImmutableField,
    InvalidCommand,
    QuotaExceeded,
    UnknownFeatureLevel,
)
from rsc.events.events import GroupConfigured
from rsc.events.migration import target_count
from rsc.events.model import GroupConfig, ReshardMode, StartFrom
from rsc.events.stream import StreamState, decide, fold
from rsc.events.versions import MAX_FEATURE_LEVEL, MIGRATION_LEVEL, SEAL_LEVEL, STATIC_LEVEL, Party
from tests.groupkit import layout


def stream(count: int, *changes: ChangeShardCount) -> StreamState:
    state = fold(decide(None, CreateStream("orders", count)))
    assert state is not None
    for change in changes:
        state = fold(decide(state, change), state)
        assert state is not None
    return state


# --- which field needs which feature level -----------------------------------


def test_quiesce_needs_the_migration_level_and_online_needs_none() -> None:
    gate = admin_rules.reshard_mode_gate(ReshardMode.QUIESCE)
    assert gate is not None
    assert gate.level == MIGRATION_LEVEL
    assert admin_rules.reshard_mode_gate(ReshardMode.ONLINE) is None
    admin_rules.require(gate, MIGRATION_LEVEL)
    with pytest.raises(FeatureLevelRequired) as refused:
        admin_rules.require(gate, MIGRATION_LEVEL - 1)
    assert refused.value.code == "FEATURE_LEVEL_REQUIRED"
    assert refused.value.details == {"required": MIGRATION_LEVEL, "finalized": MIGRATION_LEVEL - 1}
    assert refused.value.message == (
        f"reshardMode quiesce runs a journaled migration, which needs feature level {MIGRATION_LEVEL}; "
        f"the deployment is at {MIGRATION_LEVEL - 1} (PUT /v1/admin/features)"
    )


def test_only_a_scale_in_needs_the_seal_level() -> None:
    state = stream(4)
    assert admin_rules.scale_in_gate(4, state) is None
    assert admin_rules.scale_in_gate(8, state) is None
    gate = admin_rules.scale_in_gate(2, state)
    assert gate is not None
    assert gate.level == SEAL_LEVEL
    assert "every producer checks seals" in gate.why
    with pytest.raises(FeatureLevelRequired):
        admin_rules.require(gate, SEAL_LEVEL - 1)
    admin_rules.require(gate, SEAL_LEVEL)


def test_static_hold_needs_the_static_level() -> None:
    assert admin_rules.group_spec_gate(GroupConfig(max_concurrency=4)) is None
    gate = admin_rules.group_spec_gate(GroupConfig(static_hold_ms=0))  # 0 is a hold too
    assert gate == FeatureGate(
        STATIC_LEVEL, f"staticHoldMs applies to static members, which need feature level {STATIC_LEVEL}"
    )
    with pytest.raises(FeatureLevelRequired) as refused:
        admin_rules.require(gate, STATIC_LEVEL - 1)
    assert refused.value.details == {"required": STATIC_LEVEL, "finalized": STATIC_LEVEL - 1}


def test_no_gate_is_required_at_every_level() -> None:
    admin_rules.require(None, 1)


# --- the shard quota of a spec --------------------------------------------------


def test_a_new_stream_above_the_shard_quota_is_refused() -> None:
    admin_rules.check_shard_quota(8, 8, None)
    with pytest.raises(QuotaExceeded) as refused:
        admin_rules.check_shard_quota(9, 8, None)
    assert refused.value.details == {"quota": "shards_per_stream", "limit": 8}
    assert refused.value.message == "shardCount 9 is above the quota shards_per_stream (8)"


def test_a_stream_above_a_lowered_quota_may_keep_its_count_or_shrink_but_not_grow() -> None:
    state = stream(16)
    admin_rules.check_shard_quota(16, 8, state)  # a mode change at the same count
    admin_rules.check_shard_quota(12, 8, state)  # a shrink, still above the quota
    with pytest.raises(QuotaExceeded):
        admin_rules.check_shard_quota(17, 8, state)


# --- when a spec reshards --------------------------------------------------------


def test_a_spec_at_the_streams_count_and_mode_changes_nothing() -> None:
    state = stream(4)
    assert admin_rules.reshard_for(state, 4, ReshardMode.ONLINE, MAX_FEATURE_LEVEL) is None


def test_a_new_count_reshards_with_migrations_from_their_level() -> None:
    state = stream(4)
    assert admin_rules.reshard_for(state, 8, ReshardMode.ONLINE, MIGRATION_LEVEL - 1) == Reshard(
        8, ReshardMode.ONLINE, False
    )
    assert admin_rules.reshard_for(state, 8, ReshardMode.ONLINE, MIGRATION_LEVEL) == Reshard(
        8, ReshardMode.ONLINE, True
    )


def test_a_mode_alone_is_stored_only_where_migrations_are_journaled() -> None:
    state = stream(4)
    assert admin_rules.reshard_for(state, 4, ReshardMode.QUIESCE, MIGRATION_LEVEL - 1) is None
    assert admin_rules.reshard_for(state, 4, ReshardMode.QUIESCE, MIGRATION_LEVEL) == Reshard(
        4, ReshardMode.QUIESCE, True
    )


def test_the_count_compared_is_the_one_a_migration_is_on_its_way_to() -> None:
    state = stream(4, ChangeShardCount(8, ReshardMode.QUIESCE, migrations=True))
    assert state.shard_count == 4
    assert target_count(state) == 8  # quiesced producers first: the layout has not switched yet
    assert admin_rules.reshard_for(state, 8, ReshardMode.QUIESCE, MAX_FEATURE_LEVEL) is None
    assert admin_rules.scale_in_gate(8, state) is None
    admin_rules.check_shard_quota(8, 6, state)  # on its way there already


# --- startFrom is fixed when a group is created ------------------------------------


def test_start_from_cannot_change() -> None:
    stored = GroupConfig(start_from=StartFrom.LATEST)
    admin_rules.check_group_change(stored, GroupConfig(max_concurrency=8, start_from=StartFrom.LATEST))
    with pytest.raises(ImmutableField) as refused:
        admin_rules.check_group_change(stored, GroupConfig(start_from=StartFrom.EARLIEST))
    assert refused.value.code == "IMMUTABLE_FIELD"
    assert refused.value.details == {"field": "startFrom", "stored": "latest"}
    assert refused.value.message == (
        "startFrom is 'latest': it applies when a group is created and cannot change "
        "(delete the group and create it again to start elsewhere)"
    )


def test_the_group_aggregate_refuses_a_change_of_start_from_and_applies_the_rest() -> None:
    created = GroupConfig(start_from=StartFrom.LATEST)
    state, _ = group.execute(None, CreateGroup("orders", "billing", layout(4), config=created))
    with pytest.raises(ImmutableField):
        group.decide(state, ConfigureGroup(GroupConfig(max_concurrency=2, start_from=StartFrom.EARLIEST)))
    wanted = GroupConfig(max_concurrency=2, start_from=StartFrom.LATEST)
    assert group.decide(state, ConfigureGroup(wanted)) == [GroupConfigured(wanted)]


# --- finalizing a feature level ------------------------------------------------------


def test_only_levels_this_release_knows_may_be_finalized() -> None:
    for level in range(1, MAX_FEATURE_LEVEL + 1):
        admin_rules.check_known_level(level)
    with pytest.raises(InvalidCommand, match="level must be at least 1"):
        admin_rules.check_known_level(0)
    with pytest.raises(UnknownFeatureLevel) as unknown:
        admin_rules.check_known_level(MAX_FEATURE_LEVEL + 1)
    assert unknown.value.code == "UNSUPPORTED_FEATURE_LEVEL"
    assert unknown.value.details == {"supported": [1, MAX_FEATURE_LEVEL]}


def test_only_raising_the_level_asks_the_parties() -> None:
    assert admin_rules.raises_level(3, 2)
    assert not admin_rules.raises_level(2, 2)
    assert not admin_rules.raises_level(1, 2)


def test_raising_the_level_waits_for_every_party_that_does_not_support_it() -> None:
    new = Party("member", "orders/billing/m-1", "0.2.0", 4)
    old = Party("producer", "orders/p-1", "0.1.0", 1)
    admin_rules.check_supported(4, [new])
    admin_rules.check_supported(1, [new, old])
    with pytest.raises(FeatureLevelNotSupported) as refused:
        admin_rules.check_supported(2, [new, old])
    assert refused.value.code == "FEATURE_LEVEL_NOT_SUPPORTED"
    assert refused.value.message == (
        "cannot finalize feature level 2: not supported by producer orders/p-1 (0.1.0, up to 1); "
        "upgrade (or stop) them first"
    )
    assert refused.value.details == {
        "blockers": [{"kind": "producer", "name": "orders/p-1", "version": "0.1.0", "featureLevel": 1}]
    }
