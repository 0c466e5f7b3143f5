"""The chaos suite's harness through Redis losing data (issue 26): three workers, two producers
and a coordinator, real processes, while Redis is flushed (FLUSHALL), restarted without its
data, and rolled back to an older copy of itself (what a lagging replica's promotion does).

What the history must show: every publish begun after Redis answers again is handled, from
the first moment (one Redis ran before the fault may be acknowledged after it: only that
entry may be gone with the lost data, Redis' durability, not ours); no entry is handled by
two members at once; no handler starts on a shard not installed to its member (the group's
journal, read before each fault, holds the installs a loss takes with it); the group
converges after each fault; `rsc journal verify` passes at the
end. The gap from each fault to the first handled publish after it is measured and printed.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from rsc.conformance.history import Publish, check, entry_key, ownership_from_journal
from tests.chaos.test_chaos import ROOT, Chaos, chaos, now, read_jsonl


class Losses:
    """The windows whose acknowledged publishes must all be handled, and the gaps measured."""

    def __init__(self, run: Chaos) -> None:
        self.run = run
        self.windows: list[tuple[float, float]] = []
        self.gaps: dict[str, float | None] = {}
        #: The group's journal as read before each fault and at the end (a loss takes the
        #: history of installs and releases with it; together they are the whole of it).
        self.journal: dict[str, tuple[str, str, str]] = {}

    def keep_journal(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self.journal.update((entry[0], entry) for entry in self.run.journal())

    def acked(self) -> list[tuple[Publish, float]]:
        """Each acknowledged publish and when its call began (monotonic), from one read of the
        producers' files (they grow meanwhile)."""
        return [
            (Publish.from_json(r), float(r["t0"]))
            for n in range(2)
            for r in read_jsonl(self.run.tmp / f"published-{n}.jsonl")
            if r["ev"] == "ack"
        ]

    def unhandled(self, since: float, until: float) -> list[str]:
        done = {r.mid for r in self.run.records() if r.ev == "end"}
        return [p.mid for p, began in self.acked() if since < began and p.t <= until and p.mid not in done]

    def after(self, fault: str, at: float) -> None:
        """Redis answers again since `at`: the group converges, publishes flow, and every one
        acknowledged since is handled (checked up to now)."""
        since = at  # every publish begun after Redis answers again, the first moments included
        self.run.wait_converged(fault, at)
        records = self.run.records

        def first_handled() -> float | None:
            after = {p.mid for p, began in self.acked() if began > since}
            ends = [r.t for r in records() if r.ev == "end" and r.mid in after]
            return min(ends, default=None)

        self.run.wait_until(lambda: first_handled() is not None, 20, f"a publish handled after {fault}")
        handled = first_handled()
        self.gaps[fault] = None if handled is None else round(handled - at, 2)
        time.sleep(2.0)  # under load for a while
        until = now()
        self.run.wait_until(lambda: not self.unhandled(since, until), 30, f"the publishes after {fault}")
        self.windows.append((since, until))

    def judge(self, title: str) -> None:
        """Stop the producers, drain, and judge the whole history: every publish acknowledged in
        the windows handled, no overlap, no stale start, a gap measured for every fault, no
        failure along the way, and `rsc journal verify` passing."""
        for producer in self.run.producers:
            producer.stopped = True
            assert producer.terminate() == 0, producer.death()
        end = now()
        assert self.run.wait_until(lambda: not self.unhandled(self.windows[-1][1], end), 30, "the drain")
        self.windows.append((self.windows[-1][1], end))
        must = [p for p, began in self.acked() if any(a < began <= b for a, b in self.windows)]
        publishes = [
            Publish.from_json(r) for n in range(2) for r in read_jsonl(self.run.tmp / f"published-{n}.jsonl")
        ]
        self.keep_journal()
        self.run.offsets.append(self.run.clock_offset())
        offset = sum(self.run.offsets) / len(self.run.offsets)
        ownership = ownership_from_journal(
            [self.journal[i] for i in sorted(self.journal, key=entry_key)], offset
        )
        report = check(self.run.records(), publishes, self.run.faults, ownership)
        print(f"\n{title}: {len(must)} publishes after the faults, gaps (s): {self.gaps}")
        assert len(must) > 150, len(must)
        assert not [p.mid for p in must if p.mid not in {r.mid for r in self.run.records() if r.ev == "end"}]
        assert not report.overlaps, report.overlaps[:3]  # never two members on one entry at once
        assert not report.stale_starts, report.stale_starts[:3]  # never a start on a shard not installed
        assert all(gap is not None for gap in self.gaps.values()), self.gaps
        assert not self.run.failures, self.run.failures
        verify = subprocess.run(
            [sys.executable, "-m", "rsc", "journal", "verify", "--redis-url", self.run.redis.url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr


def flushall(run: Chaos) -> float:
    run.context = "FLUSHALL"
    run.burst()
    with redis.Redis.from_url(run.redis.url) as client:
        client.flushall()
    run.note("FLUSHALL")
    return now()


def restart_empty(run: Chaos) -> float:
    """Crash Redis and start it without its data: a restart without persistence."""
    run.context = "Redis restarted without its data"
    run.burst()
    run.redis_down = True
    run.redis.stop(signal.SIGKILL)
    shutil.rmtree(run.redis.workdir / "appendonlydir", ignore_errors=True)
    run.redis.start()
    run.redis_down = False
    run.note("redis-server restarted empty")
    return now()


def roll_back(run: Chaos, copy: Path) -> float:
    """Crash Redis and start it from an older copy of its AOF: a lagging replica promoted."""
    run.context = "Redis rolled back to an older copy"
    run.redis_down = True
    run.redis.stop(signal.SIGKILL)
    shutil.rmtree(run.redis.workdir / "appendonlydir")
    shutil.copytree(copy, run.redis.workdir / "appendonlydir")
    run.redis.start()
    run.redis_down = False
    run.note("redis-server started from an older copy")
    return now()


def test_the_data_plane_through_redis_losing_data(tmp_path: Path) -> None:
    with chaos(tmp_path) as run:
        run.setup()
        losses = Losses(run)
        losses.keep_journal()
        losses.after("FLUSHALL", flushall(run))
        losses.keep_journal()
        losses.after("a restart without persistence", restart_empty(run))
        copy = tmp_path / "older-aof"
        shutil.copytree(run.redis.workdir / "appendonlydir", copy)  # fsync always: consistent
        time.sleep(3.0)  # history the copy misses: entries, handoffs, journal writes
        losses.keep_journal()
        losses.after("a rollback to an older copy", roll_back(run, copy))

        losses.judge("Redis losing data")
