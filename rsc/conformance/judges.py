"""What the conformance scenarios judge with: the verdict (`Failed`, `expect`), the waits
they allow a client, and the judgements they share (joined, handled, nothing pending, a clean
history, no fence of a kind)."""

from __future__ import annotations

import time

import attrs

from rsc.conformance.harness import LEASE_MS, Harness, now, wait_for
from rsc.conformance.history import check

LEASE_S = LEASE_MS / 1000
#: How long a client may take to start and join, and handling may take to catch up.
JOIN_S, CATCH_UP_S = 20.0, 30.0
#: How long a running producer may take to answer a change (a pause, a coordinator come back):
#: 40 heartbeat intervals.
QUIESCE_S = 8.0


class Failed(Exception):
    """A scenario's verdict: the rule it broke and why."""


def expect(condition: bool, rule: str, reason: str) -> None:
    if not condition:
        raise Failed(f"{rule}: {reason}")


def joined(h: Harness, members: int, what: str, rule: str = "M1") -> None:
    expect(wait_for(lambda: h.settled(members), JOIN_S, 0.1), rule, f"{what}: the group never settled")


def handled_all(h: Harness, mids: list[str], rule: str = "M9") -> None:
    wait_for(lambda: set(mids) <= h.ended(), CATCH_UP_S, 0.1)
    missing = set(mids) - h.ended()
    expect(
        not missing,
        rule,
        f"{len(missing)} of {len(mids)} published messages never handled (e.g. {sorted(missing)[:3]})",
    )


def no_pending(h: Harness, rule: str = "M9") -> None:
    ok = wait_for(lambda: h.pending() == 0, CATCH_UP_S, 0.2)
    expect(ok, rule, f"{h.pending()} entries left pending (delivered, never acknowledged)")


def history_clean(h: Harness, rules: str = "M4/M5/M10", journal: bool = True) -> None:
    """The history checker over the client's records, the publishes, the faults and the
    ownership the group's journal shows. Without `journal` (Redis lost it) ownership is not
    judged: only lost messages and overlapping handler calls."""
    report = check(h.records(), h.publishes, h.faults, h.ownership() if journal else [])
    if not journal:
        report = attrs.evolve(report, stale_starts=())
    problems = report.problems(examples=2)
    expect(not problems, rules, "; ".join(p.replace("\n", " ") for p in problems))


def no_fence(h: Harness, reasons: tuple[str, ...], rule: str) -> None:
    bad = [f for f in h.fences() if f.get("reason") in reasons]
    expect(not bad, rule, f"fenced: {[(f['memberId'], f['reason']) for f in bad]}")


def steady_publish(h: Harness, seconds: float, per_second: int = 100) -> list[str]:
    """Publish in small batches for `seconds`; the mids."""
    mids: list[str] = []
    end = now() + seconds
    while now() < end:
        mids += h.publish(per_second // 10)
        time.sleep(0.1)
    return mids
