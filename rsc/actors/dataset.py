"""Noticing that Redis lost data, and starting the correction.

Redis loses data where production Redis does: a restart without persistence,
`FLUSHALL`/`FLUSHDB`, a failover to a replica that missed the last writes
(replication is asynchronous), a restore from an older RDB, eviction. The rules
this module keeps:

* **A marker key** `rsc:v1:{coordinator}:dataset` (hash `id`, `seq`), next to
  the lease. The active coordinator runs one script against it every
  `check_every_s` (one command a second by default): the marker gone means
  everything was lost (FLUSHALL changes neither `run_id` nor the replication
  ids, so only a key of our own shows it); another `id` or a `seq` below the
  one this coordinator last wrote means Redis holds an older copy (a lagging
  replica promoted, an older RDB). Otherwise `seq` moves on by one.
* **Redis' own identity**: `run_id` (new on every start) and `master_replid`
  (new on every restart from scratch or promotion), read with the same
  check on a standalone Redis. A change is not a loss by itself (a restart
  with an AOF keeps everything) but every actor compares its revision then.
* **The lease** (`rsc.actors.leadership`): a renewal that finds it gone or
  rolled back says the same, at once.
* Whatever noticed it, the verdict is one WARNING line naming what was lost
  (`DATA_LOSS`, counted in `/metrics` as `rsc_redis_data_loss_total{kind}`,
  shown in `/readyz` details and `/ui`), and the correction starts: every
  running actor compares the stored revision with its own and writes what it
  knows back when Redis holds less (`Actor.check_store`), then repairs every
  side effect as after a loss (shard keys, consumer groups at `0`, owner
  tokens, seals, the stream registry); the feature-level record is written
  back as this coordinator knows it, never re-initialized at the newest level.
* **Partial loss** (some aggregates evicted, one cluster node restarted): the
  watch also compares, in rotation, `sweep_per_check` running actors' stored
  revisions per check (a bounded number of Redis commands a second whatever
  the number of aggregates), so an aggregate lost alone is found within
  `actors / sweep_per_check` checks. Shard keys, consumer groups and owner
  tokens lost alone are reported by the members that read them (a heartbeat's
  `stalledShards`) and healed by their group's actor.
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import coredis
import trio

from rsc.actors.errors import StoreError
from rsc.actors.health import store_failed
from rsc.actors.store_connection import redis_errors
from rsc.lua import script

log = logging.getLogger("rsc.dataset")

#: What Redis lost, as `rsc_redis_data_loss_total{kind}` counts it.
EVERYTHING = "everything"  # the marker gone: a restart without persistence, FLUSHALL, FLUSHDB
ROLLBACK = "rollback"  # an older copy: a lagging replica promoted, an older RDB restored
LEASE = "lease"  # the coordinator lease gone or rolled back while held
AGGREGATE = "aggregate"  # one aggregate's journal and snapshot older than this coordinator wrote
SHARD = "shard"  # a shard key, its consumer group or its owner token, reported by a member
REBUILT = "rebuilt"  # a stream or group Redis lost, rebuilt from what its members or producers know
KINDS = (EVERYTHING, ROLLBACK, LEASE, AGGREGATE, SHARD, REBUILT)


@attrs.frozen
class LossReport:
    kind: str
    what: str
    at_ms: int


class DataLoss:
    """What this coordinator noticed Redis lose, for logs, `/metrics`, `/readyz` and `/ui`.

    One per process, as a process runs one coordinator (like `REDIS_OUTAGE`)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.recent: collections.deque[LossReport] = collections.deque(maxlen=20)
        #: Aggregates written back from memory (`Actor._restore`).
        self.restored_aggregates = 0
        #: Told of each loss noticed (the registry starts the correction).
        self.listeners: list[Callable[[str, str], None]] = []

    def reset(self) -> None:
        self.counts.clear()
        self.recent.clear()
        self.restored_aggregates = 0
        self.listeners.clear()

    def noticed(self, kind: str, what: str) -> None:
        """Redis lost `what`: one WARNING line, counted, and the correction starts."""
        self.counts[kind] += 1
        self.recent.append(LossReport(kind, what, int(time.time() * 1000)))
        log.warning("Redis lost data (%s): %s; correcting from what this coordinator knows", kind, what)
        for listener in list(self.listeners):
            listener(kind, what)

    def restored(self, aggregate: str, stored: int, revision: int) -> None:
        """An actor wrote its aggregate back (it logs the line itself)."""
        self.restored_aggregates += 1
        self.counts[AGGREGATE] += 1
        self.recent.append(
            LossReport(
                AGGREGATE, f"{aggregate}: revision {stored} stored, written back at {revision}", _now_ms()
            )
        )

    def shard(self, what: str) -> None:
        """A member found a shard's key, consumer group or owner token gone (healed by its group)."""
        self.counts[SHARD] += 1
        self.recent.append(LossReport(SHARD, what, _now_ms()))
        log.warning("Redis lost data (%s): %s; recreating it", SHARD, what)

    def details(self) -> dict[str, Any]:
        """For `/readyz` and `/ui`: counts by kind and the latest reports (newest last)."""
        return {
            "counts": {kind: self.counts[kind] for kind in KINDS if self.counts[kind]},
            "restoredAggregates": self.restored_aggregates,
            "recent": [{"kind": r.kind, "what": r.what, "atMs": r.at_ms} for r in self.recent],
        }


DATA_LOSS = DataLoss()


@attrs.frozen
class Identity:
    """Which Redis answers and which history its dataset has (standalone Redis only)."""

    run_id: str
    replid: str


class DatasetWatch:
    """Checks the marker and Redis' identity while this coordinator is active (see the module)."""

    def __init__(
        self,
        redis: Any,
        marker_key: str,
        *,
        active: Callable[[], bool],
        has_streams: Callable[[], Any],
        check_every_s: float = 1.0,
        loss: DataLoss = DATA_LOSS,
    ) -> None:
        self.redis = redis
        self.marker_key = marker_key
        self.active = active
        #: Awaitable: whether Redis holds any stream registration (a first start on old data).
        self.has_streams = has_streams
        self.check_every_s = check_every_s
        self.loss = loss
        self.dataset_id: str | None = None
        self.seq = 0
        self.identity: Identity | None = None
        #: Told (synchronously) when Redis' identity changed: compare every aggregate.
        self.on_identity_change: Callable[[str], None] = lambda why: None
        self._mark = redis.register_script(script("coordinator/mark_dataset"))
        self.checks = 0
        #: The first check of a term after this process was not active.
        self.new_term = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.check_every_s)
            if not self.active():
                # What it knew stays (a term that ended in a failover to a lagging replica is
                # followed by one that must see the rollback), but another coordinator may have
                # marked the dataset anew meanwhile: the next term adopts another id quietly.
                self.new_term = True
                continue
            try:
                await self.check()
            except StoreError as exc:
                store_failed(log, exc, f"checking the dataset marker failed: {exc}")

    async def check(self) -> str:
        """One check (the verdict: ok, absent, other, behind, first)."""
        self.checks += 1
        first = self.dataset_id is None
        with redis_errors("checking the dataset marker"):
            verdict, dataset_id, seq = await self._mark(
                keys=[self.marker_key], args=[self.dataset_id or "", self.seq, uuid.uuid4().hex]
            )
        verdict, dataset_id, seq = str(verdict), str(dataset_id), int(seq)
        known = self.dataset_id
        self.dataset_id, self.seq = dataset_id, seq
        if self.new_term:
            self.new_term = False
            if verdict == "other":  # re-marked by another coordinator (it reported what it saw)
                log.info(
                    "dataset marker %s, not %s: marked anew while this process was standby", dataset_id, known
                )
                first = True
        identity = await self._identity()
        changed = self.identity is not None and identity is not None and identity != self.identity
        if identity is not None:
            self.identity = identity
        if first:
            if verdict == "absent" and await self.has_streams():
                log.info("dataset marker written (%s): streams are registered", dataset_id)
            return "first" if verdict != "absent" else "absent"
        if verdict == "absent":
            self.loss.noticed(
                EVERYTHING,
                f"the dataset marker {self.marker_key} is gone (a restart without persistence, "
                f"FLUSHALL or FLUSHDB); dataset {known} is now {dataset_id}",
            )
        elif verdict in ("other", "behind"):
            self.loss.noticed(
                ROLLBACK,
                f"Redis holds an older copy of the data (dataset marker {verdict}: "
                f"{dataset_id} at seq {seq}; this coordinator had written {known}): a lagging "
                "replica promoted or an older RDB restored",
            )
        elif changed:
            log.info(
                "Redis restarted or failed over (run_id or replication id changed) with the data "
                "kept: comparing every aggregate"
            )
            self.on_identity_change("Redis restarted or failed over")
        return verdict

    async def _identity(self) -> Identity | None:
        if isinstance(self.redis, coredis.RedisCluster):
            return None
        with redis_errors("reading Redis' identity"):
            server = await self.redis.info("server")
            replication = await self.redis.info("replication")
        return Identity(str(server.get("run_id", "")), str(replication.get("master_replid", "")))


async def sweep(
    actors: Callable[[], Iterable[Any]], per_round: int, every_s: float, why: str = "periodic check"
) -> None:
    """Ask `per_round` actors at a time, in rotation, to compare their stored revision (partial
    loss), one round every `every_s`: a bounded number of Redis commands a second."""
    position = 0
    while True:
        await trio.sleep(every_s)
        running = list(actors())
        if not running:
            continue
        position %= len(running)
        for actor in running[position : position + per_round]:
            actor.check_store(why, repair=False)
        position += per_round


def _now_ms() -> int:
    return int(time.time() * 1000)
