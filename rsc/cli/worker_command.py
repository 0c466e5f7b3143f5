"""`rsc worker`: the listeners of an application's `rsc.client.App`, until SIGINT/SIGTERM; an
error of the client library that ends it leaves as one line."""

from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import NoReturn

import click
import trio

from rsc.cli.process_setup import StartupError, logging_options, setup_logging
from rsc.client.errors import CoordinatorRejected, MemberReplaced, RscError
from rsc.client.worker import App
from rsc.process_tuning import tune_gc
from rsc.redis_errors import first_leaf
from rsc.tools.running import run_on_redis

#: `rsc worker`'s exit code when a newer process took its static member ids over.
REPLACED_EXIT = 3


@click.command()
@click.argument("target")
@click.option(
    "--coordinator",
    "coordinator_url",
    help="Coordinator URL, or several comma-separated (active and standbys; default: RSC_COORDINATOR_URL).",
)
@click.option("--redis-url", "--redis", "redis_url", help="Redis URL of the data plane [env RSC_REDIS_URL].")
@click.option(
    "--stop-timeout", default=30.0, show_default=True, type=float, help="Seconds to let in-flight work end."
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, exists=True),
    help="File holding the member credential (default: the RSC_TOKEN variable).",
)
@click.option("--ca-bundle", help="CA file for an https:// coordinator (default: RSC_CA_BUNDLE).")
@click.option(
    "--instance-id",
    envvar="RSC_INSTANCE_ID",
    help="Start of this process's member ids [env RSC_INSTANCE_ID; default: POD_IP, else host-pid].",
)
@click.option(
    "--static/--no-static",
    "static",
    default=None,
    envvar="RSC_STATIC",
    help="Static members: a restart gets its shards back, a replacement takes a crashed one over "
    "[env RSC_STATIC; default: static when --instance-id / RSC_INSTANCE_ID is set].",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65_535),
    envvar="RSC_METRICS_PORT",
    help="Serve this worker's Prometheus metrics on this port (/metrics) [env RSC_METRICS_PORT].",
)
@logging_options
def worker(
    target: str,
    coordinator_url: str | None,
    redis_url: str | None,
    stop_timeout: float,
    token_file: str | None,
    ca_bundle: str | None,
    instance_id: str | None,
    static: bool | None,
    metrics_port: int | None,
    log_level: str,
    log_format: str,
) -> None:
    """Run the listeners of TARGET (`module:app`) until SIGINT/SIGTERM, then leave gracefully."""
    setup_logging(log_level, log_format)
    module_name, _, attribute = target.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the application's modules are here
    try:
        module = importlib.import_module(module_name)
        app = getattr(module, attribute or "app")
    except (ImportError, AttributeError) as exc:
        raise StartupError(f"cannot load {target!r}: {exc}") from exc
    if not isinstance(app, App):
        raise StartupError(f"{target!r} is not an rsc.client.App")
    if coordinator_url:
        app.coordinator_url = coordinator_url
    if redis_url:
        app.redis_url = redis_url
    if token_file:
        with open(token_file) as file:
            app.token = file.read().strip()
    if ca_bundle:
        app.ca_bundle = ca_bundle
    if instance_id:
        app.instance_id = instance_id
    if static is not None:
        app.static = static
    if metrics_port is not None:
        try:
            app.serve_metrics(metrics_port)
        except OSError as exc:
            raise StartupError(f"cannot serve metrics on port {metrics_port}: {exc.strerror}") from exc

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(app.run)
            # As `rsc serve`: freeze what start-up built, collect in larger steps. At CPython's
            # defaults a worker handling 1,000 msg/s paused ~60 ms for each full collection.
            tune_gc()
            click.echo(f"rsc worker: {len(app.members)} member(s) running; SIGINT/SIGTERM to stop")
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    click.echo(f"rsc worker: {signal.Signals(signum).name}, leaving")
                    break
            app.stop()
            nursery.cancel_scope.deadline = trio.current_time() + stop_timeout

    try:
        # Redis not answering, refusing us or a URL it cannot use: one line, exit 2 (as serve).
        run_on_redis(run, StartupError)
    except (RscError, BaseExceptionGroup) as exc:
        ended = exc if isinstance(exc, RscError) else _client_error_in(exc)
        if ended is None:
            raise
        _worker_ended(ended, exc)


def _worker_ended(ended: RscError, exc: BaseException) -> NoReturn:
    """A worker stopped by an error of the client library: one line, not a traceback per member
    (a wrong credential, a forbidden stream, a coordinator this client cannot read)."""
    if isinstance(ended, CoordinatorRejected):
        raise click.ClickException(f"the coordinator refused this worker: {ended}") from exc
    if isinstance(ended, MemberReplaced):
        # Exit 3, not 1: a supervisor should not restart it (it would take the ids back).
        click.echo(f"Error: the worker stopped: {ended}", err=True)
        raise SystemExit(REPLACED_EXIT) from exc
    raise click.ClickException(f"the worker stopped: {ended}") from exc


def _client_error_in(group: BaseExceptionGroup[BaseException]) -> RscError | None:
    """The first error of the client library anywhere in `group` (a refusal first), if any."""
    for kind in (CoordinatorRejected, RscError):
        matched, _ = group.split(kind)
        leaf = first_leaf(matched) if matched is not None else None
        if isinstance(leaf, RscError):
            return leaf
    return None
