"""The conformance kit's scenarios: each drives the client under test through one situation
and judges it by the protocol rules it names (docs/protocol.md, "Client rules").

A scenario never trusts the client's own records alone: a record says when a handler call ran,
and the kit also checks Redis (pending entries) and the group's journal (who owned which shard
when, who was fenced and why), with `rsc.conformance.history.check` over all of it.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from rsc.conformance.harness import (
    MEMBER_TOKEN,
    PRODUCER_TOKEN,
    REVOKE_TIMEOUT_MS,
    Harness,
    free_port,
    harness,
    now,
    wait_for,
)
from rsc.conformance.history import Fault
from rsc.conformance.judges import (
    CATCH_UP_S,
    JOIN_S,
    LEASE_S,
    QUIESCE_S,
    Failed,
    expect,
    handled_all,
    history_clean,
    joined,
    no_fence,
    no_pending,
    steady_publish,
)
from rsc.conformance.producer_scenarios import producer_cut_replies, producer_rules


@attrs.frozen
class Scenario:
    name: str
    rules: tuple[str, ...]
    summary: str
    run: Callable[[Harness], None]


@attrs.frozen
class Outcome:
    scenario: Scenario
    passed: bool
    reason: str
    seconds: float


# -- the scenarios ---------------------------------------------------------------------------


def join_and_handle(h: Harness) -> None:
    h.start_client()
    joined(h, 1, "one member")
    mids = h.publish(200)
    handled_all(h, mids)
    no_pending(h)
    history_clean(h)


def graceful_leave(h: Harness) -> None:
    client = h.start_client()
    joined(h, 1, "one member")
    handled_all(h, h.publish(50))
    client.signal(signal.SIGTERM)
    code = client.wait(REVOKE_TIMEOUT_MS / 1000 + 10)
    expect(code == 0, "M14", f"SIGTERM: exit code {code} (expected 0; stderr: {client.stderr_tail()})")
    left = wait_for(lambda: not (h.group_view() or {}).get("members"), 5)
    expect(left, "M14", "the member is still in the group after its process exited (no leave heartbeat)")
    no_fence(h, ("LEASE_EXPIRED", "REVOKE_TIMEOUT"), "M14")
    no_pending(h)


def scale_out_revoke(h: Harness) -> None:
    h.start_client(RSC_HANDLER_MS="50")
    joined(h, 1, "the first member")
    mids = h.publish(100)
    h.start_client(RSC_HANDLER_MS="50")
    mids += steady_publish(h, 2.0)
    joined(h, 2, "after a second member joined", "M6")
    mids += h.publish(100)
    handled_all(h, mids)
    no_fence(h, ("REVOKE_TIMEOUT", "LEASE_EXPIRED"), "M6")
    no_fence(h, ("STALE_EPOCH",), "M2")
    counts = [len(v) for v in h.owners().values()]
    expect(sorted(counts) == [2, 2], "M6", f"shards not balanced after the handoff: {counts}")
    no_pending(h)
    history_clean(h, "M6/M10")


def lease_expiry(h: Harness) -> None:
    first = h.start_client(RSC_HANDLER_MS="20")
    joined(h, 1, "the first member")
    h.start_client(RSC_HANDLER_MS="20")
    joined(h, 2, "two members")
    mids = h.publish(300)
    handling = wait_for(lambda: any(r.pid == first.pid for r in h.records()), 10)
    expect(handling, "M5", "the first member handled nothing within 10 s: nothing to stop it in")
    first.signal(signal.SIGSTOP)
    h.faults.append(_fault(first.pid, "STOP"))
    # the lease ends, its shards move to the other member, which handles on
    mids += h.publish(100)
    moved = wait_for(lambda: len(h.owners()) == 1 and h.settled(1), LEASE_S * 4 + 5, 0.1)
    expect(moved, "M5", "the stopped member's shards did not move after its lease ended")
    h.faults.append(_fault(first.pid, "CONT"))
    first.signal(signal.SIGCONT)
    mids += steady_publish(h, 2.0)
    handled_all(h, mids)
    joined(h, 2, "the resumed member rejoins", "M7")
    no_pending(h)
    history_clean(h, "M5/M7")


def kill_and_reclaim(h: Harness) -> None:
    first = h.start_client(RSC_HANDLER_MS="200")
    joined(h, 1, "one member")
    mids = h.publish(100)
    expect(wait_for(lambda: any(r.ev == "start" for r in first.records), 10), "M9", "nothing was handled")
    h.kill(first)
    h.start_client(RSC_HANDLER_MS="5")
    joined(h, 1, "the restarted process", "M7")
    mids += h.publish(50)
    handled_all(h, mids)
    no_pending(h)
    history_clean(h, "M9/M10")


def coordinator_restart(h: Harness) -> None:
    client = h.start_client(RSC_HANDLER_MS="10")
    joined(h, 1, "one member")
    mids = h.publish(100)
    h.kill_coordinator()
    time.sleep(LEASE_S / 4)
    h.start_coordinator()
    mids += h.publish(100)
    handled_all(h, mids, "M12")
    expect(
        client.alive(), "M12", f"the client exited while the coordinator restarted: {client.stderr_tail()}"
    )
    joined(h, 1, "after the restart", "M12")
    no_pending(h)
    history_clean(h, "M12")


def bad_credential(h: Harness) -> None:
    client = h.start_client(RSC_TOKEN="not-" + MEMBER_TOKEN)
    code = client.wait(15)
    expect(code is not None, "M11", "a refused credential did not end the client within 15 s")
    expect(code != 0, "M11", "a refused credential ended the client with exit code 0")
    expect(not (h.group_view() or {}).get("members"), "M11", "a member joined with a refused credential")


def quota_exceeded(h: Harness) -> None:
    h.kill_coordinator()
    h.start_coordinator(RSC_QUOTA_MEMBERS_PER_GROUP="1")
    first = h.start_client()
    joined(h, 1, "the first member")
    second = h.start_client()
    mids = h.publish(100)
    time.sleep(3 * LEASE_S)
    expect(second.alive(), "M13", f"429 QUOTA_EXCEEDED ended the client: {second.stderr_tail()}")
    expect(first.alive(), "M13", "the first member died")
    handled_all(h, mids, "M13")
    first.signal(signal.SIGTERM)
    first.wait(15)
    joined(h, 1, "the waiting client joins once a place is free", "M13")
    mids = h.publish(50)
    handled_all(h, mids, "M13")
    history_clean(h, "M13")


def redis_loses_data(h: Harness) -> None:
    client = h.start_client(RSC_HANDLER_MS="5")
    joined(h, 1, "one member")
    handled_all(h, h.publish(100))
    h.redis.stop()
    h.redis.start()  # no persistence: everything is gone
    # the producer recreates what it routes to; the coordinator writes back what it holds
    handled_all(h, h.publish(100), "M16")
    expect(client.alive(), "M16", f"the client exited: {client.stderr_tail()}")
    history_clean(h, "M16", journal=False)


def static_takeover(h: Harness) -> None:
    old = h.start_client(RSC_STATIC="1", RSC_MEMBER_ID="static-a")
    joined(h, 1, "a static member")
    handled_all(h, h.publish(50))
    new = h.start_client(RSC_STATIC="1", RSC_MEMBER_ID="static-a")
    code = old.wait(JOIN_S)
    expect(code is not None, "M15", "the replaced process did not exit (FENCED REPLACED: stop for good)")
    mids = h.publish(100)
    handled_all(h, mids, "M15")
    expect(new.alive(), "M15", f"the new incarnation exited: {new.stderr_tail()}")
    expect(
        all(r.pid == new.pid for r in h.records() if r.mid in set(mids) and r.ev == "start"),
        "M15",
        "the replaced process handled entries after its replacement joined",
    )
    history_clean(h, "M15")


def standby_failover(h: Harness) -> None:
    standby = free_port()
    h.start_coordinator(standby, standby=True)
    # the standby first: the client must get past its 503 STANDBY to the active one
    client = h.start_client(RSC_COORDINATOR_URL=f"http://127.0.0.1:{standby},{h.url}", RSC_HANDLER_MS="5")
    joined(h, 1, "one member, past a standby", "M12")
    mids = h.publish(100)
    h.kill_coordinator()
    h.use(standby)
    taken = wait_for(lambda: h.http.get("/readyz").status_code == 200, 20, 0.1)
    expect(taken, "M12", "kit: the standby did not take over")
    mids += h.publish(100)
    handled_all(h, mids, "M12")
    expect(client.alive(), "M12", f"the client exited during the failover: {client.stderr_tail()}")
    no_fence(h, ("LEASE_EXPIRED",), "M12")
    joined(h, 1, "after the failover", "M12")
    history_clean(h, "M12")


def older_copy(h: Harness) -> None:
    """Redis comes back from a copy older than the layout the client knows (4 shards where it
    read and wrote 6). Its member is fenced (its epoch is newer than the stored one: that answer
    carries the stored layout) and must read that layout only (M8, M7); its producer, still
    registered, reports the version 2 it routes with and must be answered SYNC_METADATA (the
    coordinator's own count of its answers says so, not the client) and route by version 1."""
    client = h.start_client(RSC_HANDLER_MS="5")
    joined(h, 1, "one member")
    handled_all(h, h.publish(50))
    copy = h.redis.snapshot()  # the layout at version 1, four shards
    answer = h.admin("PUT", f"/v1/admin/streams/{h.stream}", json={"shardCount": 6})
    expect(answer.status_code == 200, "M8", f"kit: the reshard was refused: {answer.text}")
    grew = wait_for(lambda: h.settled(1, 6), JOIN_S, 0.1)
    expect(grew, "M8", "the member never read all six shards after the scale-out")
    handled_all(h, h.publish(100), "M8")
    producer = h.start_client(
        RSC_ROLE="producer",
        RSC_TOKEN=PRODUCER_TOKEN,
        RSC_PRODUCER_ID="conformance-producer",
        RSC_PUBLISH_COUNT="200",
        RSC_PUBLISH_BATCH="2",
        RSC_PUBLISH_INTERVAL_MS="40",
    )
    wait_for(lambda: len(producer.publishes) >= 20, JOIN_S, 0.05)
    # Redis comes back from the older copy, and no coordinator remembers the newer layout
    h.kill_coordinator()
    h.redis.restart_from(copy)
    h.start_coordinator()
    synced = wait_for(lambda: h.producer_answers("SYNC_METADATA") >= 1, QUIESCE_S, 0.05)
    # What was acknowledged before is lost with the newer copy, and until its SYNC_METADATA
    # the producer routes by the layout Redis no longer has (docs/clients.md says what that
    # costs): judged are the publishes acknowledged once it was answered.
    told_at = now()
    expect(
        synced,
        "P1",
        "the coordinator never answered the producer SYNC_METADATA: it did not report the layout"
        " version it routed with (P1), or stopped heartbeating",
    )
    code = producer.wait(CATCH_UP_S)
    expect(code == 0, "M8", f"the producer did not finish and exit 0 ({code}): {producer.stderr_tail()}")
    after = [p for p in producer.publishes if p.ev == "ack" and p.t > told_at]
    acked = [p.mid for p in after]
    h.publishes += after
    mids = acked + h.publish(100)
    handled_all(h, mids, "M8")
    expect(client.alive(), "M8", f"the client exited: {client.stderr_tail()}")
    joined(h, 1, "on the stored layout again", "M8")
    told = sum(h.heartbeat_answers(s) for s in ("SYNC_METADATA", "FENCED", "UNKNOWN_MEMBER"))
    expect(told >= 1, "M8", "the coordinator never told the member the stored layout after the restore")
    history_clean(h, "M8", journal=False)


def _fault(pid: int, kind: str) -> Fault:
    return Fault(pid, kind, now())


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("join", ("M1", "M4", "M9"), "join, get every shard, handle and acknowledge", join_and_handle),
    Scenario("graceful-leave", ("M3", "M14"), "SIGTERM: revoke, leave, exit 0", graceful_leave),
    Scenario(
        "scale-out",
        ("M2", "M3", "M6", "M10"),
        "a second member: revoke, ack in time, no overlap",
        scale_out_revoke,
    ),
    Scenario(
        "lease-expiry", ("M5", "M7"), "SIGSTOP past the lease: no handling after it, rejoin", lease_expiry
    ),
    Scenario("kill-9", ("M9",), "kill -9 mid-handling, restart: pending entries reclaimed", kill_and_reclaim),
    Scenario(
        "coordinator-restart",
        ("M12",),
        "the coordinator restarts: retry within the lease",
        coordinator_restart,
    ),
    Scenario("bad-credential", ("M11",), "a refused credential: a clean non-zero exit", bad_credential),
    Scenario(
        "quota-exceeded", ("M13",), "429 QUOTA_EXCEEDED: wait and retry, join when free", quota_exceeded
    ),
    Scenario("redis-data-loss", ("M16",), "Redis restarts empty: consumption resumes", redis_loses_data),
    Scenario("standby-failover", ("M12",), "503 STANDBY first, then the active one dies", standby_failover),
    Scenario(
        "older-copy", ("M8", "M7", "P1"), "Redis restored from an older copy: SYNC_METADATA", older_copy
    ),
    Scenario("static-takeover", ("M15",), "a new incarnation takes a static id over", static_takeover),
    Scenario(
        "producer-rules",
        ("P1", "P2", "P3", "P4", "P5", "M10"),
        "a scale-in, a pause and a quiesce reshard while it publishes: routed, sealed, paused, in order",
        producer_rules,
    ),
    Scenario(
        "producer-cut-replies",
        ("P6",),
        "replies to appends lost after Redis ran them: each message appended once",
        producer_cut_replies,
    ),
)


#: Every client rule of docs/protocol.md ("Client rules").
RULES: tuple[str, ...] = tuple(f"M{n}" for n in range(1, 17)) + tuple(f"P{n}" for n in range(1, 7))

#: What the scenarios cannot see of a rule from outside (the client's process is a black box:
#: the kit sees its records, Redis, the journal and the coordinator's counts).
LIMITS: dict[str, str] = {
    "M3": "the exact interval and the jitter of retries are not observable; a member that heartbeats"
    " late is fenced LEASE_EXPIRED, which scale-out and graceful-leave check it never is",
    "M5": "the safety margin itself is not observable; starts after the lease (the clock stopped"
    " with SIGSTOP) are",
    "M9": "the 30 s reclaim and 5-delivery dead letter are the reference clients' numbers (SHOULD):"
    " not judged; the backlog claim and acknowledging after the handler are",
    "P5": "trying the other coordinator URLs is checked for members (standby-failover), not for"
    " producers; retrying a lost append is (producer-cut-replies)",
}


def coverage() -> dict[str, list[str]]:
    """Rule -> the scenarios that check it."""
    return {rule: [s.name for s in SCENARIOS if rule in s.rules] for rule in RULES}


def run(
    scenario: Scenario, client_command: str, workdir: Path, redis_server: str = "redis-server"
) -> Outcome:
    """Run one scenario in a fresh Redis and coordinator; never raises for a verdict."""
    started = time.monotonic()
    where = workdir / scenario.name
    try:
        with harness(client_command, where, redis_server) as h:
            try:
                scenario.run(h)
            finally:  # what the client recorded and the group's end state, for a post-mortem
                lines = [json.dumps(attrs.asdict(r)) + "\n" for r in h.records()]
                (where / "records.jsonl").write_text("".join(lines))
                (where / "group.json").write_text(json.dumps(h.group_view(), indent=1))
        return Outcome(scenario, True, "", time.monotonic() - started)
    except Failed as verdict:
        return Outcome(scenario, False, str(verdict), time.monotonic() - started)
    except Exception as error:  # the kit's own trouble: reported, never a pass
        return Outcome(
            scenario, False, f"kit error: {type(error).__name__}: {error}", time.monotonic() - started
        )
