"""`rsc purge --key-prefix P`: delete every key of one rsc deployment's namespace.

A coordinator started with `key_prefix` (`RSC_KEY_PREFIX`, `make run` uses
`rsc-demo:`) writes every key under it: journals, snapshots, the lease, the
audit log, and the shard keys (with their owner tokens, seals and dead
letters). This removes them all, on standalone Redis or every primary of a
cluster. It lists what it would delete unless given `--yes`, refuses an empty
prefix (that would be everything rsc ever wrote, and more), and refuses while a
coordinator holds that namespace's lease (stop it first).
"""

from __future__ import annotations

import re
from typing import Any

import click

from rsc.actors.keys import KeySpace
from rsc.actors.store_connection import DEFAULT_REDIS_URL, open_redis
from rsc.connect import redacted
from rsc.tools.running import run_on_redis


def glob_escape(text: str) -> str:
    """`text` matched literally by SCAN's MATCH pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


async def purge(redis: Any, keys: KeySpace, delete: bool) -> list[str]:
    """The keys under `keys.namespace` (deleted if `delete`), sorted."""
    holder = await redis.get(keys.coordinator_lease)
    if holder is not None:
        raise click.ClickException(
            f"a coordinator holds the lease of {keys.namespace!r} ({holder}): stop it first"
        )
    pattern = f"{glob_escape(keys.namespace)}*"
    found = sorted([str(k) async for k in redis.scan_iter(match=pattern, count=1000)])
    if delete:
        for key in found:  # one at a time: on a cluster each key may be on another primary
            await redis.unlink([key])
    return found


@click.command("purge")
@click.option(
    "--key-prefix", envvar="RSC_KEY_PREFIX", required=True, help="The namespace [env RSC_KEY_PREFIX]."
)
@click.option(
    "--redis-url",
    envvar="RSC_REDIS_URL",
    default=DEFAULT_REDIS_URL,
    show_default=True,
    help="Redis (standalone or any cluster node); env RSC_REDIS_URL.",
)
@click.option("--yes", is_flag=True, help="Delete them (without it: only list how many there are).")
def purge_command(key_prefix: str, redis_url: str, yes: bool) -> None:
    """Delete every key under --key-prefix (a namespace of rsc's; stop its coordinator first)."""
    try:
        keys = KeySpace(key_prefix)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--key-prefix") from exc
    if not keys.namespace:
        raise click.BadParameter("an empty prefix would be every key in Redis", param_hint="--key-prefix")

    async def run() -> list[str]:
        async with open_redis(redis_url) as redis:
            return await purge(redis, keys, yes)

    found = run_on_redis(run)
    where = redacted(redis_url)
    if yes:
        click.echo(f"deleted {len(found)} key(s) under {keys.namespace!r} in {where}")
        return
    for key in found[:20]:
        click.echo(key)
    if len(found) > 20:
        click.echo(f"... and {len(found) - 20} more")
    click.echo(f"{len(found)} key(s) under {keys.namespace!r} in {where}; --yes deletes them")
