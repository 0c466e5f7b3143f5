"""Retention: how long a stream's shard keys keep their entries, and what a group loses.

A stream's policy (`Retention`, the stream spec's `retention`, feature level 5) says what the
coordinator trims from each readable shard key on its schedule (`rsc.actors.retention`,
through `coordinator/trim.lua`, which applies the rules below inside Redis, atomically with
the `XTRIM`):

* `keep: acknowledged` removes an entry once every consumer group on the key has
  acknowledged it. A group's **watermark** on a shard is the lowest of its oldest pending id
  and the first id after its last-delivered id: every entry below it was delivered to the
  group and acknowledged. The shard's cut is the lowest watermark of the groups that *hold*
  (every group on the key but those released: no member for `inactiveGroupMs`). A key with
  no group at all keeps its entries (what is published before the first group waits for
  it); a key whose every group is released keeps nothing back for them.
* `keep: all` keeps everything the limits allow (the behaviour before retention).
* `maxAgeMs` removes every entry older than `now - maxAgeMs` (an id carries its time).
* `maxEntriesPerShard` with `whenFull: drop-oldest` removes the oldest entries beyond the cap;
  with `whenFull: refuse` producers' appends to a full shard are refused (`append.lua`) and
  nothing unread is removed for it.

An entry removed before a group acknowledged it is **lost for that group**: never delivered
(above its last-delivered id) or delivered and still pending. `lost_for` counts it, per
group; the script counts the same way when it removes the entries, and acknowledges the
removed pending ids (so the next trim does not count them again).

Ids are `(ms, seq)` tuples here; the script compares the same order.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

import attrs

from rsc.events.model import wire_field

#: A stream entry id: (milliseconds, sequence).
EntryId = tuple[int, int]

#: The longest age or idle time a policy may name: 100 years, in ms (JSON-safe).
MAX_RETENTION_MS = 100 * 365 * 24 * 3600 * 1000
#: The most entries a shard's cap may be (Redis counts in 64 bits; JSON's safe integers).
MAX_ENTRIES = 2**53 - 1
#: Dead-letter streams are capped by default (each shard's `:dlq`, oldest dropped first).
DEFAULT_DEAD_LETTER_MAX = 10_000


class Keep(enum.Enum):
    """What the coordinator keeps of a stream's entries besides the limits."""

    ACKNOWLEDGED = "acknowledged"
    ALL = "all"


class WhenFull(enum.Enum):
    """What a full shard (`maxEntriesPerShard`) does."""

    DROP_OLDEST = "drop-oldest"
    REFUSE = "refuse"


@attrs.frozen
class Retention:
    """A stream's retention policy (`retention` in the stream spec; feature level 5).

    Numbers are positive or null (no limit)."""

    keep: Keep = Keep.ACKNOWLEDGED
    max_age_ms: int | None = wire_field(None, minimum=1, maximum=MAX_RETENTION_MS, nullable=True)
    max_entries_per_shard: int | None = wire_field(None, minimum=1, maximum=MAX_ENTRIES, nullable=True)
    when_full: WhenFull = WhenFull.DROP_OLDEST
    #: How long a group with no member keeps holding the watermark (null: for ever).
    inactive_group_ms: int | None = wire_field(None, minimum=1, maximum=MAX_RETENTION_MS, nullable=True)
    #: Each shard's dead-letter stream keeps at most this many (oldest dropped; null: all).
    dead_letter_max_entries: int | None = wire_field(
        DEFAULT_DEAD_LETTER_MAX, minimum=1, maximum=MAX_ENTRIES, nullable=True
    )

    @property
    def refuses(self) -> bool:
        """Whether producers' appends to a full shard are refused (the cap is in Redis)."""
        return self.max_entries_per_shard is not None and self.when_full is WhenFull.REFUSE

    @property
    def trims(self) -> bool:
        """Whether the coordinator ever removes entries of the shard keys under it."""
        dropping = self.max_entries_per_shard is not None and self.when_full is WhenFull.DROP_OLDEST
        return self.keep is Keep.ACKNOWLEDGED or self.max_age_ms is not None or dropping


#: What a stream created before retention (or below its feature level) keeps: everything.
KEEP_ALL = Retention(keep=Keep.ALL, dead_letter_max_entries=None)


@attrs.frozen
class GroupPosition:
    """One consumer group on one shard key, as the trim reads it: its last-delivered id, its
    oldest pending id (None: nothing pending), and whether it holds the watermark."""

    name: str
    last_delivered: EntryId
    oldest_pending: EntryId | None = None
    holds: bool = True

    @property
    def watermark(self) -> EntryId:
        """The lowest id the group has not acknowledged (or not been delivered)."""
        after = next_id(self.last_delivered)
        if self.oldest_pending is not None and self.oldest_pending < after:
            return self.oldest_pending
        return after


def next_id(entry: EntryId) -> EntryId:
    """The smallest id above `entry`."""
    ms, seq = entry
    return (ms + 1, 0) if seq >= 2**64 - 1 else (ms, seq + 1)


def cut(
    policy: Retention, groups: Sequence[GroupPosition], now_ms: int, end: EntryId | None
) -> EntryId | None:
    """The lowest id a shard keeps by age and acknowledgement (every entry below it goes);
    None: nothing goes for them. `end` is the id after the key's last entry (None: empty).

    The entry cap is applied after this (`removed`)."""
    cuts: list[EntryId] = []
    if policy.max_age_ms is not None and now_ms - policy.max_age_ms > 0:
        cuts.append((now_ms - policy.max_age_ms, 0))
    if policy.keep is Keep.ACKNOWLEDGED and groups and end is not None:
        holding = [g.watermark for g in groups if g.holds]
        cuts.append(min(holding) if holding else end)
    return max(cuts) if cuts else None


def removed(
    policy: Retention, entries: Sequence[EntryId], groups: Sequence[GroupPosition], now_ms: int
) -> list[EntryId]:
    """The entries (ids, oldest first, a whole key) the policy removes now: those below `cut`,
    then, with `drop-oldest`, the oldest beyond `maxEntriesPerShard`."""
    end = next_id(entries[-1]) if entries else None
    below = cut(policy, groups, now_ms, end)
    gone = [e for e in entries if below is not None and e < below]
    cap = policy.max_entries_per_shard
    if cap is not None and policy.when_full is WhenFull.DROP_OLDEST and len(entries) - len(gone) > cap:
        gone = list(entries[: len(entries) - cap])
    return gone


def lost_for(gone: Iterable[EntryId], group: GroupPosition, pending: Iterable[EntryId]) -> int:
    """How many of the removed entries `gone` the group loses: those above its last-delivered
    id (never delivered) and those it holds pending (delivered, not acknowledged)."""
    gone_set = set(gone)
    unseen = sum(1 for e in gone_set if e > group.last_delivered)
    return unseen + sum(1 for p in set(pending) if p in gone_set and p <= group.last_delivered)


def lossless(groups: Sequence[GroupPosition], below: EntryId) -> bool:
    """Whether removing every entry below `below` loses nothing for any group on the key
    (then the trim may take whole macro nodes, `XTRIM ... ~`, and count nothing)."""
    return all(below <= g.watermark for g in groups)
