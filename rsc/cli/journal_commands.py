"""`rsc journal show | replay | verify`: the event journals in Redis, read, replayed and checked
(`rsc.journal`), for debugging."""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from rsc import journal as journal_tool
from rsc.actors.keys import AggregateId, KeySpace
from rsc.actors.redis_store import RedisStore
from rsc.actors.store_connection import DEFAULT_REDIS_URL, open_redis
from rsc.connect import redacted
from rsc.tools.running import run_on_redis

T = TypeVar("T")
log = logging.getLogger("rsc.cli")


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


@click.group()
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
