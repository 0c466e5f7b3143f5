"""The `rsc` command line."""

from __future__ import annotations

import errno
import functools
import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import attrs
import click
import trio

from rsc import __version__
from rsc import config as config_module
from rsc import journal as journal_tool
from rsc.actors.errors import StoreUnavailable
from rsc.actors.keys import AggregateId, KeySpace, check_namespace
from rsc.actors.redis_store import RedisStore
from rsc.actors.store_connection import DEFAULT_REDIS_URL, open_redis
from rsc.client.errors import CoordinatorRejected, MemberReplaced, RscError
from rsc.client.worker import App
from rsc.connect import RedisRefused, first_leaf, redacted
from rsc.demo import run_demo
from rsc.http import service as serving
from rsc.simulate import SimConfig, Simulation
from rsc.tools import admin_commands as admin_tools
from rsc.tools import apply as applying
from rsc.tools.purge import purge_command
from rsc.tools.running import run_on_redis

T = TypeVar("T")
log = logging.getLogger("rsc.cli")


class JsonLines(logging.Formatter):
    """One JSON object per log record: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Logging of a long-running command: `level` for rsc, third parties at WARNING (one line per
    HTTP request or Redis script-cache retry is noise), text or JSON lines on stderr."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonLines())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("rsc").setLevel(level.upper())
    logging.getLogger("hypercorn.error").setLevel(level.upper())


def logging_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--log-level` and `--log-format` (also `RSC_LOG_LEVEL`, `RSC_LOG_FORMAT`)."""
    command = click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        envvar="RSC_LOG_FORMAT",
        help="Log lines as text or as JSON objects [env RSC_LOG_FORMAT].",
    )(command)
    return click.option(
        "--log-level",
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
        default="INFO",
        show_default=True,
        envvar="RSC_LOG_LEVEL",
        help="Least severity logged by rsc [env RSC_LOG_LEVEL].",
    )(command)


class StartupError(click.ClickException):
    """A process that cannot start (bad configuration, a port in use, Redis not answering, a
    target that does not load): one line on stderr, exit code 2."""

    exit_code = 2


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


@click.group()
@click.version_option(__version__, prog_name="rsc")
def main() -> None:
    """rsc: a coordinator for sharded Redis Streams."""


@main.command()
@click.option(
    "--members", default=50, show_default=True, type=click.IntRange(0), help="Members at the start."
)
@click.option(
    "--shards", default=512, show_default=True, type=click.IntRange(1, 16_384), help="Shards at the start."
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random schedule.")
@click.option(
    "--churn", default=200, show_default=True, type=click.IntRange(0), help="Number of churn events."
)
@click.option("--heartbeat-interval-ms", default=1_000, show_default=True, type=click.IntRange(1))
@click.option("--lease-ttl-ms", default=5_000, show_default=True, type=click.IntRange(1))
@click.option("--revoke-timeout-ms", default=15_000, show_default=True, type=click.IntRange(1))
@click.option(
    "--assignment-interval-ms",
    default=None,
    type=click.IntRange(0),
    help="Least time between target computations [default: 0, or 1000 above 1,000 members].",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one final JSON object (progress goes to stderr)."
)
def simulate(
    members: int,
    shards: int,
    seed: int,
    churn: int,
    heartbeat_interval_ms: int,
    lease_ttl_ms: int,
    revoke_timeout_ms: int,
    assignment_interval_ms: int | None,
    as_json: bool,
) -> None:
    """Run the coordination core with simulated members and time (no Redis, no HTTP).

    Exits 1 if the run did not converge or broke an invariant.
    """
    if lease_ttl_ms < 3 * heartbeat_interval_ms:
        raise click.BadParameter(
            "the lease must be at least 3 heartbeat intervals", param_hint="--lease-ttl-ms"
        )
    if assignment_interval_ms is None:
        assignment_interval_ms = 1_000 if members > 1_000 else 0
    config = SimConfig(
        members=members,
        shards=shards,
        seed=seed,
        churn=churn,
        heartbeat_interval_ms=heartbeat_interval_ms,
        lease_ttl_ms=lease_ttl_ms,
        revoke_timeout_ms=revoke_timeout_ms,
        assignment_interval_ms=assignment_interval_ms,
    )
    out = sys.stderr if as_json else sys.stdout
    report = Simulation(config, progress=lambda line: print(line, file=out, flush=True)).run()
    if as_json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>24}: {value}")
    healthy = (
        report["converged"]
        and report["minimalMoves"]
        and report["maxImbalance"] <= 1
        and report["exclusivityViolations"] == 0
        and report["orderViolations"] == 0
    )
    sys.exit(0 if healthy else 1)


# --- rsc journal -----------------------------------------------------------

redis_url_option = click.option(
    "--redis-url",
    envvar="RSC_REDIS_URL",
    default=DEFAULT_REDIS_URL,
    show_default=True,
    help="Redis (standalone or any cluster node); env RSC_REDIS_URL.",
)
key_prefix_option = click.option(
    "--key-prefix",
    envvar="RSC_KEY_PREFIX",
    default="",
    help="The namespace of the coordinator's keys (as its key_prefix); env RSC_KEY_PREFIX.",
)


def _aggregate(stream: str, group: str | None) -> AggregateId:
    return AggregateId(stream, group)


def _with_store(redis_url: str, key_prefix: str, work: Callable[[Any, RedisStore], Awaitable[T]]) -> T:
    try:
        keys = KeySpace(key_prefix)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--key-prefix") from exc

    async def main() -> T:
        log.debug("journal: reading Redis at %s (keys under %r)", redacted(redis_url), keys.root)
        async with open_redis(redis_url) as redis:
            return await work(redis, RedisStore(redis, keys=keys))

    return run_on_redis(main)


@main.group()
def journal() -> None:
    """Read, replay and verify the event journals in Redis (for debugging)."""


@journal.command("show")
@click.argument("stream")
@click.argument("group", required=False)
@click.option("--member", help="Only entries about this member id.")
@click.option("--shard", type=int, help="Only entries about this shard index.")
@click.option("--kind", "kinds", multiple=True, help="Only entries of this kind (repeatable).")
@redis_url_option
@key_prefix_option
def journal_show(
    stream: str,
    group: str | None,
    member: str | None,
    shard: int | None,
    kinds: tuple[str, ...],
    redis_url: str,
    key_prefix: str,
) -> None:
    """The journal of STREAM (or of its consumer GROUP), oldest first."""
    aggregate = _aggregate(stream, group)

    async def work(redis: Any, store: RedisStore) -> list[Any] | None:
        if not await redis.exists([store.keys.journal(aggregate), store.keys.snapshot(aggregate)]):
            return None
        return list(await journal_tool.show(store, aggregate, member, shard, kinds))

    entries = _with_store(redis_url, key_prefix, work)
    if entries is None:
        what = f"group {group!r} of stream {stream!r}" if group else f"stream {stream!r}"
        raise click.ClickException(f"no journal for {what} in this Redis (is --redis-url right?)")
    for entry in entries:
        click.echo(journal_tool.describe(entry))


@journal.command("replay")
@click.argument("stream")
@click.argument("group", required=False)
@click.option("--until", default="+", show_default=True, help="Last journal entry id to apply.")
@redis_url_option
@key_prefix_option
def journal_replay(stream: str, group: str | None, until: str, redis_url: str, key_prefix: str) -> None:
    """The state of STREAM (or GROUP) after the entries up to --until, as JSON."""
    state = _with_store(
        redis_url, key_prefix, lambda _, store: journal_tool.replay(store, _aggregate(stream, group), until)
    )
    if state is None:
        raise click.ClickException("nothing retained up to that id")
    click.echo(journal_tool.state_json(state))


@journal.command("verify")
@click.argument("stream", required=False)
@click.argument("group", required=False)
@click.option(
    "--allow-empty",
    is_flag=True,
    help="Exit 0 when Redis holds no rsc data at all (a deployment where no coordinator has run yet).",
)
@redis_url_option
@key_prefix_option
def journal_verify(
    stream: str | None, group: str | None, allow_empty: bool, redis_url: str, key_prefix: str
) -> None:
    """Check that snapshots, checkpoints and journals agree (all aggregates without STREAM).

    Exits 1 if any aggregate fails, and when Redis holds no rsc data at all (no
    aggregate and no dataset marker: lost, or never written) unless --allow-empty.
    """

    async def work(redis: Any, store: RedisStore) -> tuple[str, list[journal_tool.Verdict], bool]:
        if stream:
            targets = [_aggregate(stream, group)]
        else:
            targets = await journal_tool.every_aggregate(redis, store, store.keys)
        level = await journal_tool.feature_level(redis, store.keys)
        empty = not targets and not await redis.exists([store.keys.dataset])
        return level, [await journal_tool.verify(store, target) for target in targets], empty

    level, verdicts, empty = _with_store(redis_url, key_prefix, work)
    click.echo(level)
    for v in verdicts:
        status = "ok" if v.ok else "FAILED"
        click.echo(
            f"{status:<6} {v.aggregate_id}  revision {v.revision}, {v.entries} entries retained, "
            f"{v.describe_versions()}"
        )
        for problem in v.problems:
            click.echo(f"       - {problem}")
    if empty:
        # Nothing to check is not a pass: Redis that lost everything (FLUSHALL, a restart
        # without persistence) looks exactly like this until a coordinator notices and
        # writes back what it knows. A deployment that never ran one says --allow-empty.
        click.echo(
            "FAILED no rsc data in this Redis: no aggregate and no dataset marker (under this "
            "--key-prefix). Either Redis lost everything (FLUSHALL, a restart without persistence) "
            "and no coordinator has run since to write back what it knows, or no coordinator has "
            "run here yet (then pass --allow-empty)."
        )
        sys.exit(0 if allow_empty else 1)
    if not verdicts:
        click.echo("no aggregates found")
    sys.exit(0 if all(v.ok for v in verdicts) else 1)


# --- rsc serve ---------------------------------------------------------------


@main.command()
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


def _client_error_in(group: BaseExceptionGroup[BaseException]) -> RscError | None:
    """The first error of the client library anywhere in `group` (a refusal first), if any."""
    for kind in (CoordinatorRejected, RscError):
        matched, _ = group.split(kind)
        leaf = first_leaf(matched) if matched is not None else None
        if isinstance(leaf, RscError):
            return leaf
    return None


# --- rsc worker --------------------------------------------------------------

#: `rsc worker`'s exit code when a newer process took its static member ids over.
REPLACED_EXIT = 3


@main.command()
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
            serving.tune_gc()
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


for _command in admin_tools.COMMANDS:
    main.add_command(_command)
main.add_command(purge_command)


def _apply_options(command: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "-f",
            "--file",
            "files",
            multiple=True,
            required=True,
            type=click.Path(dir_okay=False),
            help="Desired streams and groups (TOML, or YAML by extension); repeatable.",
        ),
        click.option(
            "--prune", is_flag=True, help="Also delete groups of the named streams not in the files."
        ),
        click.option(
            "--prune-streams", is_flag=True, help="Also delete streams not in the files (and their groups)."
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


class _PlanUsageError(click.UsageError):
    exit_code = 1


class _PlanCommand(click.Command):
    """`rsc diff` and `rsc apply` exit like `terraform plan -detailed-exitcode`: 2 means changes,
    so a usage error (click's exit code 2) exits 1 instead, and a pipeline never reads a typo
    as a plan with changes."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise _PlanUsageError(exc.message, exc.ctx) from exc


@main.command("diff", cls=_PlanCommand)
@_apply_options
@admin_tools.connection_options
def diff(admin: Any, output: str, files: tuple[str, ...], prune: bool, prune_streams: bool) -> None:
    """Show what `rsc apply` would change. Exit 0: nothing; 2: changes; 1: an error."""
    sys.exit(
        applying.run(admin, files, dry_run=True, prune=prune, prune_streams=prune_streams, output=output)
    )


@main.command("apply", cls=_PlanCommand)
@_apply_options
@click.option("--dry-run", is_flag=True, help="Only show the plan (exit 2 when it has changes).")
@admin_tools.connection_options
def apply(
    admin: Any, output: str, files: tuple[str, ...], prune: bool, prune_streams: bool, dry_run: bool
) -> None:
    """Make the coordinator match the files (If-Match on every change). Exit 0: done; 1: error."""
    sys.exit(
        applying.run(admin, files, dry_run=dry_run, prune=prune, prune_streams=prune_streams, output=output)
    )


def _logging_everywhere(command: click.Command) -> None:
    """`--log-level` and `--log-format` on every command (`serve` and `worker` declare their
    own): one way to turn on DEBUG, or JSON lines, whatever the command."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _logging_everywhere(sub)
        return
    if command.callback is None or any(param.name == "log_level" for param in command.params):
        return
    callback = command.callback
    with_options = logging_options(lambda log_level, log_format: None)
    command.params.extend(with_options.__click_params__)  # type: ignore[attr-defined]

    @functools.wraps(callback)
    def configured(*args: Any, log_level: str, log_format: str, **kwargs: Any) -> Any:
        # A short command logs only warnings unless asked (by option or environment).
        context = click.get_current_context()
        defaults = (None, click.core.ParameterSource.DEFAULT)
        if any(context.get_parameter_source(name) not in defaults for name in ("log_level", "log_format")):
            setup_logging(log_level, log_format)
        return callback(*args, **kwargs)

    command.callback = configured


_logging_everywhere(main)
