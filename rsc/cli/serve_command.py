"""`rsc serve`: the coordinator (`rsc.coordinator_process`), optionally with demo members
(`rsc.demo`); the start-up failures an operator can fix leave as one line, exit 2."""

from __future__ import annotations

import errno
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import click
import trio

from rsc import config as config_module
from rsc import coordinator_process as serving
from rsc.actors.errors import StoreUnavailable
from rsc.actors.keys import check_namespace
from rsc.cli.process_setup import StartupError, logging_options, setup_logging
from rsc.connect import RedisRefused
from rsc.demo import run_demo
from rsc.redis_errors import first_leaf


def _bind_address(bind: str) -> str:
    """`--bind` as HOST:PORT (a bare host would silently mean hypercorn's port 8000)."""
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65_535:
        raise StartupError(f"--bind needs HOST:PORT (for example 127.0.0.1:8080), not {bind!r}")
    return bind


def _address_in_use(group: BaseExceptionGroup[BaseException]) -> OSError | None:
    matched, _ = group.split(OSError)
    leaf = first_leaf(matched) if matched is not None else None
    return leaf if isinstance(leaf, OSError) and leaf.errno in (errno.EADDRINUSE, errno.EACCES) else None


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--bind", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to listen on.")
@click.option(
    "--demo", is_flag=True, help="Also run a few demo members against the coordinator and log them."
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Accept anonymous members and producers on a non-loopback address (no credentials configured).",
)
@click.option("--certfile", type=click.Path(dir_okay=False), help="Serve HTTPS with this certificate (PEM).")
@click.option("--keyfile", type=click.Path(dir_okay=False), help="The certificate's private key (PEM).")
@click.option(
    "--redis-url", help="Redis (standalone, or any node of a cluster) [config redis_url, env RSC_REDIS_URL]."
)
@click.option(
    "--key-prefix",
    help="Namespace of every key rsc writes, e.g. 'demo:' [config key_prefix, env RSC_KEY_PREFIX].",
)
@logging_options
def serve(
    config_path: str | None,
    bind: str,
    demo: bool,
    insecure: bool,
    certfile: str | None,
    keyfile: str | None,
    redis_url: str | None,
    key_prefix: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Run the coordinator (HTTP on hypercorn/trio) until SIGTERM or SIGINT."""
    bind = _bind_address(bind)
    setup_logging(log_level, log_format)
    try:
        settings = config_module.load(config_path)
        overrides: dict[str, Any] = {}
        if insecure:
            overrides["insecure"] = True
        if certfile or keyfile:
            overrides.update(certfile=certfile, keyfile=keyfile)
        if redis_url:
            overrides["redis_url"] = redis_url
        if key_prefix is not None:
            overrides["key_prefix"] = key_prefix
        settings = attrs.evolve(settings, **overrides)
        config_module.validate(settings)
        serving.check_exposure(settings, bind)
    except config_module.ConfigError as exc:
        raise StartupError(f"configuration refused: {exc}") from exc

    async def run(settings: config_module.Settings) -> None:
        # With the demo, SIGTERM/SIGINT first let its members leave gracefully (a quick re-run
        # finds none of them in its way), then stop the server.
        leave, shutdown = trio.Event(), trio.Event() if demo else None
        async with trio.open_nursery() as nursery:

            async def announce(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
                await serving.serve(settings, bind, task_status=task_status, shutdown=shutdown)
                nursery.cancel_scope.cancel()  # the server stopped (SIGTERM/SIGINT): so does the demo

            async def demo_then_stop() -> None:
                assert shutdown is not None
                async with trio.open_nursery() as inner:
                    inner.start_soon(run_demo, urls[0], click.echo, None, 1.0, leave)
                    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async for signum in signals:
                            click.echo(
                                f"rsc serve: {signal.Signals(signum).name}: demo members leave, then it stops"
                            )
                            break
                    leave.set()
                shutdown.set()

            urls = await nursery.start(announce)
            serving.tune_gc()
            _say_started(settings, urls)
            if settings.key_prefix:
                namespace = check_namespace(settings.key_prefix)
                click.echo(
                    f"every key is under {namespace!r}; to remove them once stopped: "
                    f"rsc purge --key-prefix {namespace} --yes"
                )
            if demo:
                click.echo(f"demo: watch it at {urls[0]}/ui")
                nursery.start_soon(demo_then_stop)

    with serving.embedded_redis(settings) as effective:
        _run_coordinator(run, effective, bind)


def _say_started(settings: config_module.Settings, urls: list[str]) -> None:
    """What `rsc serve` says once it listens: where, which Redis, what is on, what to try."""
    redis_shown = config_module.redacted(settings.redis_url)
    click.echo(f"rsc coordinator listening on {', '.join(urls)} (Redis: {redis_shown})")
    if not (settings.admin_password or settings.admin_password_sha256):
        click.echo("the Admin API is off: set RSC_ADMIN_PASSWORD (or admin_password) to turn it on")
    if settings.policy.enforced or settings.certfile is not None:
        click.echo("members and producers need a credential: see docs/operations.md, Security")
    else:  # the anonymous hint works only as it is printed: plain HTTP, no credentials
        # Read-only: a heartbeat here would create a stream in the user's deployment.
        click.echo(f"try: curl -s {urls[0]}/v1/streams   (or open {urls[0]}/ui)")


def _run_coordinator(run: Callable[[Any], Awaitable[None]], settings: Any, bind: str) -> None:
    """Run the coordinator; the start-up failures an operator can fix leave as one line, exit 2."""
    try:
        trio.run(run, settings)
    except (StoreUnavailable, RedisRefused, config_module.ConfigError) as exc:
        raise StartupError(str(exc)) from exc
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
            raise
        raise StartupError(f"cannot listen on {bind}: {exc.strerror}") from exc
    except BaseExceptionGroup as group:  # the same, raised inside the server's nurseries
        fatal, _ = group.split((StoreUnavailable, RedisRefused, config_module.ConfigError))
        if fatal is not None:
            raise StartupError(str(first_leaf(fatal))) from group
        in_use = _address_in_use(group)
        if in_use is None:
            raise
        raise StartupError(f"cannot listen on {bind}: {in_use.strerror}") from group
