"""The deployment's finalized feature level, kept in Redis, and the coordinators' registry.

Keys (both with the `{coordinator}` hash tag, next to the lease):

* `rsc:v1:{coordinator}:features`: hash `level` (finalized: what coordinators may
  write), `written` (the highest level whose data has been written: the level can
  be lowered to no less), `changedAtMs`, `changedBy`. A deployment without it is
  initialized once, atomically, by the first coordinator of a release that knows
  it: at level 1 if streams exist there already (made by 0.1.0: a deployment being
  upgraded), else at the level `rsc serve` is configured to start new deployments
  at (`RSC_INITIAL_FEATURE_LEVEL`, default the highest it knows).
* `rsc:v1:{coordinator}:coordinators`: hash holder id -> JSON `{"version",
  "featureLevel", "seenMs"}`, written by every coordinator (active or standby) every
  few seconds and removed when it stops. Coordinators of 0.1.0 do not register;
  one holding the lease is still seen (its holder id is not in the registry).

The active coordinator reads the level at the start of each term (a standby may
have been told of a change it did not make) and before it writes: the journal
schema it appends with is the one its level allows (`rsc.events.versions`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import trio

from rsc import __version__
from rsc.actors.errors import FeatureLevelMoved, StoreError, StoreUnavailable, UnsupportedFeatureLevel
from rsc.actors.keys import DEFAULT_KEYS, KeySpace
from rsc.actors.leadership import LeaseBackend
from rsc.actors.store_connection import redis_errors
from rsc.events.versions import (
    BASELINE_FEATURE_LEVEL,
    MAX_FEATURE_LEVEL,
    Party,
    feature_level,
    level_of_schema,
)
from rsc.lua import script

log = logging.getLogger("rsc.features")

FEATURES_KEY = DEFAULT_KEYS.features
COORDINATORS_KEY = DEFAULT_KEYS.coordinators
#: A registered coordinator counts as running while it wrote its entry at most this long ago.
REGISTRATION_FRESH_MS = 30_000
#: How often a coordinator writes its registry entry.
REGISTER_EVERY_S = 5.0


@attrs.frozen
class FeatureState:
    level: int
    written: int


def unsupported(level: int) -> UnsupportedFeatureLevel:
    return UnsupportedFeatureLevel(
        f"the deployment is finalized at feature level {level}; this release ({__version__}) runs "
        f"at levels 1 to {MAX_FEATURE_LEVEL}: run a release that supports level {level}"
    )


class FeatureSource(Protocol):
    """The deployment's feature level, as a store and the HTTP layer use it."""

    #: Redis lost the deployment's record with its past: one initialized now starts at 1.
    history_found: bool

    @property
    def level(self) -> int: ...

    async def current(self) -> FeatureState: ...

    async def load(self) -> FeatureState: ...

    async def peek(self) -> FeatureState | None:
        """The level as Redis holds it now, read only (None: not recorded yet)."""
        ...

    async def schema_for_write(self, needed: Needed = BASELINE_FEATURE_LEVEL) -> int:
        """The journal schema to append with now, the level written raised first to cover it
        and `needed` (the highest level of the events appended, or that as a function of the
        level they are written at)."""
        ...

    async def finalize(self, level: int, by: str, expected: int | None = None) -> FeatureState: ...


#: What a write needs marked written: a level, or one as a function of the finalized level
#: (the version of an event's data written depends on it: `rsc.events.versions.written_level`).
Needed = int | Callable[[int], int]


def needed_at(needed: Needed, level: int) -> int:
    """`needed` at the finalized `level`."""
    return needed(level) if callable(needed) else needed


class StaticFeatures:
    """`Features` kept in memory (with `MemoryStore`, in tests): the same rules, no Redis."""

    def __init__(self, level: int = MAX_FEATURE_LEVEL, written: int = BASELINE_FEATURE_LEVEL) -> None:
        self.state = FeatureState(level, written)
        self.history_found = False

    @property
    def level(self) -> int:
        return self.state.level

    async def current(self) -> FeatureState:
        return self.state

    async def load(self) -> FeatureState:
        return self.state

    async def peek(self) -> FeatureState | None:
        return self.state

    async def schema_for_write(self, needed: Needed = BASELINE_FEATURE_LEVEL) -> int:
        schema = feature_level(self.state.level).journal_schema
        written = max(self.state.written, level_of_schema(schema), needed_at(needed, self.state.level))
        self.state = FeatureState(self.state.level, written)
        return schema

    async def finalize(self, level: int, by: str, expected: int | None = None) -> FeatureState:
        if not 1 <= level <= MAX_FEATURE_LEVEL:
            raise unsupported(level)
        if expected is not None and expected != self.state.level:
            raise FeatureLevelMoved(
                "the feature level changed meanwhile", self.state.level, self.state.written
            )
        if self.state.written > level:
            raise FeatureLevelMoved(
                f"data of feature level {self.state.written} has been written: the level cannot go below it",
                self.state.level,
                self.state.written,
            )
        self.state = FeatureState(level, self.state.written)
        return self.state


class Features:
    """The finalized level as this coordinator knows it, read again at each new term."""

    def __init__(
        self,
        redis: Any,
        initial_level: int = MAX_FEATURE_LEVEL,
        term: Callable[[], int] | None = None,
        keys: KeySpace = DEFAULT_KEYS,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.initial_level = initial_level
        #: The current term's token (None: one reader, as `rsc journal`); a new one reloads.
        self.term = term
        self._state: FeatureState | None = None
        self._loaded_in: int | None = None
        self._lock = trio.Lock()
        #: The deployment has a past that Redis lost (a stream rebuilt from what the fleet
        #: reports): a record initialized now starts at the baseline, as for an upgrade, not at
        #: `initial_level` (which would lock N-1 coordinators and their journal readers out).
        self.history_found = False
        self._init = redis.register_script(script("coordinator/init_features"))
        self._mark = redis.register_script(script("coordinator/mark_level_written"))
        self._finalize = redis.register_script(script("coordinator/finalize_level"))

    @property
    def level(self) -> int:
        """The finalized level as last read (the baseline before the first read)."""
        return self._state.level if self._state is not None else BASELINE_FEATURE_LEVEL

    async def current(self) -> FeatureState:
        """The finalized level and the highest written (initializing them on first use)."""
        term = self.term() if self.term is not None else None
        if self._state is None or term != self._loaded_in:
            await self.load()
            self._loaded_in = term
        assert self._state is not None
        return self._state

    async def load(self) -> FeatureState:
        with redis_errors("reading the feature level"):
            start, start_written = self.initial_level, BASELINE_FEATURE_LEVEL
            if self._state is not None:
                # This process knew the record (read at start-up or since): gone now, Redis lost
                # it; written back as known, never re-initialized at the newest level.
                start, start_written = self._state.level, self._state.written
            elif not await self.redis.exists([self.keys.features]) and (
                self.history_found or await self.redis.exists([self.keys.streams])
            ):
                # Streams made by 0.1.0 (an upgrade), or a deployment whose record Redis lost
                # (rebuilt from the fleet, which may hold N-1 parts): start at 1.
                start = BASELINE_FEATURE_LEVEL
            level, written = await self._init(
                keys=[self.keys.features], args=[start, start_written, _now_ms()]
            )
        state = FeatureState(int(level), int(written or BASELINE_FEATURE_LEVEL))
        if state.level > MAX_FEATURE_LEVEL:
            raise unsupported(state.level)
        if self._state is not None and self._state.level != state.level:
            log.info("feature level %d (was %d)", state.level, self._state.level)
        self._state = state
        return state

    def known(self, state: FeatureState) -> None:
        """The record as read without initializing it (start-up): remembered, so that a record
        Redis loses before this process's first write is written back at this level."""
        if self._state is None:
            self._state = state

    async def restore(self) -> None:
        """Redis lost data: write the level back as this coordinator knows it (the record is
        gone too after a FLUSHALL: re-initializing it at the newest level would lock an N-1
        standby out). Nothing is written if the record exists or the level was never read."""
        known = self._state
        if known is None:
            return
        with redis_errors("restoring the feature level"):
            level, written = await self._init(
                keys=[self.keys.features], args=[known.level, known.written, _now_ms()]
            )
        if (int(level), int(written or BASELINE_FEATURE_LEVEL)) == (known.level, known.written):
            log.info("feature level %d (written %d) restored after a loss", known.level, known.written)

    async def peek(self) -> FeatureState | None:
        with redis_errors("reading the feature level"):
            raw = await self.redis.hgetall(self.keys.features)
        if "level" not in raw:
            return None
        return FeatureState(int(raw["level"]), int(raw.get("written", BASELINE_FEATURE_LEVEL)))

    async def schema_for_write(self, needed: Needed = BASELINE_FEATURE_LEVEL) -> int:
        """The journal schema to append with now; marks its level (or `needed`, the highest
        level of the events appended, if higher: a function of the level read here when the
        events' data depends on it) written first.

        Under the lock `finalize` takes, and decided from the level read under it: a level
        lowered meanwhile is seen here, and one lowered after this returns finds `written`
        raised already and is refused. The mark itself is refused if another coordinator
        changed the level (then it is read again)."""
        state = await self.current()
        if (
            max(level_of_schema(feature_level(state.level).journal_schema), needed_at(needed, state.level))
            <= state.written
        ):
            return feature_level(state.level).journal_schema  # the usual case: nothing to mark
        async with self._lock:
            for _ in range(3):
                state = await self.current()
                schema = feature_level(state.level).journal_schema
                mark = max(level_of_schema(schema), needed_at(needed, state.level))
                if mark <= state.written:
                    return schema
                with redis_errors("recording the feature level written"):
                    done = await self._mark(keys=[self.keys.features], args=[state.level, mark])
                if done:
                    self._state = FeatureState(state.level, mark)
                    return schema
                await self.load()  # changed by another coordinator: read it again
        raise StoreUnavailable("the feature level keeps changing; retry")

    async def finalize(self, level: int, by: str, expected: int | None = None) -> FeatureState:
        """Move the finalized level to `level` (`FeatureLevelMoved` if it cannot be lowered
        that far, or is no longer `expected`: the level the caller decided on)."""
        if not 1 <= level <= MAX_FEATURE_LEVEL:
            raise unsupported(level)
        async with self._lock:
            state = await self.load()
            with redis_errors("finalizing the feature level"):
                outcome, now, written = await self._finalize(
                    keys=[self.keys.features],
                    args=[state.level if expected is None else expected, level, _now_ms(), by],
                )
            if outcome == "moved":
                await self.load()
                raise FeatureLevelMoved(
                    f"the feature level changed meanwhile (it is {now} now): look again",
                    int(now),
                    int(written),
                )
            if outcome == "written":
                raise FeatureLevelMoved(
                    f"data of feature level {written} has been written: the level cannot go below it",
                    int(now),
                    int(written),
                )
            self._state = FeatureState(int(now), int(written))
            if level != state.level:
                log.warning("feature level finalized at %d (was %d) by %s", level, state.level, by)
            else:  # asked again for the level it has: nothing changed
                log.info("feature level stays at %d (asked by %s)", level, by)
            return self._state


@attrs.frozen
class Registration:
    """A coordinator as its registry entry says."""

    holder: str
    version: str
    feature_level: int
    seen_ms: int


async def register(
    redis: Any, holder: str, every_s: float = REGISTER_EVERY_S, keys: KeySpace = DEFAULT_KEYS
) -> None:
    """Keep this coordinator's registry entry fresh while it runs; remove it on the way out."""
    entry = json.dumps({"version": __version__, "featureLevel": MAX_FEATURE_LEVEL})
    try:
        while True:
            data = json.loads(entry) | {"seenMs": _now_ms()}
            try:
                with redis_errors("registering this coordinator"):
                    await redis.hset(keys.coordinators, {holder: json.dumps(data)})
            except StoreError as exc:
                log.debug("could not register: %s", exc)
            await trio.sleep(every_s)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            try:  # best effort: an entry left behind goes stale by itself
                await redis.hdel(keys.coordinators, [holder])
            except Exception as exc:  # the connection may be gone on the way out
                log.debug("could not unregister: %r", exc)


async def registrations(redis: Any, keys: KeySpace = DEFAULT_KEYS) -> list[Registration]:
    """The registered coordinators seen within `REGISTRATION_FRESH_MS`."""
    with redis_errors("reading the coordinators' registry"):
        raw = await redis.hgetall(keys.coordinators)
    now = _now_ms()
    out = []
    for holder, text in raw.items():
        try:
            data = json.loads(text)
            entry = Registration(
                str(holder), str(data["version"]), int(data["featureLevel"]), int(data["seenMs"])
            )
        except (ValueError, KeyError, TypeError):
            continue
        if now - entry.seen_ms <= REGISTRATION_FRESH_MS:
            out.append(entry)
        elif now - entry.seen_ms > 10 * REGISTRATION_FRESH_MS:  # a crashed one: forget it
            with redis_errors("pruning the coordinators' registry"):
                await redis.hdel(keys.coordinators, [holder])
    return sorted(out, key=lambda r: r.holder)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def coordinator_parties(redis: Any, lease: LeaseBackend, keys: KeySpace = DEFAULT_KEYS) -> list[Party]:
    """Every running coordinator with the highest level its release supports: the registered
    ones, and the lease holder if it did not register (a 0.1.0 coordinator: level 1)."""
    found = await registrations(redis, keys)
    parties = [Party("coordinator", r.holder, r.version, r.feature_level) for r in found]
    holder = await lease.current()
    if holder is not None and holder.holder not in {r.holder for r in found}:
        parties.append(Party("coordinator", holder.holder, "0.1.0 or older (unregistered)", 1))
    return parties
