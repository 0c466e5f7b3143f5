"""The actor: one task owns one aggregate; commands arrive through a bounded inbox.

The rules it keeps:

* Commands are decided one at a time, in arrival order, against the state
  left by the previous one. Commands waiting in the inbox are taken as one
  batch and their durable events persisted with a single write (group
  commit). Once a batch is decided, `follow_ups` (if set) may add commands that
  its events call for (a held heartbeat a release concerns): they are decided
  next, in the same batch and write, and their events may call for more.
* A command is answered only after its events are persisted. A refused
  command (a `CoordinationError`) is answered with that error and changes
  nothing; the rest of its batch goes on.
* If the write meets a `ConcurrencyConflict` (another writer moved the
  aggregate), the actor reloads (latest checkpoint + journal tail) and
  decides the whole batch again.
* Side effects run after the write and before the answer, and before the
  new state becomes visible to readers of `state`. They are idempotent; if
  they fail, the actor repairs everything on its next batch. What no answer
  waits for (the aggregate's `after_answer`, and a checkpoint the batch made
  due) runs once the batch is answered: before the next batch, unless commands
  already wait (then once they are answered, at most `MAX_BOOKKEEPING_DELAY_S`
  later), for every batch answered since, from the state then.
* Time-driven commands (ticks) are injected by the actor itself when no
  command arrives before the next tick is due: at the aggregate's next
  deadline (`due_ms`: a lease's end, a revoke deadline...), at most once a
  tick interval; an aggregate with nothing time-driven (no members, no
  producers...) is not woken at all until a command comes, so idle and
  quiet aggregates cost no CPU between their deadlines.
* Liveness is the actor's, not the aggregate's: it keeps the aggregate's
  lease table (`leases`, see `rsc.events.liveness`), hands it to each tick,
  and applies a batch's liveness events to it only once the batch's write
  succeeded. After any reload (a conflict, or a failed write) the table no
  longer matches the state: the next batch starts with the aggregate's
  `recovered()` command (`RestartTimers`: every lease and revoke timeout in
  full) and drops the commands the actor injected itself (ticks), so a
  reloaded state never meets a stale table.

Why one module: the inbox loop, the batch's decision, its write, its bookkeeping
after the answers and the reload all read and move the same few fields (the state,
the journal's revision, the checkpoint's, the lease table); split apart, each part
would reach into the others'.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

import attrs
import trio

from rsc.actors.answers import NO_ANSWER, Answer, FollowUps, Many, Pending, Slot
from rsc.actors.clock import Clock
from rsc.actors.dataset import DATA_LOSS
from rsc.actors.errors import ActorStopped, ConcurrencyConflict, Redecide, StoreError, StoreUnavailable
from rsc.actors.health import REDIS_OUTAGE, store_failed
from rsc.actors.keys import AggregateId
from rsc.actors.store import Loaded, Store, check_levels, check_writable
from rsc.events.errors import CoordinationError, PreconditionFailed
from rsc.events.events import GroupEvent, StreamEvent
from rsc.events.liveness import BatchLeases, Leases

log = logging.getLogger("rsc.actors")

S = TypeVar("S")
C = TypeVar("C")
E = TypeVar("E", bound=GroupEvent | StreamEvent)

MAX_CONFLICT_RETRIES = 8
#: The longest a batch's bookkeeping (`Aggregate.after_answer`, a checkpoint) waits for the
#: commands queued behind it to be answered first (s).
MAX_BOOKKEEPING_DELAY_S = 0.25
#: In the inbox: compare the stored revision with ours before the next batch (`check_store`).
_CHECK: Any = object()


class Aggregate(Protocol[S, C, E]):
    """What an actor needs to know about the aggregate it owns."""

    aggregate_id: AggregateId

    def execute(self, state: S | None, command: C, leases: Mapping[str, int]) -> tuple[S, list[E]]:
        """Decide `command` on `state`; `leases`: the lease table as of the commands decided
        before it (only read)."""
        ...

    def event_to_json(self, event: E) -> tuple[str, str]: ...

    def event_from_json(self, data: str, version: int = 1) -> E:
        """The event of a journal entry whose data is of `version` (upcast to today's)."""
        ...

    def evolve(self, state: S | None, event: E) -> S: ...

    def checkpoint_json(self, state: S) -> str: ...

    def state_from_json(self, data: str) -> S: ...

    def tick(self, state: S | None, leases: Mapping[str, int], now_ms: int) -> C | None:
        """The command to inject when a tick is due, reading `leases` (None: nothing to do)."""
        ...

    def due_ms(self, state: S | None, leases: Mapping[str, int]) -> int | None:
        """When a tick may next change `state` (ms, the clock's; past: at the next tick
        interval); None: no tick will until a command comes. Ticks come no more often than
        every `tick_interval_s`, and not at all before this."""
        ...

    def recovered(self, state: S, now_ms: int) -> C | None:
        """The command that restarts liveness after loading an existing aggregate (or reloading it)."""
        ...

    async def after_persist(self, before: S | None, after: S, events: Sequence[E]) -> None:
        """Perform the side effects of `events` (idempotent) that must be done before anyone
        is answered."""
        ...

    async def after_answer(self, after: S, events: Sequence[E]) -> None:
        """Perform the side effects of `events` (idempotent) that nobody's answer waits for
        (bookkeeping a reader may see a moment late); run once their batches are answered, for
        one batch or several (commands that waited were answered first), `after` the state
        now (`await answers_first()` before any costly work lets the askers go first). A
        failure is repaired as one of `after_persist`'s."""
        ...

    async def repair(self, state: S, after_loss: bool = False) -> None:
        """Perform every side effect `state` implies (idempotent), after recovery or failure.

        `after_loss`: Redis lost data (shard keys, consumer groups, owner tokens may be gone):
        a consumer group recreated now starts at `0`, never at `$` (what a producer appended
        since the loss was acknowledged to it)."""
        ...


async def answers_first() -> None:
    """Let the askers an actor just answered render and send their answers before it goes on
    with work no answer waits for (`Aggregate.after_answer`, a checkpoint): woken, they run in
    trio's next round of tasks, and this returns in the round after it (one checkpoint would let
    trio run the caller first half the time)."""
    for _ in range(2):
        await trio.lowlevel.checkpoint()


@attrs.frozen
class Reply(Generic[S, E]):
    """The state right after a command's events, and those events."""

    state: S
    events: list[E]


@attrs.define
class _Outcome(Generic[S, E]):
    """A decided batch: the state it leaves, each command's answer, every event, and the answer
    slots of the follow-ups decided with it."""

    working: S | None
    answers: list[tuple[Answer | None, Reply[S, E] | CoordinationError]] = attrs.Factory(list)
    every: list[E] = attrs.Factory(list)
    followed: list[Answer] = attrs.Factory(list)


@attrs.frozen
class ActorSettings:
    inbox_size: int = 1024
    max_batch: int = 256
    tick_interval_s: float = 1.0
    #: At least this many events between checkpoints; and a checkpoint is written only once
    #: the events since the last one weigh as much as it did (bytes), so that a large state
    #: is not rewritten every few events: a checkpoint costs O(1) per event amortized and a
    #: reload reads at most about twice the state.
    checkpoint_every: int = 100


class Actor(Generic[S, C, E]):
    """Owns one aggregate: its state, revision and the only writer of its journal."""

    def __init__(
        self, aggregate: Aggregate[S, C, E], store: Store, clock: Clock, settings: ActorSettings
    ) -> None:
        self.aggregate = aggregate
        self.store = store
        self.clock = clock
        self.settings = settings
        self.state: S | None = None
        #: The lease table of the aggregate: what the liveness events of persisted batches say.
        self.leases = Leases()
        #: Set by a reload: the next batch must start with `recovered()` (the table is stale).
        self._restart_pending = False
        #: The revision of `state`, as readers see it (set with `state`, after side effects).
        self.revision = 0
        #: The journal's revision, ahead of `revision` while side effects of a write run.
        self._revision = 0
        self.checkpoint_revision = 0
        #: The size of the last checkpoint and of the events written since (bytes of JSON).
        self._checkpoint_bytes = self._tail_bytes = 0
        #: A checkpoint is due once the current batch is answered (`_persist` decides).
        self._checkpoint_due = False
        #: The events of the batches answered since the last bookkeeping (`_keep_books`), and
        #: since when bookkeeping is owed (None: nothing).
        self._unkept: list[E] = []
        self._books_since: float | None = None
        self.writes = 0
        self.conflicts = 0
        self.last_used = trio.current_time()
        self.needs_repair = True
        self._send, self._receive = trio.open_memory_channel[tuple[C, Answer]](settings.inbox_size)
        self._stopped = False
        self._in_flight: list[Answer] = []
        self._check_why: str | None = None
        self.started = False
        #: Redis lost data since the last repair: the next one recreates consumer groups at `0`.
        self.after_loss = False
        #: How often this actor wrote its state back after Redis lost or rolled it back.
        self.restores = 0
        #: (revision, state) this process held for the aggregate when its previous term ended
        #: (`Registry.stop_all`): written back if Redis now holds less (`_reload`).
        self.remembered: tuple[int, S] | None = None
        #: Asked once a batch is decided, with the state it left and its events: commands to
        #: decide next in the same batch and write (asked again with their own events). Must
        #: not raise. If the write meets a conflict, their slots fail with `Redecide` (the
        #: batch is decided again without them); if it fails, with the batch's error.
        self.follow_ups: FollowUps | None = None

    @property
    def inbox_depth(self) -> int:
        return self._receive.statistics().current_buffer_used

    async def ask(self, command: C, expect_revision: int | None = None) -> Reply[S, E]:
        """Send `command` and wait for its persisted outcome.

        Raises the command's `CoordinationError`, `StoreUnavailable`, or
        `ActorStopped` if the actor stopped first (the command may or may not
        have been persisted: ask again, commands are safe to repeat). With
        `expect_revision`, the command is decided only if the aggregate is at that
        revision then, in the actor's own order (`PreconditionFailed` otherwise): a
        check-and-write no other writer can come between.
        """
        if self._stopped:
            raise ActorStopped(str(self.aggregate.aggregate_id))
        self.last_used = trio.current_time()
        pending = Pending(expect_revision)
        try:
            await self._send.send((command, pending))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorStopped(str(self.aggregate.aggregate_id)) from None
        result: Reply[S, E] = await pending.wait()
        return result

    async def ask_many(self, commands: Sequence[C]) -> list[Reply[S, E] | CoordinationError]:
        """Send `commands` together and wait once for all their outcomes, in order.

        A refused command gives its `CoordinationError` in its place; any other
        failure (`StoreUnavailable`, `ActorStopped`) is raised for the whole call.
        """
        if self._stopped:
            raise ActorStopped(str(self.aggregate.aggregate_id))
        self.last_used = trio.current_time()
        many = Many(len(commands))
        try:
            for index, command in enumerate(commands):
                item = (command, Slot(many, index))
                try:
                    self._send.send_nowait(item)  # no checkpoint: the actor takes them as one batch
                except trio.WouldBlock:
                    await self._send.send(item)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorStopped(str(self.aggregate.aggregate_id)) from None
        await many.done.wait()
        for result in many.results:
            if isinstance(result, BaseException) and not isinstance(result, CoordinationError):
                raise result
        return many.results

    def check_store(self, why: str, repair: bool = True) -> None:
        """Redis may have lost data (`rsc.actors.dataset`): before its next batch the actor
        compares the stored revision with its own and, if Redis holds less, writes what it
        knows back (`Store.restore`) and repairs every side effect as after a loss; with
        `repair` it repairs them in any case (Redis lost data, maybe not this aggregate's but
        its shard keys'). Does not wait; with a full inbox the check rides on the next batch."""
        if not self.started:
            return  # it loads afresh anyway
        self._check_why = why
        if repair:
            self.after_loss = True
            self.needs_repair = True
        with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            self._send.send_nowait((_CHECK, NO_ANSWER))  # wakes an idle actor

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load, recover, then serve the inbox until cancelled."""
        try:
            await self._reload()
            await self._recover()
            self.started = True
            task_status.started()
            await self._serve()
        finally:
            self._stop()

    def _stop(self) -> None:
        """Refuse new commands and fail every waiter: in flight, or still in the inbox."""
        self._stopped = True
        self._send.close()  # askers blocked in send, or sending later, get ActorStopped
        error = ActorStopped(str(self.aggregate.aggregate_id))
        for pending in self._in_flight:
            pending.fail(error)
        while True:
            try:
                _, pending = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            pending.fail(error)
        self._receive.close()

    async def _serve(self) -> None:
        next_tick = trio.current_time() + self.settings.tick_interval_s
        while True:
            batch: list[tuple[C, Answer | None]] = []
            # An aggregate sleeps until its next deadline (a lease's end, a revoke deadline...)
            # or a command, whichever comes first; with nothing time-driven (no members, no
            # producers...) until a command: idle aggregates cost nothing. Never more often
            # than every tick interval.
            due = self.aggregate.due_ms(self.state, self.leases)
            if self.needs_repair and self.state is not None:
                due = 0  # side effects failed: try them again at the next tick (a batch repairs)
            wake = math.inf
            if due is not None:
                wait_s = max(0.0, (due - self.clock.now_ms() + 1) / 1000)  # (+1: at, not before)
                wake = max(next_tick, trio.current_time() + wait_s)
            with trio.move_on_at(wake):
                batch.append(await self._receive.receive())
            if due is None:
                next_tick = trio.current_time() + self.settings.tick_interval_s
            if not batch:
                next_tick = trio.current_time() + self.settings.tick_interval_s
                tick = self.aggregate.tick(self.state, self.leases, self.clock.now_ms())
                if tick is None:
                    if self.needs_repair and self.state is not None:
                        await self._process([])
                        await self._keep_books_unless_busy()
                    continue
                batch.append((tick, None))
            while len(batch) < self.settings.max_batch:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            await self._process(batch)
            await self._keep_books_unless_busy()

    async def _process(self, batch: Sequence[tuple[C, Answer | None]]) -> None:
        checks = [item for item in batch if item[0] is _CHECK]
        if checks:
            batch = [item for item in batch if item[0] is not _CHECK]
        # Left set if the actor is cancelled mid-batch, so that `_stop` fails these waiters.
        self._in_flight = [p for _, p in batch if p is not None and p is not NO_ANSWER]
        try:
            if checks and self._check_why is not None:
                await self._check(self._check_why)
            for _ in range(MAX_CONFLICT_RETRIES):
                if self._restart_pending:
                    batch = self._with_recovery(batch)
                try:
                    await self._decide_and_persist(batch)
                except ConcurrencyConflict as conflict:
                    self.conflicts += 1
                    if conflict.actual >= self._revision:
                        log.info("%s: %s; reloading", self.aggregate.aggregate_id, conflict)
                    await self._reload()  # a lower revision is a loss: the state is written back
                else:
                    self._in_flight = []
                    REDIS_OUTAGE.ok()
                    return
            raise StoreUnavailable(f"{self.aggregate.aggregate_id}: too many concurrent writers")
        except StoreError as exc:
            store_failed(log, exc, f"{self.aggregate.aggregate_id}: {exc}")
            for pending in self._in_flight:
                pending.fail(exc)
            self._in_flight = []
            await self._reload_quietly()

    async def _check(self, why: str) -> None:
        """Compare the stored revision with ours; write ours back if Redis holds less."""
        stored = await self.store.revision(self.aggregate.aggregate_id)
        self._check_why = None
        if self.state is not None and stored < self._revision:
            await self._restore(stored, f"{why}; revision {stored} stored")
        elif stored > self._revision:
            await self._reload()  # another writer moved it on (not a loss): as after a conflict

    async def _restore(self, stored: int, why: str) -> None:
        """Redis holds an older revision than this actor wrote (`stored`): it lost or rolled
        back the aggregate. Write the state this actor holds (every write it made is in it) back
        as one checkpoint at a revision above every one written before, then repair every side
        effect as after a loss."""
        assert self.state is not None
        aggregate_id = self.aggregate.aggregate_id
        revision = self._revision + 1
        state = self.aggregate.checkpoint_json(self.state)
        appended = await self.store.restore(aggregate_id, stored, revision, state, why)
        self._revision = self.revision = appended.revision
        self._checkpointed(appended.revision, state)
        self.restores += 1
        self.after_loss = True
        self.needs_repair = True
        DATA_LOSS.restored(str(aggregate_id), stored, revision)
        log.warning(
            "%s: Redis lost or rolled back this aggregate (%s, this coordinator had written revision "
            "%d): wrote its state back from memory at revision %d",
            aggregate_id,
            why,
            revision - 1,
            revision,
        )

    def _with_recovery(self, batch: Sequence[tuple[C, Answer | None]]) -> Sequence[tuple[C, Answer | None]]:
        """After a reload, liveness starts over (leases in full) before the batch is decided again.

        The commands nobody waits for (ticks, an earlier restart) were injected
        against the table before the reload: they are dropped.
        """
        asked = [(command, pending) for command, pending in batch if pending is not None]
        command = None if self.state is None else self.aggregate.recovered(self.state, self.clock.now_ms())
        if command is None:  # nothing holds a lease: the table starts empty
            self.leases.clear()
            self._restart_pending = False
            return asked
        return [(command, None), *asked]

    def _decide(self, batch: Sequence[tuple[C, Answer | None]]) -> _Outcome[S, E]:
        """Decide `batch`, then the follow-ups its events call for (see `follow_ups`)."""
        outcome: _Outcome[S, E] = _Outcome(self.state)
        durable_so_far = 0
        leases = BatchLeases(self.leases)
        queue = list(batch)
        shown = index = 0  # how many of `every` the follow-ups saw; of `queue` were decided
        while True:
            for command, pending in queue[index:]:
                expect = getattr(pending, "expect", None)
                if expect is not None and expect != self._revision + durable_so_far:
                    at = self._revision + durable_so_far
                    outcome.answers.append(
                        (pending, PreconditionFailed(f"the resource is at revision {at}, not {expect}"))
                    )
                    continue
                try:
                    outcome.working, events = self.aggregate.execute(outcome.working, command, leases)
                except CoordinationError as refusal:
                    outcome.answers.append((pending, refusal))
                    continue
                outcome.answers.append((pending, Reply(outcome.working, events)))
                outcome.every.extend(events)
                leases.note(events)
                durable_so_far += sum(1 for e in events if getattr(e, "durable", True))
            index = len(queue)
            every = outcome.every
            if self.follow_ups is None or outcome.working is None or shown == len(every):
                return outcome
            more = self.follow_ups(outcome.working, every[shown:])
            shown = len(every)
            if not more:
                return outcome
            queue.extend(more)
            outcome.followed.extend(slot for _, slot in more)
            self._in_flight.extend(slot for _, slot in more)  # failed with the batch, or on a stop

    async def _decide_and_persist(self, batch: Sequence[tuple[C, Answer | None]]) -> None:
        outcome = self._decide(batch)
        working, answers, every = outcome.working, outcome.answers, outcome.every
        durable = [e for e in every if getattr(e, "durable", True)]
        if durable and working is not None:
            try:
                await self._persist(durable, working)
            except ConcurrencyConflict:
                # The batch is decided again, on the reloaded state, without them: nothing of
                # theirs was written; their askers ask again.
                for slot in outcome.followed:
                    slot.fail(Redecide("the batch was decided again: ask again"))
                    self._in_flight.remove(slot)
                raise
        # Readers of `state` see the new state only once its side effects ran (a new
        # layout's shard keys and consumer groups exist before anyone routes to them).
        before = self.state
        try:
            if self.needs_repair and working is not None:
                await self._repair(working)
            if every and working is not None:
                try:
                    await self.aggregate.after_persist(before, working, every)
                except StoreError as exc:
                    what = f"{self.aggregate.aggregate_id}: side effects failed, will repair: {exc}"
                    store_failed(log, exc, what)
                    self.needs_repair = True
        finally:
            self.state = working
            self.revision = self._revision  # what readers see: the revision of `state`
            self.leases.apply(every)  # the write succeeded (or there was none): liveness follows
            self._restart_pending = False
        for pending, answer in answers:
            if pending is None:
                continue
            if isinstance(answer, CoordinationError):
                pending.fail(answer)
            else:
                pending.resolve(answer)
        self._in_flight = []  # answered: what follows (the batch's bookkeeping) fails nobody
        if every and working is not None:
            self._unkept.extend(every)
        if (self._unkept or self._checkpoint_due) and self._books_since is None:
            self._books_since = trio.current_time()

    async def _keep_books_unless_busy(self) -> None:
        """Do the bookkeeping the batches answered so far left (`_keep_books`), unless commands
        wait in the inbox and it has waited less than `MAX_BOOKKEEPING_DELAY_S`: batches that
        arrive together (a fleet's workers in step) are answered first, one after another."""
        if self._books_since is None:
            return
        if self.inbox_depth and trio.current_time() - self._books_since < MAX_BOOKKEEPING_DELAY_S:
            await answers_first()  # (the answered send theirs before the next batch is decided)
            return
        await self._keep_books()

    async def _keep_books(self) -> None:
        """What nobody's answer waits for, once the batches are answered: the side effects of
        `after_answer` for all their events, from the current state, then the checkpoint
        `_persist` found due. A failure of either is left for later (a repair, the next write's
        checkpoint); a conflict is the next batch's to meet."""
        self._books_since = None
        events, self._unkept = self._unkept, []
        if events and self.state is not None:
            try:
                await self.aggregate.after_answer(self.state, events)
            except StoreError as exc:
                store_failed(
                    log, exc, f"{self.aggregate.aggregate_id}: side effects failed, will repair: {exc}"
                )
                self.needs_repair = True
        if self._checkpoint_due and self.state is not None:
            await answers_first()
            await self._write_checkpoint(self.state)

    async def _persist(self, durable: list[E], state: S) -> None:
        entries = [self.aggregate.event_to_json(e) for e in durable]
        # Only what the deployment's finalized feature level allows (`NotFinalized`: a bug, or a
        # level lowered between the decision and the write).
        level = (await self.store.features.current()).level
        check_writable([kind for kind, _ in entries], level)
        check_levels(durable, level)
        tail_bytes = self._tail_bytes + sum(len(data) for _, data in entries)
        appended = await self.store.append(self.aggregate.aggregate_id, self._revision, entries)
        self.writes += 1
        self._revision = appended.revision
        self._tail_bytes = tail_bytes
        # A checkpoint is written once the batch is answered (`_keep_books`): rendering and
        # storing a large state (a group of 1,000 members: about 370 KB) is no asker's wait.
        self._checkpoint_due = (
            self._revision - self.checkpoint_revision >= self.settings.checkpoint_every
            and tail_bytes >= self._checkpoint_bytes
        )

    async def _write_checkpoint(self, state: S) -> None:
        """Write `state`, the aggregate at `_revision`, as a checkpoint (no events): a reload reads
        it and the events after it. If the write fails or meets another writer (the next batch
        meets that conflict itself), the next durable write makes it due again: not every batch
        after it (with Redis hanging, each would wait for it)."""
        self._checkpoint_due = False
        checkpoint = self.aggregate.checkpoint_json(state)
        try:
            appended = await self.store.append(self.aggregate.aggregate_id, self._revision, [], checkpoint)
        except ConcurrencyConflict:
            return
        except StoreError as exc:
            store_failed(
                log, exc, f"{self.aggregate.aggregate_id}: checkpoint not written, will retry: {exc}"
            )
            return
        self._checkpointed(appended.revision, checkpoint)

    def _checkpointed(self, revision: int, data: str) -> None:
        self.checkpoint_revision = revision
        self._checkpoint_bytes, self._tail_bytes = len(data), 0
        self._checkpoint_due = False

    async def _repair(self, state: S) -> None:
        try:
            await self.aggregate.repair(state, after_loss=self.after_loss)
            self.needs_repair = self.after_loss = False
        except StoreError as exc:
            store_failed(log, exc, f"{self.aggregate.aggregate_id}: repair failed, will retry: {exc}")

    async def _reload(self) -> None:
        """Load the aggregate afresh, unless Redis holds less than this actor wrote: revisions only
        grow, so that is a loss (a restart without persistence, FLUSHALL, a rollback), and what
        the actor holds is written back instead of forgotten."""
        loaded = await self.store.load(self.aggregate.aggregate_id)
        if self.state is not None and loaded.revision < self._revision:
            # The lease table still describes this state: leases go on as they were.
            await self._restore(loaded.revision, f"revision {loaded.revision} stored")
            return
        remembered, self.remembered = self.remembered, None
        if self.state is None and remembered is not None and loaded.revision < remembered[0]:
            # This process wrote more in its previous term (it ended while Redis failed over,
            # say) than Redis holds now: a loss or a rollback. What it remembers is newer than
            # anything stored: written back, as by a running actor.
            self._revision, self.state = remembered
            self._restart_pending = True  # a fresh lease table: every member gets a whole lease
            await self._restore(
                loaded.revision, f"revision {loaded.revision} stored, {remembered[0]} in the last term"
            )
            return
        self.state = fold_loaded(self.aggregate, loaded)
        self._revision = self.revision = loaded.revision
        self._checkpoint_due = False  # (decided again by the next write)
        # (what bookkeeping was owed is done by the repair a reload calls for)
        self._unkept, self._books_since = [], None
        self.checkpoint_revision = loaded.checkpoint.revision if loaded.checkpoint else 0
        self._checkpoint_bytes = len(loaded.checkpoint.data) if loaded.checkpoint else 0
        self._tail_bytes = sum(len(entry.data) for entry in loaded.events)
        # Nothing stored (a name used for the first time): no side effect to repair; creating
        # it runs its own (`after_persist`), not twice.
        self.needs_repair = self.state is not None or self.after_loss
        self._restart_pending = True  # the lease table describes the state before the reload

    async def _reload_quietly(self) -> None:
        try:
            await self._reload()
        except StoreError as exc:
            store_failed(log, exc, f"{self.aggregate.aggregate_id}: reload failed: {exc}")

    async def _recover(self) -> None:
        """Restart liveness (an empty batch starts with `recovered()`) and repair side effects."""
        if self.state is None:
            return
        await self._process([])
        if self.needs_repair and self.state is not None:
            await self._repair(self.state)


def fold_loaded(aggregate: Aggregate[S, C, E], loaded: Loaded) -> S | None:
    """The state a `Loaded` journal tail describes: checkpoint, then each event."""
    state = aggregate.state_from_json(loaded.checkpoint.data) if loaded.checkpoint else None
    for entry in loaded.events:
        state = aggregate.evolve(state, aggregate.event_from_json(entry.data, entry.version))
    return state
