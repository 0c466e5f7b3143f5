"""`rsc dlq ...`: a stream's dead-letter streams counted, read and replayed, through the Admin API
(`rsc.tools.admin_terminal` for the connection and the output)."""

from __future__ import annotations

import json

import click

from rsc.client.admin_api import AdminClient
from rsc.tools.admin_terminal import connection_options, done, emit, table


@click.group()
def dlq() -> None:
    """Dead-letter streams: entries that failed `max_deliveries` times."""


@dlq.command("list")
@click.argument("stream")
@connection_options
def dlq_list(admin: AdminClient, output: str, stream: str) -> None:
    """Per shard: the dead-letter key and how many entries it holds."""
    found = admin.dead_letters(stream)
    states = {s["index"]: s["state"] for s in admin.stream_view(stream)["shards"]}
    rows = [(d["shard"], states.get(d["shard"]), d["key"], d["length"]) for d in found["shards"]]
    emit(output, found, lambda: table(["SHARD", "STATE", "DEAD-LETTER KEY", "ENTRIES"], rows))


@dlq.command("show")
@click.argument("stream")
@click.option("--shard", type=click.IntRange(0), help="Only this shard.")
@click.option("--limit", type=click.IntRange(1, 1_000), default=20, show_default=True)
@connection_options
def dlq_show(admin: AdminClient, output: str, stream: str, shard: int | None, limit: int) -> None:
    """Dead-lettered entries: original id, shard, deliveries, fields."""
    found = admin.dead_letter_entries(stream, shard, limit)
    rows = [
        (e["shard"], e["id"], e["originalId"], e["deliveries"], json.dumps(e["fields"], sort_keys=True))
        for e in found["entries"]
    ]
    emit(output, found, lambda: table(["SHARD", "ID", "ORIGINAL ID", "DELIVERIES", "FIELDS"], rows))


@dlq.command("replay")
@click.argument("stream")
@click.option("--shard", type=click.IntRange(0), help="Only this shard's dead letters.")
@click.option("--id", "ids", multiple=True, help="Only these dead-letter entry ids (repeatable).")
@click.option("--limit", type=click.IntRange(1, 1_000), default=100, show_default=True)
@connection_options
def dlq_replay(
    admin: AdminClient, output: str, stream: str, shard: int | None, ids: tuple[str, ...], limit: int
) -> None:
    """Append dead-lettered entries to the stream again (routed by their key), then remove them."""
    answer = admin.replay_dead_letters(stream, shard, list(ids), limit)
    done(admin, output, answer, f"stream {stream}: {answer.body['replayed']} dead letter(s) replayed")
