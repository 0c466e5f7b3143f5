"""The chaos suite's harness through Redis failovers (issue 26): a Sentinel set (primary, replica,
three sentinels), two coordinators (one active, one standby) with `coordinator_lease_replicas =
1`, three workers and two producers, real processes, all on the `redis+sentinel://` URL, while

1. the sentinels fail over to the replica, in sync (`SENTINEL FAILOVER`);
2. the replica is stopped (SIGSTOP) while writes go on, the primary is killed and the replica,
   behind, is promoted: Redis holds an older copy than the coordinators and members saw (the
   failed primary comes back empty, as a replica of the new one);
3. a shard key is evicted with its consumer group and owner tokens.

What the history must show, as in `test_chaos_loss.py`: every publish acknowledged after Redis
answers again is handled; no entry handled by two members at once; no handler start on a shard
not installed to its member; the gap from each fault to the first handled publish after it,
measured; `rsc journal verify` passes. And what the coordinators' own logs show: no two
coordinator terms overlap in time (the lease is active only on renewals a replica holds, so
the promoted replica never gives it to a second coordinator while the first still acts), and
no fencing token is handed to two terms. (Cluster `CLUSTER FAILOVER` is in
`tests/processes/test_cluster_failover.py`, a process test: the chaos producer is the synchronous one,
which speaks to one Redis, not to a Cluster.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest
import redis

from rsc.events.wire import owner_key
from rsc.sync_connect import sync_redis
from tests.chaos.test_chaos import Chaos, chaos, now
from tests.chaos.test_chaos_loss import Losses
from tests.redis_servers import SentinelSet

#: The coordinators' settings besides the chaos suite's: the lease counts only when a replica
#: has it (`WAIT`), and JSON log lines, whose times the term check reads.
SERVE_ENV = {"RSC_COORDINATOR_LEASE_REPLICAS": "1", "RSC_LOG_FORMAT": "json"}

TERM_STARTED = re.compile(r"^active: took the coordinator lease with token (\d+)$")
TOKEN_MOVED = re.compile(r"(?:took it back|this term goes on) with token (\d+)$")
TERM_ENDED = re.compile(
    r"^(?:standby: the coordinator lease \(token \d+\) was lost|standby: no renewal|released)"
)


def sentinel_failover(run: Chaos, sentinels: SentinelSet) -> float:
    run.context = "a Sentinel failover (replica in sync)"
    run.burst()
    new = sentinels.failover()
    run.note(f"the sentinels promoted {new}")
    return now()


def lagging_replica_promoted(run: Chaos, sentinels: SentinelSet) -> float:
    """SIGSTOP the replica, write on for a while, kill the primary, promote the replica."""
    run.context = "a lagging replica promoted"
    sentinels.wait_ready()
    primary = sentinels.primary_port()
    (replica,) = set(sentinels.data_ports) - {primary}
    run.burst()
    sentinels.process(replica).send_signal(signal.SIGSTOP)
    run.note(f"replica {replica} stopped")
    # More than the sockets between them buffer (a resumed replica would still read that):
    # what follows stays in the primary's memory only.
    with redis.Redis(port=primary) as direct:
        for n in range(40):
            direct.set(f"{run.prefix}:filler:{n}", os.urandom(512 * 1024))
    lagging = now()
    while now() - lagging < 2.0:  # producers and (until their lease ends) coordinators write on
        run.supervise()
        time.sleep(0.1)
    run.redis_down = True
    sentinels.process(primary).kill()
    sentinels.process(primary).wait()
    sentinels.process(replica).send_signal(signal.SIGCONT)
    run.note(f"primary {primary} killed, replica {replica} resumed")
    sentinels.wait_primary(replica)
    run.redis_down = False
    answering = now()
    run.note(f"the sentinels promoted {replica}")
    sentinels.restart(primary)  # without a replica no lease renewal counts
    run.note(f"{primary} back, empty, as a replica")
    return answering


def evict_a_shard(run: Chaos) -> float:
    """A shard key with its consumer group, and its owner tokens, gone (as `allkeys-lru` does)."""
    run.context = "a shard key and its group evicted"
    run.burst()
    time.sleep(0.1)
    key = run.shard_keys()[0]
    with sync_redis(run.redis.url) as client:
        client.delete(key, owner_key(key))
    run.note(f"evicted {key} and its owner tokens")
    return now()


def coordinator_terms(run: Chaos) -> tuple[list[tuple[str, float, float]], list[tuple[str, int]]]:
    """From the coordinators' logs: each term as (process, start, end), wall-clock seconds (a
    term still held ends now), and each token a term took, with its process. A log line is
    written after the fact (the standby gate stops answering at the term's deadline, the line
    follows), so these terms are, if anything, longer than the real ones."""
    terms: list[tuple[str, float, float]] = []
    tokens: list[tuple[str, int]] = []
    for child in run.coordinators:
        started: float | None = None
        for line in child.log.read_text().splitlines():
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            at = datetime.strptime(record["time"], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
            message = record["message"]
            if match := TERM_STARTED.match(message):
                started = at
                tokens.append((child.name, int(match[1])))
            elif match := TOKEN_MOVED.search(message):
                tokens.append((child.name, int(match[1])))
            elif TERM_ENDED.match(message) and started is not None:
                terms.append((child.name, started, at))
                started = None
        if started is not None:
            terms.append((child.name, started, time.time()))
    return terms, tokens


@pytest.mark.timeout(600)  # 150 s alone, 235 s on a slow CI machine
def test_the_data_plane_and_two_coordinators_through_redis_failovers(tmp_path: Path) -> None:
    with (
        SentinelSet(tmp_path / "sentinels") as sentinels,
        chaos(tmp_path, redis=sentinels, coordinators=2, serve_env=SERVE_ENV) as run,
    ):
        run.setup()
        losses = Losses(run)
        losses.keep_journal()
        losses.after("a Sentinel failover", sentinel_failover(run, sentinels))
        losses.keep_journal()
        losses.after("a lagging replica promoted", lagging_replica_promoted(run, sentinels))
        losses.keep_journal()
        losses.after("a shard key and its group evicted", evict_a_shard(run))
        losses.judge("Redis failovers")

        terms, tokens = coordinator_terms(run)
        print("coordinator terms (process, seconds):", [(p, round(b - a, 2)) for p, a, b in terms])
        # The lagging replica's promotion ends a term at least (no replica acknowledged the
        # renewals while it was stopped): the check below compares two terms or more.
        assert len(terms) >= 2, terms
        overlapping = [
            (a, b)
            for i, a in enumerate(terms)
            for b in terms[i + 1 :]
            if a[0] != b[0] and a[1] < b[2] and b[1] < a[2]
        ]
        assert not overlapping, overlapping  # never two coordinators active at once
        taken = [token for _, token in tokens]
        assert len(taken) == len(set(taken)), tokens  # no fencing token handed out twice
