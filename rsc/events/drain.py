"""When a shard counts as drained: the rule over what Redis says about it.

The coordinator reads, in one script on the shard key's own node, whether the key is sealed,
whether it holds anything, and per consumer group on the key what is pending and whether
anything is left to deliver (`DrainEvidence`, read by `rsc.actors.effects.inspection`). This
module decides from that evidence; the stream aggregate takes the verdict as a `DrainCheck`.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from rsc.events.model import DrainCheck


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


def evidence(sealed: bool, last_entry_id: str, groups: Iterable[GroupDrain]) -> DrainEvidence:
    """The evidence from what the script read: the seal, the key's last entry id ('' when the
    key is missing or empty) and its groups. A key emptied (XDEL, XTRIM) while entries are
    pending still holds those. Raises nothing."""
    found = tuple(groups)
    return DrainEvidence(sealed, bool(last_entry_id) or any(g.pending for g in found), found)


def drained(evidence: DrainEvidence, groups: Iterable[str]) -> bool:
    """No entry pending or left to deliver in any consumer group on the key, and each of
    `groups` (the stream's) present there, unless the key holds nothing at all. Raises nothing."""
    if not evidence.exists:
        return True
    present = {g.group for g in evidence.groups}
    if not set(groups) <= present:
        return False
    return all(g.pending == 0 and not g.undelivered for g in evidence.groups)


def drain_check(evidence: DrainEvidence, groups: Iterable[str]) -> DrainCheck:
    """The evidence as the stream aggregate takes it: sealed, and `drained` for the stream's
    `groups`. Raises nothing."""
    return DrainCheck(evidence.sealed, drained(evidence, groups))
