"""`rsc tail STREAM`: read a stream's entries across its shards from the command line, without a
consumer group and without acknowledging anything (kcat's consumer mode for an rsc stream).

The layout comes from the coordinator (`GET /v1/streams/{p}/routing`, with `RSC_TOKEN` as a
worker sends it); entries are read from Redis directly with the URL forms a worker uses
(`RSC_REDIS_URL`: `redis://`, `rediss://`, `redis+sentinel://`; a Redis Cluster node is noticed),
read-only: `XRANGE`/`XREVRANGE`, and with `--group` `XINFO GROUPS` and `XPENDING`. Entries of
every readable shard (ACTIVE and DRAINING) are merged by id time, oldest first; `--key` reads
only the shard the key routes to (jump-v1 over the ACTIVE shards). `--follow` polls each shard
for entries after the last one shown (every 0.5 s; the layout every 5 s, so that shards a
scale-out adds are followed too).
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import click
import redis
from redis.cluster import RedisCluster

from rsc.client.errors import RscError
from rsc.client.sync import SyncCoordinator
from rsc.connect import open_redis
from rsc.events import codec
from rsc.events.group_position import entry_id
from rsc.events.model import Layout, Shard
from rsc.events.routing import route
from rsc.sync_connect import sync_redis
from rsc.tools.admin_terminal import iso_ms
from rsc.tools.running import run_on_redis

#: How often `--follow` looks for new entries, and for a new layout.
POLL_S, LAYOUT_S = 0.5, 5.0


@attrs.frozen
class Entry:
    """One entry of one shard (`status`: with `--group`, "pending" or "unread")."""

    shard: int
    key: str
    id: str
    fields: dict[str, str]
    status: str | None = None

    def sort_key(self) -> tuple[tuple[int, int], int]:
        return entry_id(self.id), self.shard

    def json(self) -> str:
        data: dict[str, Any] = {"shard": self.shard, "key": self.key, "id": self.id, "fields": self.fields}
        if self.status is not None:
            data["status"] = self.status
        return json.dumps(data, separators=(",", ":"))

    def text(self) -> str:
        ms = int(self.id.split("-")[0])
        at = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")
        fields = " ".join(f"{k}={v}" for k, v in self.fields.items())
        status = f" [{self.status}]" if self.status else ""
        return f"{self.id} {at.replace('+00:00', 'Z')} shard {self.shard}{status} {fields}"


def _client(url: str) -> Any:
    """A redis-py client for `url` (a `RedisCluster` when the node says it is one)."""
    client = sync_redis(url, decode_responses=True, socket_timeout=5)
    if not url.startswith("redis+sentinel") and client.info("cluster").get("cluster_enabled"):
        client.close()
        return RedisCluster.from_url(url, decode_responses=True)
    return client


def _decode(fields: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in dict(fields).items()}


def shards_of(layout: Layout, key: str | None) -> list[Shard]:
    """The readable shards (ACTIVE and DRAINING), or the one `key` routes to."""
    if key is not None:
        return [route(layout, key.encode())]
    return [s for s in layout.shards if s.readable]


def read_last(r: Any, shards: Sequence[Shard], count: int) -> list[Entry]:
    """The last `count` entries over `shards`, oldest first."""
    found = [
        Entry(s.index, s.key, str(i), _decode(f)) for s in shards for i, f in r.xrevrange(s.key, count=count)
    ]
    return sorted(found, key=Entry.sort_key)[-count:] if count else []


def read_from(r: Any, shards: Sequence[Shard], start: str, count: int | None) -> list[Entry]:
    """Entries at or after id `start` over `shards`, oldest first (at most `count`)."""
    found = [
        Entry(s.index, s.key, str(i), _decode(f))
        for s in shards
        for i, f in r.xrange(s.key, min=start, count=count)
    ]
    ordered = sorted(found, key=Entry.sort_key)
    return ordered[:count] if count is not None else ordered


def read_group(r: Any, shards: Sequence[Shard], group: str, count: int) -> list[Entry]:
    """What `group` has pending (delivered, not acknowledged) and not yet read, per shard (at
    most `count` of each kind a shard), oldest first."""
    out: list[Entry] = []
    for s in shards:
        infos = {str(g["name"]): g for g in r.xinfo_groups(s.key)} if r.exists(s.key) else {}
        info = infos.get(group)
        if info is None:
            continue
        for p in r.xpending_range(s.key, group, min="-", max="+", count=count):
            for i, f in r.xrange(s.key, min=p["message_id"], max=p["message_id"]):
                out.append(Entry(s.index, s.key, str(i), _decode(f), "pending"))
        after = f"({info['last-delivered-id']}"
        out += [
            Entry(s.index, s.key, str(i), _decode(f), "unread")
            for i, f in r.xrange(s.key, min=after, count=count)
        ]
    return sorted(out, key=Entry.sort_key)


def newest(r: Any, key: str) -> str:
    """The id of the key's newest entry ("0-0": none)."""
    found = r.xrevrange(key, count=1)
    return str(found[0][0]) if found else "0-0"


def follow(
    r: Any, coordinator: SyncCoordinator, stream: str, key: str | None, last: dict[str, str], highest: int
) -> Iterator[Entry]:
    """Entries after the last one shown on each shard, as they come (forever). A shard first
    seen here is read from its start if a scale-out added it (an index above `highest`), else
    (`--key` routed elsewhere by a scale-in) from its newest entry then: never its history."""
    layout, fetched = _layout(coordinator, stream), time.monotonic()
    while True:
        if time.monotonic() - fetched > LAYOUT_S:
            layout, fetched = _layout(coordinator, stream), time.monotonic()
        shards = shards_of(layout, key)
        for s in shards:
            if s.key not in last:
                last[s.key] = "0-0" if s.index > highest else newest(r, s.key)
        found = [
            Entry(s.index, s.key, str(i), _decode(f))
            for s in shards
            for i, f in r.xrange(s.key, min=f"({last[s.key]}", count=1_000)
        ]
        for entry in sorted(found, key=Entry.sort_key):
            last[entry.key] = entry.id
            yield entry
        if not found:
            time.sleep(POLL_S)


async def _reachable(url: str) -> None:
    """Redis answers at `url` with the credential given (else `open_redis`'s one-line errors)."""
    async with open_redis(url) as r:
        await r.ping()


def _layout(coordinator: SyncCoordinator, stream: str) -> Layout:
    return codec.wire.structure(coordinator.routing(stream), Layout)


@click.command("tail")
@click.argument("stream")
@click.option("--from", "since", help="An ISO-8601 time: entries at or after it.")
@click.option("--from-id", "from_id", help="Entries at or after this id, on every shard.")
@click.option("--last", "last_n", type=click.IntRange(0, 1_000_000), help="The last N entries (default 10).")
@click.option("--key", help="Only the shard this partition key routes to.")
@click.option("--group", help="What this group has pending or not yet read.")
@click.option("--follow", "-f", "following", is_flag=True, help="Then new entries as they come.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object a line: shard, key, id, fields.")
@click.option(
    "--coordinator-url", envvar="RSC_COORDINATOR_URL", default="http://127.0.0.1:8080", show_default=True
)
@click.option("--redis-url", envvar="RSC_REDIS_URL", default="redis://127.0.0.1:6379", show_default=True)
def tail(
    stream: str,
    since: str | None,
    from_id: str | None,
    last_n: int | None,
    key: str | None,
    group: str | None,
    following: bool,
    as_json: bool,
    coordinator_url: str,
    redis_url: str,
) -> None:
    """Read STREAM's entries across its shards, oldest first, changing nothing in Redis (no
    consumer group, nothing acknowledged)."""
    if sum(x is not None for x in (since, from_id, last_n)) > 1:
        raise click.UsageError("give at most one of --from, --from-id, --last")
    if from_id is not None:
        try:
            entry_id(from_id)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--from-id") from exc
    run_on_redis(lambda: _reachable(redis_url))  # a Redis mistake is said first, in one line
    try:
        with SyncCoordinator(coordinator_url) as coordinator:
            layout = _layout(coordinator, stream)
            r = _client(redis_url)
            shards = shards_of(layout, key)
            # where each shard stands before anything is read: what comes after is followed
            start = {s.key: newest(r, s.key) for s in shards} if following else {}
            if group is not None:
                shown = read_group(r, shards, group, last_n or 1_000)
            elif since is not None:
                shown = read_from(r, shards, f"{iso_ms(since, '--from')}-0", None)
            elif from_id is not None:
                shown = read_from(r, shards, from_id, None)
            else:
                shown = read_last(r, shards, 10 if last_n is None else last_n)
            last: dict[str, str] = {}
            for entry in shown:
                click.echo(entry.json() if as_json else entry.text())
                last[entry.key] = max(last.get(entry.key, "0-0"), entry.id, key=entry_id)
            if following:
                for shard_key, at in start.items():
                    last[shard_key] = max(last.get(shard_key, "0-0"), at, key=entry_id)
                highest = max((s.index for s in layout.shards), default=-1)
                for entry in follow(r, coordinator, stream, key, last, highest):
                    click.echo(entry.json() if as_json else entry.text())
    except (RscError, redis.RedisError) as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        return
