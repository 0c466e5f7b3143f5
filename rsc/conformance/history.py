"""The history checker of the chaos suite and the conformance kit: pure functions over what
the processes recorded (a client under test writes the same records, docs/clients.md).

Inputs (no I/O here; the caller reads the files and Redis):

* handler records (`Record`): "start", then "end" or "abort", per handler
  call, from every worker process (`tests/chaos/chaosapp.py`);
* the producers' publishes (`Publish`): "ack" with the entry id, or "fail";
* the harness's fault log (`Fault`): SIGSTOP / SIGCONT / SIGKILL per pid;
* ownership (`Ownership`): shard installs and releases from the group's
  journal (`ownership_from_journal`).

Every time is `CLOCK_MONOTONIC` in seconds (journal times are mapped onto it
with the offset `time.time() - clock_gettime(CLOCK_MONOTONIC)`).

Properties (`check` reports each; `Report.problems` says which failed):

a. no acknowledged publish is lost: each acked entry has an "end" record;
c. no two handler calls on one stream key overlap in time (a call in flight
   when its process was SIGSTOPped counts until the stop; a call without an
   end counts until its process was killed, else forever);
d. no handler starts on a shard after ownership moved away from its member
   (installed to another member, or released by it) and before it was
   installed to that member again;
e. per stream key, the first handlings of entries (redeliveries of an entry
   already handled aside), in order of their start, are in entry-id order.

(b, nothing pending at the end, is checked in Redis by the test.)
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

#: Journal times are whole milliseconds of Redis's clock: an ownership change counts against a
#: start only when it happened at least this long before it (and a gain this long after).
TOLERANCE_S = 0.005


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id as the pair of integers it is ordered by."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@attrs.frozen
class Record:
    """One line of a worker's record file."""

    ev: str  # "start", then "end" or "abort"; other events (a "block" note) are ignored
    pid: int
    member: str
    shard: int
    key: str
    id: str
    t: float
    mid: str | None = None
    bkey: str | None = None
    seq: str | None = None
    deliveries: int = 1

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Record:
        return cls(
            ev=data["ev"],
            pid=int(data["pid"]),
            member=data["member"],
            shard=int(data["shard"]),
            key=data["key"],
            id=data["id"],
            t=float(data["t"]),
            mid=data.get("mid"),
            bkey=data.get("bkey"),
            seq=data.get("seq"),
            deliveries=int(data.get("deliveries", 1)),
        )


@attrs.frozen
class Publish:
    """One line of a producer's file: an acknowledged ("ack") or failed ("fail") publish."""

    ev: str
    mid: str
    t: float
    id: str | None = None
    key: str | None = None  # the route at publish time (advisory: the layout may change meanwhile)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Publish:
        return cls(data["ev"], data["mid"], float(data["t"]), data.get("id"), data.get("key"))


@attrs.frozen
class Fault:
    pid: int
    kind: str  # "STOP" (the process was seen stopped), "CONT" (about to resume), "KILL" (seen dead)
    t: float


@attrs.frozen
class Ownership:
    shard: int
    member: str
    kind: str  # "install" or "release"
    t: float


def ownership_from_journal(entries: Iterable[tuple[str, str, str]], offset: float) -> list[Ownership]:
    """Installs and releases from a group journal's (entry id, kind, data) triples.

    The entry id's milliseconds are Redis's wall clock; `offset` is `time.time() -
    clock_gettime(CLOCK_MONOTONIC)` on the same host.
    """
    kinds = {"ShardsInstalled": "install", "ShardsReleased": "release"}
    events = []
    for entry_id, kind, data in entries:
        if kind not in kinds:
            continue
        body = json.loads(data)
        t = entry_key(entry_id)[0] / 1000 - offset
        events += [Ownership(int(s), body["memberId"], kinds[kind], t) for s in body["shards"]]
    return events


@attrs.frozen
class Interval:
    """One handler call: from its start to its end as the properties count it."""

    pid: int
    member: str
    shard: int
    key: str
    id: str
    start: float
    end: float
    how: str  # "end", "abort", "stopped" (cut at SIGSTOP), "killed" (no end: SIGKILL), "open"


@attrs.frozen
class Overlap:
    key: str
    first: Interval
    second: Interval

    def __str__(self) -> str:
        a, b = self.first, self.second
        seconds = min(a.end, b.end) - b.start
        return (
            f"{self.key}: {a.member} (pid {a.pid}) {a.id} [{a.start:.3f}, {a.end:.3f} {a.how}] and "
            f"{b.member} (pid {b.pid}) {b.id} [{b.start:.3f}, {b.end:.3f} {b.how}] overlap {seconds:.3f} s"
        )


@attrs.frozen
class StaleStart:
    record: Record
    owner: str | None  # who held the shard by the journal at that time (None: nobody)
    moved_at: float | None  # when it moved away from the record's member (None: never had it)

    def __str__(self) -> str:
        r = self.record
        since = (
            "it never held the shard"
            if self.moved_at is None
            else f"moved {r.t - self.moved_at:.3f} s before"
        )
        return f"{r.member} (pid {r.pid}) started {r.key} {r.id} at {r.t:.3f}; owner {self.owner}, {since}"


@attrs.frozen
class OrderViolation:
    key: str
    earlier: Record  # the first handling of a higher id, started before...
    later: Record  # ...the first handling of this lower id

    def __str__(self) -> str:
        a, b = self.earlier, self.later
        return (
            f"{self.key}: {b.id} (by {b.member} at {b.t:.3f}) first handled after {a.id} "
            f"(by {a.member} at {a.t:.3f})"
        )


@attrs.frozen
class Report:
    published: int  # acknowledged publishes
    failed_publishes: int
    handled: int  # distinct entries with an "end" record
    calls: int  # handler calls (start records)
    duplicates: int  # calls beyond one per entry
    open_calls: int  # calls with no end, abort or kill to close them
    max_deliveries: int  # the highest delivery count a handler saw
    overlaps: tuple[Overlap, ...]
    stale_starts: tuple[StaleStart, ...]
    order_violations: tuple[OrderViolation, ...]
    lost: tuple[Publish, ...]
    #: Messages (by `mid`) found under more than one entry id: appended twice by a producer
    #: (a retry after a lost reply, without idempotence); one per extra entry.
    producer_duplicates: tuple[str, ...] = ()

    def figures(self) -> dict[str, int]:
        return {
            "published": self.published,
            "failed publishes": self.failed_publishes,
            "handled": self.handled,
            "handler calls": self.calls,
            "duplicates": self.duplicates,
            "open calls": self.open_calls,
            "max deliveries": self.max_deliveries,
            "overlaps": len(self.overlaps),
            "stale starts": len(self.stale_starts),
            "order violations": len(self.order_violations),
            "lost": len(self.lost),
            "producer duplicates": len(self.producer_duplicates),
        }

    def problems(self, examples: int = 5) -> list[str]:
        """One paragraph per violated property, with up to `examples` instances each."""
        out = []
        for name, found in (
            ("a. acknowledged publishes never handled", self.lost),
            ("c. overlapping handler calls on one shard", self.overlaps),
            ("d. handler starts after the shard moved away", self.stale_starts),
            ("e. first handlings out of entry-id order", self.order_violations),
            ("f. messages a producer appended twice", self.producer_duplicates),
        ):
            if found:
                lines = [f"{name}: {len(found)}"]
                lines += [f"    {item}" for item in found[:examples]]
                out.append("\n".join(lines))
        return out

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.overlaps
            or self.stale_starts
            or self.order_violations
            or self.producer_duplicates
        )


def intervals(records: Sequence[Record], faults: Sequence[Fault]) -> list[Interval]:
    """Each handler call with the end the properties count (see the module doc)."""
    stops: dict[int, list[float]] = defaultdict(list)
    kills: dict[int, list[float]] = defaultdict(list)
    for fault in faults:
        if fault.kind == "STOP":
            stops[fault.pid].append(fault.t)
        elif fault.kind == "KILL":
            kills[fault.pid].append(fault.t)
    calls: dict[tuple[int, str, str, str], list[Record]] = defaultdict(list)
    for r in records:
        calls[(r.pid, r.member, r.key, r.id)].append(r)
    out = []
    for same in calls.values():
        opened: list[Record] = []
        closed: list[tuple[Record, float, str]] = []
        for r in sorted(same, key=lambda r: (r.t, r.ev != "start")):
            if r.ev == "start":
                opened.append(r)
            elif r.ev in ("end", "abort") and opened:
                closed.append((opened.pop(0), r.t, r.ev))
        closed += [(r, math.inf, "open") for r in opened]
        for start, closed_at, closed_how in closed:
            end, how = closed_at, closed_how
            if how == "open":
                killed = [t for t in kills[start.pid] if t >= start.t]
                if killed:
                    end, how = min(killed), "killed"
            stopped = [t for t in stops[start.pid] if start.t <= t < end]
            if stopped:
                end, how = min(stopped), "stopped"
            out.append(Interval(start.pid, start.member, start.shard, start.key, start.id, start.t, end, how))
    return out


def overlaps(calls: Sequence[Interval]) -> list[Overlap]:
    """Every pair of calls on one stream key whose intervals intersect."""
    by_key: dict[str, list[Interval]] = defaultdict(list)
    for call in calls:
        by_key[call.key].append(call)
    found = []
    for key, same in sorted(by_key.items()):
        active: list[Interval] = []
        for call in sorted(same, key=lambda c: (c.start, c.end)):
            active = [a for a in active if a.end > call.start]
            found += [Overlap(key, a, call) for a in active]
            active.append(call)
    return found


def stale_starts(
    records: Sequence[Record], ownership: Sequence[Ownership], tolerance_s: float = TOLERANCE_S
) -> list[StaleStart]:
    """Starts by a member on a shard it did not hold by the journal (property d)."""
    by_shard: dict[int, list[Ownership]] = defaultdict(list)
    for event in sorted(ownership, key=lambda e: e.t):
        by_shard[event.shard].append(event)
    found = []
    for r in records:
        if r.ev != "start":
            continue
        gained: float | None = None
        lost: float | None = None
        owner: str | None = None
        for event in by_shard[r.shard]:
            if event.kind == "install" and event.member == r.member and event.t - tolerance_s <= r.t:
                gained = event.t
            elif event.t + tolerance_s <= r.t and (
                (event.kind == "install" and event.member != r.member)
                or (event.kind == "release" and event.member == r.member)
            ):
                lost = event.t
            if event.t <= r.t:
                owner = event.member if event.kind == "install" else None
        if gained is None or (lost is not None and lost > gained):
            found.append(StaleStart(r, owner, None if gained is None else lost))
    return found


def order_violations(records: Sequence[Record]) -> list[OrderViolation]:
    """Per stream key, first handlings (by start time) that come after a higher entry id's."""
    first: dict[tuple[str, str], Record] = {}
    for r in records:
        if r.ev == "start" and ((r.key, r.id) not in first or r.t < first[(r.key, r.id)].t):
            first[(r.key, r.id)] = r
    by_key: dict[str, list[Record]] = defaultdict(list)
    for (key, _), r in first.items():
        by_key[key].append(r)
    found = []
    for key, starts in sorted(by_key.items()):
        highest: Record | None = None
        for r in sorted(starts, key=lambda r: r.t):
            if highest is not None and entry_key(r.id) < entry_key(highest.id):
                found.append(OrderViolation(key, highest, r))
            elif highest is None or entry_key(r.id) > entry_key(highest.id):
                highest = r
    return found


def check(
    records: Sequence[Record],
    publishes: Sequence[Publish],
    faults: Sequence[Fault],
    ownership: Sequence[Ownership],
    tolerance_s: float = TOLERANCE_S,
) -> Report:
    acked = [p for p in publishes if p.ev == "ack"]
    done = {(r.id, r.mid) for r in records if r.ev == "end"}
    starts = [r for r in records if r.ev == "start"]
    calls = intervals(records, faults)
    return Report(
        published=len(acked),
        failed_publishes=sum(p.ev == "fail" for p in publishes),
        handled=len({(r.key, r.id) for r in records if r.ev == "end"}),
        calls=len(starts),
        duplicates=len(starts) - len({(r.key, r.id) for r in starts}),
        open_calls=sum(c.how == "open" for c in calls),
        max_deliveries=max((r.deliveries for r in starts), default=0),
        overlaps=tuple(overlaps(calls)),
        stale_starts=tuple(stale_starts(records, ownership, tolerance_s)),
        order_violations=tuple(order_violations(records)),
        lost=tuple(p for p in acked if (p.id, p.mid) not in done),
        producer_duplicates=appended_twice(records),
    )


def appended_twice(records: Sequence[Record]) -> tuple[str, ...]:
    """The messages (`mid`) handled under more than one entry id, once per extra entry: a
    producer appended them more than once."""
    entries: dict[str, set[tuple[int, str]]] = {}
    for r in records:
        if r.mid:
            entries.setdefault(r.mid, set()).add((r.shard, r.id))
    return tuple(
        f"{mid} as {' and '.join(f'shard {shard} {entry}' for shard, entry in sorted(found))}"
        for mid, found in sorted(entries.items())
        if len(found) > 1
    )
