"""Steady heartbeats parsed and answered once: the batch path's memo of each member's last item.

A fleet at rest sends the same heartbeat over and over: a member that owns its shards and has
nothing to report repeats its epoch, metadata version and owned shards byte for byte, and its
group's state does not change (a lease renewal is not a state change). For such an item the
batch path (`rsc.http.heartbeats.routes`) would parse, check and render exactly what it did a
heartbeat ago. `SteadyHeartbeats` keeps, per member, what that cost the last time:

* the item's JSON as orjson writes it (an exact form: `1`, `1.0` and `true` differ), the
  parsed request, and its rate-limit key without the caller's name
  (`heartbeat_rules.member_key_suffix`) — all of it a pure function of the item, so an
  identical item reuses them (`parsed`); only an item that passed every check of the body and
  that its group accepted (not refused, not rejected) is remembered (`remember`), only a
  member already in its group (epoch above 0: a join carries its caller's quota, a leave is
  never repeated), and only an item of at most `MAX_ITEM_BYTES`;
* an item that differs from the member's last in its `memberEpoch` alone (a storm's quiet
  member, moved by a target that kept its shards) is not parsed either: the remembered
  request with the new epoch (`epoch_moved`); it is checked and remembered as a new item;
* the answer rendered for it (as its JSON, `rsc.http.json_io.EncodedJSON`) with the group
  state and feature level it was rendered from. `rsc.events.respond` reads nothing of the
  command but its member id, epoch and metadata version, which the item fixes, so the same
  item against the very same state object (a weak reference: a state that changed is gone)
  at the same level is answered the same (`answer`, `keep_answer`). A refused heartbeat or a
  long poll is never answered from here.

What is never skipped: authorization (once per stream per batch, as before), the caller's and
the member's rate limits, the quota, the decision itself (the lease renewal goes to the
group's actor as always). The memo holds one entry per member (the last item it sent, about
1.3 KB with its answer) and at most `limit` entries, in two generations: when the current one
is full it becomes the older one and the one before is dropped, so members that left do not
pile up; an entry found in the older one moves to the current one.
"""

from __future__ import annotations

import weakref
from typing import Any

import attrs
import orjson

from rsc.events.model import MAX_COUNTER
from rsc.events.wire import HeartbeatRequest
from rsc.http.json_io import EncodedJSON, dump_json

#: Members remembered at most (about 1.3 KB each), in two generations of half as many.
DEFAULT_LIMIT = 1 << 17
#: The largest item, and answer, remembered (a member reporting a few hundred shards): what
#: is larger is parsed and rendered each time, so that no entry holds megabytes.
MAX_ITEM_BYTES = 4096


class Remembered:
    """One member's last item: its JSON, the request parsed from it and its rate-limit key's
    suffix; and the answer last rendered for it, from which state, at which level."""

    __slots__ = ("answer", "body", "key_suffix", "level", "state", "text")

    def __init__(self, text: bytes, body: HeartbeatRequest, key_suffix: str) -> None:
        self.text = text
        self.body = body
        self.key_suffix = key_suffix
        self.answer: EncodedJSON | None = None
        self.state: weakref.ref[Any] | None = None
        self.level = 0


#: Where a member's item is remembered: its stream prefix, group and member id.
Slot = tuple[str, str, str]


class SteadyHeartbeats:
    """The memo (see the module)."""

    def __init__(self, limit: int | None = None) -> None:
        #: At most this many members remembered (0: none, nothing is remembered), in two
        #: generations of half as many each.
        self.limit = DEFAULT_LIMIT if limit is None else limit
        self._items: dict[Slot, Remembered] = {}
        #: The generation before: found there, an entry moves to the current one.
        self._older: dict[Slot, Remembered] = {}
        #: Items found unchanged and answers reused (for tests and benchmarks).
        self.parse_hits = 0
        self.answer_hits = 0
        #: Items found unchanged but for their epoch (`epoch_moved`).
        self.epoch_hits = 0

    def __len__(self) -> int:
        return len(self._items) + len(self._older)

    def parsed(self, raw: dict[str, Any]) -> tuple[Slot | None, bytes, Remembered | None]:
        """Where `raw` (one item of a batch, a JSON object) would be remembered, its exact JSON,
        and what was remembered for it if the member's last item was the same. `(None, b"",
        None)` for an item without string names or that orjson cannot write: never remembered.
        Raises nothing."""
        stream, group, member = raw.get("streamPrefix"), raw.get("consumerGroup"), raw.get("memberId")
        if type(stream) is not str or type(group) is not str or type(member) is not str:
            return None, b"", None
        try:
            text = orjson.dumps(raw)
        except TypeError:  # (an integer past 64 bits: parsed the long way each time)
            return None, b"", None
        if len(text) > MAX_ITEM_BYTES:
            return None, b"", None
        slot = (stream, group, member)
        known = self._items.get(slot)
        if known is None and (known := self._older.pop(slot, None)) is not None:
            self._keep(slot, known)
        if known is not None and known.text == text:
            self.parse_hits += 1
            return slot, text, known
        return slot, text, None

    def epoch_moved(self, slot: Slot, raw: dict[str, Any], text: bytes) -> HeartbeatRequest | None:
        """The request parsed from `raw` (its exact JSON `text`), from what was remembered for
        the member at `slot`, if `raw` differs from that item in its `memberEpoch` alone and
        that is a member's epoch (an integer from 1 to `MAX_COUNTER`); else None, and it is
        parsed the long way.

        A storm moves every member's epoch (a quiet member learns a new one from each target
        that keeps its shards) and nothing else of its item: such an item is parsed afresh on
        every heartbeat otherwise, about half of what a batch's items cost. Comparing the JSON
        with the remembered one's, the old epoch written as the new, is exact: the top-level
        key is unique, and one written inside a string is escaped (`\\"`). What the long way
        checks after parsing (`validate_heartbeat`, the rate limits) still runs."""
        known = self._items.get(slot)
        epoch = raw.get("memberEpoch")
        if known is None or type(epoch) is not int or not 0 < epoch <= MAX_COUNTER:
            return None
        before = known.body.member_epoch
        if epoch == before or before <= 0:
            return None
        if known.text.replace(b'"memberEpoch":%d' % before, b'"memberEpoch":%d' % epoch, 1) != text:
            return None
        self.epoch_hits += 1
        return attrs.evolve(known.body, member_epoch=epoch)

    def key_suffix(self, slot: Slot, incarnation: str) -> str | None:
        """The rate-limit key suffix remembered for the member at `slot` if its last item named
        `incarnation` too (then it is this item's: a pure function of the names, which passed
        their checks then), else None. A reconciling member's item differs from its last one
        (a new epoch) but not in these."""
        known = self._items.get(slot)
        if known is None or known.body.incarnation != incarnation:
            return None
        return known.key_suffix

    def remember(self, slot: Slot, text: bytes, key_suffix: str, body: HeartbeatRequest) -> Remembered | None:
        """Remember the item `text` of a member in its group, parsed as `body`: every check of
        the body passed and its group accepted it (not refused, not rejected); None (nothing
        remembered) for a join or a leave."""
        if body.member_epoch <= 0 or self.limit <= 0:
            return None
        # (a copy: orjson's own bytes keep the whole buffer it wrote them in, 4 KB)
        known = Remembered(bytes(memoryview(text)), body, key_suffix)
        self._keep(slot, known)
        return known

    def _keep(self, slot: Slot, known: Remembered) -> None:
        if len(self._items) >= max(1, self.limit // 2) and slot not in self._items:
            # a new generation: members not heard since the one before are forgotten (members
            # that left do not pile up, and no single pass frees the whole memo)
            self._older, self._items = self._items, {}
        self._items[slot] = known

    def answer(self, known: Remembered, state: Any, level: int) -> EncodedJSON | None:
        """The answer rendered for `known`'s item from this very `state` at `level`, if any."""
        ref = known.state
        if known.answer is None or ref is None or known.level != level or ref() is not state:
            return None
        self.answer_hits += 1
        return known.answer

    def keep_answer(self, known: Remembered, state: Any, level: int, answer: Any) -> EncodedJSON:
        """Keep `answer` (plain JSON), rendered for `known`'s item from `state` at `level`, as its
        JSON (not one over `MAX_ITEM_BYTES`, such as an answer carrying a whole layout); that
        JSON."""
        encoded = EncodedJSON(bytes(memoryview(dump_json(answer))))  # (a copy: see `remember`)
        if len(encoded.text) <= MAX_ITEM_BYTES:
            known.answer, known.state, known.level = encoded, weakref.ref(state), level
        return encoded
