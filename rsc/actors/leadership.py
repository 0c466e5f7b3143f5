"""The coordinator lease: one active coordinator per Redis; the others are hot standbys.

The rules this module keeps:

* The lease is one key, `rsc:v1:{coordinator}:lease`: JSON `{"holder",
  "token", "url"}` that expires `ttl` after it was last taken or renewed.
  Only Lua scripts that compare holder and token take, renew or delete it.
* Every acquisition takes a new token from `INCR rsc:v1:{coordinator}:token`:
  tokens only grow and every term has its own. The token fences the journal
  (`rsc.actors.store`): a deposed coordinator's appends are refused.
* Tokens keep growing when Redis loses or rolls back the counter (a restart
  without persistence, FLUSHALL, a lagging replica promoted, an older RDB):
  each process remembers the highest token it has seen (its own, the
  holder's in a lease it read, a fence found on an aggregate) and an
  acquisition starts above it, as a ZooKeeper leader starts its epoch above
  the highest it has seen.
* A term is *active* until its deadline: the send time of the last
  successful renewal (or of the acquisition) + ttl - safety margin, on
  trio's clock. Redis keeps the key until ttl after it *received* that
  renewal, which is later: so the holder stops acting as active before
  anyone else can take the lease. This needs no agreement between clocks,
  only that they run at about the same rate (the margin, a fifth of ttl).
* `active`, `term` and `token()` read the clock each time they are asked,
  so a process resumed after a pause (SIGSTOP, a frozen VM, a long GC)
  finds its term over before any of its tasks acts on it.
* The holder renews every ttl/3 and retries a failed renewal soon, until
  the deadline. When the deadline passes, or a renewal finds another holder
  in the lease, the term ends: `run` calls `on_term_end` (stop every actor)
  and goes back to standby, trying to acquire again. A renewal that finds
  the lease gone, or naming this holder with an older token, finds Redis
  lost data: nobody else holds it, so the holder takes it back at once with a
  new token (one script: whoever comes first wins) and the term goes on, its
  actors keeping what they know to correct the store (`on_lease_lost`).
* A standby tries again when the lease it saw would expire (at most every
  ttl/4), so a takeover after a crash comes within about one ttl.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import attrs
import coredis
import trio

from rsc.actors.errors import StoreUnavailable, TermFenced
from rsc.actors.health import REDIS_OUTAGE, store_failed
from rsc.actors.keys import DEFAULT_KEYS, KeySpace
from rsc.actors.store_connection import redis_errors
from rsc.lua import script

log = logging.getLogger("rsc.leadership")

#: The holder stops acting as active this fraction of the ttl before its lease can end.
SAFETY_MARGIN = 0.2
#: How often the holder renews, per ttl.
RENEWALS_PER_TTL = 3
#: A standby looks at least this often per ttl (the lease may have been released).
LOOKS_PER_TTL = 4


@attrs.frozen
class LeaseHolder:
    """What the lease key says: who holds it, with which token, where clients reach it."""

    holder: str
    token: int
    url: str | None = None


@attrs.frozen
class Acquired:
    token: int


@attrs.frozen
class Held:
    """Another coordinator holds the lease, for at most `remaining_s` more unless it renews."""

    by: LeaseHolder
    remaining_s: float


class LeaseBackend(Protocol):
    """Where the lease lives: Redis (`RedisLease`), or memory for tests (`MemoryLease`)."""

    async def acquire(self, holder: str, url: str | None, ttl_ms: int, floor: int = 0) -> Acquired | Held:
        """Take the lease with a new token above `floor`, unless another holder has it (then `Held`)."""
        ...

    async def retake(self, holder: str, url: str | None, ttl_ms: int, floor: int) -> int | None:
        """Take the lease back with a new token above `floor` if nobody else holds it: it is
        gone, or it names `holder` with another token (Redis lost or rolled back data). None
        when another holder has it."""
        ...

    async def renew(self, holder: str, token: int, url: str | None, ttl_ms: int) -> bool:
        """Extend the lease by ttl from now; False when it is no longer this holder's with this token."""
        ...

    async def release(self, holder: str, token: int) -> None:
        """Delete the lease if it is still this holder's with this token."""
        ...

    async def current(self) -> LeaseHolder | None:
        """Who holds the lease now (None: nobody)."""
        ...


def lease_holder(raw: str) -> LeaseHolder:
    """The lease key's JSON as a `LeaseHolder`."""
    data = json.loads(raw)
    return LeaseHolder(str(data["holder"]), int(data["token"]), str(data.get("url") or "") or None)


class RedisLease:
    """The lease on Redis (standalone or cluster: both keys share the `{coordinator}` tag).

    With `replicas` (`coordinator_lease_replicas`), an acquisition or renewal counts only once
    that many replicas have it (`WAIT`, within `wait_ms`): a replica promoted after a failover
    then holds a lease at least as new as the one the active coordinator counts on, so no
    other coordinator takes it over while that one believes it is active (no split brain).
    Not acknowledged in time: `StoreUnavailable`, as Redis away (the coordinator stays active
    only until the last acknowledged renewal's lease ends)."""

    def __init__(
        self, redis: Any, keys: KeySpace = DEFAULT_KEYS, replicas: int = 0, wait_ms: int = 500
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.replicas = replicas
        self.wait_ms = wait_ms
        self._acquire = redis.register_script(script("coordinator/acquire_lease"))
        self._renew = redis.register_script(script("coordinator/renew_lease"))
        self._release = redis.register_script(script("coordinator/release_lease"))

    @contextlib.contextmanager
    def _replicated(self, what: str) -> Iterator[None]:
        if not self.replicas:
            yield
            return
        try:
            with self.redis.ensure_replication(self.replicas, self.wait_ms):
                yield
        except coredis.exceptions.ReplicationError as exc:
            raise StoreUnavailable(
                f"{what}: fewer than {self.replicas} replica(s) acknowledged it within {self.wait_ms} ms "
                "(coordinator_lease_replicas)"
            ) from exc

    async def acquire(self, holder: str, url: str | None, ttl_ms: int, floor: int = 0) -> Acquired | Held:
        keys = [self.keys.coordinator_lease, self.keys.coordinator_token]
        with (
            self._replicated("acquiring the coordinator lease"),
            redis_errors("acquiring the coordinator lease"),
        ):
            result = await self._acquire(keys=keys, args=[holder, url or "", ttl_ms, floor])
        if result[0] == "acquired":
            return Acquired(int(result[1]))
        return Held(lease_holder(result[1]), max(0, int(result[2])) / 1000)

    async def retake(self, holder: str, url: str | None, ttl_ms: int, floor: int) -> int | None:
        # The lease is gone or names this holder: ACQUIRE takes it (another holder: `Held`).
        outcome = await self.acquire(holder, url, ttl_ms, floor)
        return outcome.token if isinstance(outcome, Acquired) else None

    async def renew(self, holder: str, token: int, url: str | None, ttl_ms: int) -> bool:
        with (
            self._replicated("renewing the coordinator lease"),
            redis_errors("renewing the coordinator lease"),
        ):
            result = await self._renew(
                keys=[self.keys.coordinator_lease], args=[holder, token, url or "", ttl_ms]
            )
        return bool(result)

    async def release(self, holder: str, token: int) -> None:
        with redis_errors("releasing the coordinator lease"):
            await self._release(keys=[self.keys.coordinator_lease], args=[holder, token])

    async def current(self) -> LeaseHolder | None:
        with redis_errors("reading the coordinator lease"):
            raw = await self.redis.get(self.keys.coordinator_lease)
        return None if raw is None else lease_holder(raw)


class MemoryLease:
    """The lease in memory, expiring on trio's clock: a faithful fake for tests under MockClock."""

    def __init__(self) -> None:
        self.lease: LeaseHolder | None = None
        self.expires_at = 0.0
        self.counter = 0

    def _live(self) -> LeaseHolder | None:
        if self.lease is not None and trio.current_time() >= self.expires_at:
            self.lease = None
        return self.lease

    async def acquire(self, holder: str, url: str | None, ttl_ms: int, floor: int = 0) -> Acquired | Held:
        await trio.lowlevel.checkpoint()
        live = self._live()
        if live is not None and live.holder != holder:
            return Held(live, self.expires_at - trio.current_time())
        self.counter = max(self.counter + 1, floor + 1)
        self.lease = LeaseHolder(holder, self.counter, url)
        self.expires_at = trio.current_time() + ttl_ms / 1000
        return Acquired(self.counter)

    async def retake(self, holder: str, url: str | None, ttl_ms: int, floor: int) -> int | None:
        outcome = await self.acquire(holder, url, ttl_ms, floor)
        return outcome.token if isinstance(outcome, Acquired) else None

    def lose_everything(self) -> None:
        """What a Redis restart without persistence (or FLUSHALL) does to these keys."""
        self.lease = None
        self.counter = 0

    async def renew(self, holder: str, token: int, url: str | None, ttl_ms: int) -> bool:
        await trio.lowlevel.checkpoint()
        live = self._live()
        if live is None or (live.holder, live.token) != (holder, token):
            return False
        self.lease = LeaseHolder(holder, token, url)
        self.expires_at = trio.current_time() + ttl_ms / 1000
        return True

    async def release(self, holder: str, token: int) -> None:
        await trio.lowlevel.checkpoint()
        live = self._live()
        if live is not None and (live.holder, live.token) == (holder, token):
            self.lease = None

    async def current(self) -> LeaseHolder | None:
        await trio.lowlevel.checkpoint()
        return self._live()


@attrs.define
class Term:
    """One tenure as the active coordinator."""

    token: int
    #: When it began (trio's clock): the send time of the acquisition.
    started_at: float
    #: Moves forward with each renewal; past it, this process is not active.
    deadline: float


def default_holder_id() -> str:
    """Names this process in the lease: host, pid and a random part (two per process are possible)."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


class Leadership:
    """This process's side of the lease: `run` it; ask `active` / `token()` before acting."""

    def __init__(
        self,
        backend: LeaseBackend,
        ttl_ms: int = 4_000,
        *,
        holder_id: str | None = None,
        advertise_url: str | None = None,
    ) -> None:
        self.backend = backend
        self.ttl_ms = ttl_ms
        self.ttl_s = ttl_ms / 1000
        self.holder_id = holder_id or default_holder_id()
        #: What the lease tells standbys (and they tell clients): where this coordinator answers.
        self.advertise_url = advertise_url
        #: The active coordinator's URL as last seen in the lease (None: unknown).
        self.active_url: str | None = None
        #: How many terms this process has held.
        self.terms = 0
        self._term: Term | None = None
        self._last_token: int | None = None
        #: The highest fencing token this process has seen (its own, a holder's in the lease, a
        #: fence found on an aggregate): after Redis lost or rolled back the counter, new tokens
        #: start above it, so no token is handed out twice while one process remembers it.
        self.highest_seen = 0
        #: Told (synchronously) when the lease was found gone or rolled back while this process
        #: held it: Redis lost data (`rsc.actors.dataset`).
        self.on_lease_lost: Callable[[str], None] = lambda why: None
        #: Told when the lease is seen held by another coordinator (this process's memory of
        #: its earlier terms is then stale: `Registry.forget_terms`).
        self.on_other_holder: Callable[[], None] = lambda: None
        #: Why the last look at the lease failed (Redis unreachable), or None when it worked.
        self.unreachable: str | None = None

    # --- asking -----------------------------------------------------------

    @property
    def margin_s(self) -> float:
        return self.ttl_s * SAFETY_MARGIN

    @property
    def term(self) -> Term | None:
        """The active term, if its deadline has not passed (read from the clock now)."""
        term = self._term
        if term is None or trio.current_time() >= term.deadline:
            return None
        return term

    @property
    def active(self) -> bool:
        return self.term is not None

    def token(self) -> int:
        """The active term's fencing token; raises `TermFenced` when this process holds no active term."""
        term = self.term
        if term is None:
            raise TermFenced("this coordinator holds no active term (it is a standby)")
        return term.token

    def active_elsewhere(self) -> str | None:
        """The URL of the coordinator that holds the lease, when it is not this one (as last seen)."""
        if self.active or self.active_url == self.advertise_url:
            return None
        return self.active_url

    # --- running ----------------------------------------------------------

    async def run(
        self,
        on_term_end: Callable[[], None] = lambda: None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Hold terms for as long as it runs: standby, active, standby... forever.

        One acquisition is tried before `task_status.started()`, so a
        coordinator that finds the lease free is active when it starts.
        `on_term_end` is called (synchronously) as soon as a term ends.
        """
        outcome = await self._attempt()
        task_status.started()
        while True:
            while not isinstance(outcome, Term):
                await trio.sleep(outcome)
                outcome = await self._attempt()
            try:
                await self._hold(outcome)
            finally:
                self._term = None
                self.active_url = None
                on_term_end()
            outcome = 0.0

    async def advertise(self, url: str | None) -> None:
        """Set the URL standbys name to clients; holding the lease, write it there at once."""
        self.advertise_url = url
        term = self.term
        if term is None or url is None:
            return
        self.active_url = url
        try:  # only the URL changes: the key lives longer, this process's deadline does not move
            await self.backend.renew(self.holder_id, term.token, url, self.ttl_ms)
        except StoreUnavailable as exc:
            log.warning("could not advertise %s in the coordinator lease yet: %s", url, exc)

    async def release(self, backend: LeaseBackend | None = None) -> bool:
        """Give the lease up (on the way out, every actor stopped): a standby takes over at once.

        `backend` replaces this process's own for the call (after a cancellation its
        connections may be unusable). True when nothing is left to release.
        """
        self._term = None
        if self._last_token is None:
            return True
        try:
            await (backend or self.backend).release(self.holder_id, self._last_token)
        except StoreUnavailable as exc:
            log.info("could not release the coordinator lease: %s", exc)
            return False
        log.info("released the coordinator lease (token %d)", self._last_token)
        self._last_token = None
        return True

    async def _attempt(self) -> Term | float:
        """Try to acquire once: the new term, or how long to wait before trying again."""
        sent = trio.current_time()
        try:
            outcome = await self.backend.acquire(
                self.holder_id, self.advertise_url, self.ttl_ms, self.highest_seen
            )
        except StoreUnavailable as exc:
            store_failed(log, exc, f"standby: cannot reach the coordinator lease: {exc}")
            self.unreachable = str(exc)
            return self.ttl_s / LOOKS_PER_TTL
        self.unreachable = None
        REDIS_OUTAGE.ok()
        if isinstance(outcome, Held):
            if outcome.by.holder != self.holder_id:
                self.on_other_holder()
            self.highest_seen = max(self.highest_seen, outcome.by.token)
            if outcome.by.url != self.active_url:
                log.info("standby: %s (%s) is active", outcome.by.holder, outcome.by.url or "no url")
            self.active_url = outcome.by.url
            return min(outcome.remaining_s + 0.005, self.ttl_s / LOOKS_PER_TTL)
        term = Term(outcome.token, sent, sent + self.ttl_s - self.margin_s)
        self.highest_seen = max(self.highest_seen, term.token)
        self._term = term
        self._last_token = term.token
        self.active_url = self.advertise_url
        self.terms += 1
        log.info("active: took the coordinator lease with token %d", term.token)
        return term

    async def advance(self, floor: int) -> bool:
        """Move this term's token above `floor` (a fence found on an aggregate that is higher than
        our token while we hold the lease: Redis lost or rolled back the token counter, not a
        newer term, which would hold the lease). False when no longer active."""
        self.highest_seen = max(self.highest_seen, floor)
        term = self.term
        if term is None:
            return False
        if term.token > floor:
            return True
        try:
            token = await self.backend.retake(self.holder_id, self.advertise_url, self.ttl_ms, floor)
        except StoreUnavailable:
            return False
        if token is None or self.term is not term:
            return False
        log.warning(
            "a fence (token %d) above this term's token %d, with the lease still ours: Redis lost or "
            "rolled back the token counter; this term goes on with token %d",
            floor,
            term.token,
            token,
        )
        self._set_token(term, token)
        self.on_lease_lost(f"the fencing-token counter went back below token {floor}")
        return True

    def _set_token(self, term: Term, token: int) -> None:
        term.token = token
        self._last_token = token
        self.highest_seen = max(self.highest_seen, token)

    async def _retake(self, term: Term) -> bool:
        """The renewal found the lease gone or not as this term left it. If nobody else holds it,
        Redis lost or rolled it back (a restart without persistence, FLUSHALL, a failover to a
        replica that missed the last writes): take it back at once, with a token above every one
        seen, and go on (the actors keep what they know and correct the store)."""
        floor = max(self.highest_seen, term.token)
        try:
            token = await self.backend.retake(self.holder_id, self.advertise_url, self.ttl_ms, floor)
        except StoreUnavailable:
            return False
        if token is None:
            return False
        log.warning(
            "the coordinator lease (token %d) was gone or rolled back while held, and nobody else "
            "holds it: Redis lost data; took it back with token %d",
            term.token,
            token,
        )
        self._set_token(term, token)
        self.on_lease_lost("the coordinator lease was gone or rolled back while held")
        return True

    async def _hold(self, term: Term) -> None:
        """Renew until the lease is lost or the deadline passes; then return."""
        every = self.ttl_s / RENEWALS_PER_TTL
        next_renewal = term.started_at + every
        with trio.move_on_at(term.deadline) as scope:
            while True:
                await trio.sleep_until(next_renewal)
                sent = trio.current_time()
                try:
                    kept = await self.backend.renew(
                        self.holder_id, term.token, self.advertise_url, self.ttl_ms
                    )
                except StoreUnavailable as exc:
                    store_failed(log, exc, f"renewing the coordinator lease failed: {exc}")
                    self.unreachable = str(exc)
                    next_renewal = trio.current_time() + every / 4
                    continue
                self.unreachable = None
                REDIS_OUTAGE.ok()
                if not kept and not await self._retake(term):
                    log.warning("standby: the coordinator lease (token %d) was lost", term.token)
                    return
                term.deadline = sent + self.ttl_s - self.margin_s
                scope.deadline = term.deadline
                next_renewal = sent + every
        log.warning("standby: no renewal of the coordinator lease (token %d) succeeded in time", term.token)
