"""Running the coordinator: Redis, the registry of actors, and hypercorn (trio)."""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlparse

import attrs
import trio

from rsc.actors import dataset
from rsc.actors.actor import ActorSettings
from rsc.actors.clock import WallClock
from rsc.actors.dataset import DATA_LOSS, DatasetWatch
from rsc.actors.deployment import Deployment
from rsc.actors.effects.redis_effects import RedisEffects
from rsc.actors.errors import StoreError, UnsupportedFeatureLevel
from rsc.actors.features import Features, coordinator_parties, register, unsupported
from rsc.actors.health import REDIS_OUTAGE
from rsc.actors.keys import KeySpace
from rsc.actors.leadership import Leadership, RedisLease
from rsc.actors.redis_store import RedisStore
from rsc.actors.registry import Registry, RegistrySettings, open_registry
from rsc.actors.store_connection import open_lean, open_redis
from rsc.config import ConfigError, Settings
from rsc.connect import RedisRefused
from rsc.events import auth
from rsc.events.model import MigrationBounds, Timing
from rsc.events.versions import MAX_FEATURE_LEVEL, Party
from rsc.http.admin import add_admin_routes
from rsc.http.app import create_app
from rsc.http.audit import AuditLog
from rsc.http.authenticate import AdminAccount, is_loopback_bind
from rsc.http.openapi import add_openapi_route
from rsc.http.server import Limits, hypercorn_config, serve_http
from rsc.http.standby import add_standby_gate, default_advertise_url
from rsc.process_tuning import GC_THRESHOLDS as GC_THRESHOLDS  # noqa: PLC0414 (here before 0.2.0)
from rsc.process_tuning import tune_gc as tune_gc  # noqa: PLC0414

log = logging.getLogger("rsc.serve")


#: Running actors that compare their stored revision each second (partial loss, `rsc.actors.dataset`).
SWEEP_PER_ROUND = 20


def registry_settings(settings: Settings) -> RegistrySettings:
    """The actors' settings from the coordinator's control-plane defaults."""
    timing = Timing(
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        lease_ttl_ms=settings.member_lease_ttl_ms,
        revoke_timeout_ms=settings.revoke_timeout_ms,
    )
    return RegistrySettings(
        timing=timing,
        default_shard_count=settings.default_shard_count,
        auto_create_streams=settings.auto_create_streams,
        actor=ActorSettings(tick_interval_s=settings.tick_interval_ms / 1000),
        migration_bounds=MigrationBounds(
            settings.quiesce_pause_timeout_ms, settings.quiesce_consume_timeout_ms
        ),
        retired_retention_ms=settings.retired_shard_retention_ms,
        consumer_prune_s=settings.consumer_prune_interval_ms / 1000,
        retention_check_s=settings.retention_interval_ms / 1000,
        retention_shards_per_s=settings.retention_shards_per_s,
        sweep_per_round=SWEEP_PER_ROUND,
    )


@attrs.frozen
class Running:
    """What `open_coordinator` opened: the registry, the audit log, the lease, and every running
    coordinator as the features endpoint lists them (`parties`)."""

    registry: Registry
    audit: AuditLog
    leadership: Leadership
    parties: Callable[[], Awaitable[list[Party]]]


@contextlib.asynccontextmanager
async def open_coordinator(settings: Settings) -> AsyncIterator[Running]:
    """Redis, the coordinator lease, the store, the registry and the audit log, while the block runs.

    Actors run only while this process holds the lease (see `rsc.actors.leadership`):
    the store writes with the term's fencing token, every actor is stopped the moment a
    term ends, and the actors of a new term load their aggregates afresh (which raises
    their fences and restarts member leases in full). On the way out, once every actor
    has stopped, the lease is released so that a standby takes over at once.
    """
    timeouts = {
        "connect_timeout_s": settings.redis_connect_timeout_ms / 1000,
        "command_timeout_s": settings.redis_command_timeout_ms / 1000,
    }
    REDIS_OUTAGE.reset()
    keys = KeySpace(settings.key_prefix)
    async with open_redis(settings.redis_url, **timeouts) as redis, open_lean(redis) as lean:
        leadership = Leadership(
            RedisLease(
                redis,
                keys,
                replicas=settings.coordinator_lease_replicas,
                wait_ms=max(1, settings.coordinator_lease_ttl_ms // 6),  # well within a renewal's third
            ),
            settings.coordinator_lease_ttl_ms,
            advertise_url=settings.advertise_url,
        )
        features = Features(redis, settings.initial_feature_level, term=lambda: leadership.terms, keys=keys)
        await check_feature_level(features)
        store = RedisStore(redis, fence_token=leadership.token, features=features, keys=keys, lean=lean)
        effects = RedisEffects(redis, fence_token=leadership.token, keys=keys, lean=lean)
        store.on_fenced = effects.on_fenced = leadership.advance
        actors = registry_settings(settings)
        try:
            async with trio.open_nursery() as terms:
                terms.start_soon(functools.partial(register, redis, leadership.holder_id, keys=keys))
                async with open_registry(store, effects, WallClock(), actors) as registry:
                    watch = watch_dataset(redis, keys, leadership, features, registry)
                    terms.start_soon(watch.run)
                    await terms.start(leadership.run, registry.stop_all)
                    audit = AuditLog(redis, keys=keys, lean=lean)

                    async def parties() -> list[Party]:
                        return await coordinator_parties(redis, leadership.backend, keys)

                    yield Running(registry, audit, leadership, parties)
                terms.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                if not await leadership.release():
                    # Leaving on an error or a cancellation can leave the client's connections
                    # broken: a connection of its own, so that a standby need not wait out the ttl.
                    try:
                        async with open_redis(settings.redis_url, **timeouts) as fresh:
                            released = await leadership.release(RedisLease(fresh, keys))
                    except (StoreError, RedisRefused):
                        released = False
                    if not released:
                        log.warning("could not release the coordinator lease (it expires by itself)")


def watch_dataset(
    redis: Any, keys: KeySpace, leadership: Leadership, features: Features, registry: Registry
) -> DatasetWatch:
    """Noticing that Redis lost data, and the correction it starts (`rsc.actors.dataset`)."""
    DATA_LOSS.reset()

    def correct(kind: str, why: str) -> None:
        registry.corrections.check_all(kind, why)
        registry.nursery.start_soon(_restore_features, features)

    DATA_LOSS.listeners.append(correct)
    leadership.on_lease_lost = lambda why: DATA_LOSS.noticed(dataset.LEASE, why)
    leadership.on_other_holder = registry.forget_terms

    async def has_streams() -> bool:
        return bool(await redis.exists([keys.streams]))

    watch = DatasetWatch(redis, keys.dataset, active=lambda: leadership.active, has_streams=has_streams)
    watch.on_identity_change = lambda why: registry.corrections.check_all("identity", why)
    return watch


async def _restore_features(features: Features) -> None:
    try:
        await features.restore()
    except StoreError as exc:
        log.warning("could not restore the feature level yet: %s", exc)


async def check_feature_level(features: Features) -> None:
    """Refuse to start where the deployment is finalized at a level this release does not know."""
    try:
        state = await features.peek()
        if state is None:  # a new deployment, or one whose record Redis lost: the first write decides
            log.info(
                "no feature level recorded yet: the first write records it (initial_feature_level "
                "%d, or 1 where streams exist or are rebuilt from what the fleet reports)",
                features.initial_level,
            )
            return
        if state.level > MAX_FEATURE_LEVEL:
            raise unsupported(state.level)
        features.known(state)
    except UnsupportedFeatureLevel as exc:
        raise ConfigError(str(exc)) from exc
    except StoreError as exc:  # Redis away: the store reads the level before its first write
        log.warning("could not read the feature level yet: %s", exc)
        return
    log.info("feature level %d (this release supports 1 to %d)", state.level, MAX_FEATURE_LEVEL)


async def serve(
    settings: Settings,
    bind: str,
    *,
    shutdown: trio.Event | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until `shutdown` is set (or SIGTERM/SIGINT when it is None); report the bound URLs.

    Raises `Exposed` (before connecting to anything) for a non-loopback bind without
    credentials, unless `settings.insecure`.
    """
    check_exposure(settings, bind)
    for line in auth.narrowing_warnings(settings.credentials):
        log.warning("%s", line)
    async with open_coordinator(settings) as running, trio.open_nursery() as nursery:
        registry, audit, leadership = running.registry, running.audit, running.leadership
        limits = Limits.from_settings(settings)
        config = hypercorn_config(bind, limits)
        trigger = shutdown if shutdown is not None else trio.Event()
        if shutdown is None:
            nursery.start_soon(_stop_on_signals, trigger)
        if settings.certfile is not None:
            config.certfile, config.keyfile = settings.certfile, settings.keyfile
        deployment = Deployment(registry)  # the HTTP layer's one door into the actors
        app = create_app(deployment, settings)
        account = AdminAccount(settings.admin_user, settings.admin_password, settings.admin_password_sha256)
        add_admin_routes(app, deployment, account, audit, running.parties)
        add_openapi_route(app)
        add_standby_gate(app, leadership)  # last, so that its answer is the one audited and sent
        stopped = trio.Event()

        async def http(task_status: trio.TaskStatus[list[str]]) -> None:
            try:
                await serve_http(app, config, limits, shutdown_trigger=trigger.wait, task_status=task_status)
            finally:
                stopped.set()

        urls = await nursery.start(http)
        if leadership.advertise_url is None:
            await leadership.advertise(default_advertise_url(urls))
        task_status.started(urls)
        await trigger.wait()
        app.extensions["rsc.holds"].changes.release_all()  # held long polls are answered now
        # Graceful: no new connections, requests in flight answered (within the server's
        # graceful timeout), and only then the actors and the lease go.
        with trio.move_on_after(config.graceful_timeout + 1):
            await stopped.wait()
        nursery.cancel_scope.cancel()


class Exposed(ConfigError):
    """The coordinator would accept anonymous members and producers from the network."""


def check_exposure(settings: Settings, bind: str) -> None:
    """Protected mode: refuse a non-loopback bind without credentials unless `insecure` says so."""
    if settings.policy.enforced or settings.insecure or is_loopback_bind(bind):
        return
    raise Exposed(
        f"refusing to listen on {bind}: no credentials are configured, so anyone who can reach "
        "this address could act as any member or producer. Configure [[credentials]] "
        "(or RSC_CREDENTIALS), bind to 127.0.0.1, or pass --insecure (RSC_INSECURE=true) "
        "if a trusted network guards the port"
    )


async def _stop_on_signals(trigger: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("received %s, shutting down", signal.Signals(signum).name)
            trigger.set()
            return


def redis_answers(url: str) -> bool:
    """Whether something accepts TCP connections at a plain `redis://` URL's address."""
    try:
        parsed = urlparse(url)
        address = (parsed.hostname or "127.0.0.1", parsed.port or 6379)
    except ValueError:  # not one host and port (a sentinel URL names several)
        return False
    try:
        with socket.create_connection(address, timeout=1):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def embedded_redis(settings: Settings) -> Iterator[Settings]:
    """If no Redis URL was configured and nothing answers at the default address, start a
    private redis-server for this run. A configured URL (any form: a sentinel URL names several
    hosts) is used as it is."""
    if settings.redis_url_configured or redis_answers(settings.redis_url):
        yield settings
        return
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit(
            f"nothing answers at {settings.redis_url} and redis-server is not installed: "
            "install Redis 7 (e.g. apt-get install redis-server) or set RSC_REDIS_URL"
        )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="rsc-redis-") as workdir:
        args = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        process = subprocess.Popen([*args, "--dir", workdir], stdout=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}"
        try:
            for _ in range(100):
                if redis_answers(url):
                    break
                time.sleep(0.05)
            log.warning(
                "nothing answered at %s: started a private redis-server at %s for this run",
                settings.redis_url,
                url,
            )
            yield attrs.evolve(settings, redis_url=url)
        finally:
            process.terminate()
            process.wait(timeout=10)
