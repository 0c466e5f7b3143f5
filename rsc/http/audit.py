"""The audit log of admin requests: bounded in Redis, and one JSON log line each.

Every request under `/v1/admin/` is recorded, whatever its outcome
(including unauthenticated and forbidden ones): time, request id, caller,
remote address, method, path, HTTP status, outcome, the SHA-256 of the body
and the resulting revision.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import attrs
from coredis.tokens import PureToken

from rsc.actors.deployment import DEFAULT_KEYS, KeySpace, RedisClient, raise_first, redis_errors
from rsc.events import codec
from rsc.resp import Multiplexed

AUDIT_KEY = DEFAULT_KEYS.audit
log = logging.getLogger("rsc.audit")


@attrs.frozen
class AuditRecord:
    time_ms: int
    request_id: str
    caller: str | None
    remote_address: str | None
    method: str
    path: str
    status: int
    outcome: str
    body_sha256: str
    revision: int | None = None
    record_id: str | None = None
    #: For an aggregated record (outcome `throttled`): how many requests it stands for.
    count: int | None = None


@attrs.frozen
class AuditFilter:
    caller: str | None = None
    method: str | None = None
    status: int | None = None
    path_prefix: str | None = None
    outcome: str | None = None
    limit: int = 100
    request_id: str | None = None
    #: Only records older than this record id (a page's cursor).
    before: str | None = None

    def matches(self, record: AuditRecord) -> bool:
        return (
            (self.request_id is None or record.request_id == self.request_id)
            and (self.caller is None or record.caller == self.caller)
            and (self.method is None or record.method == self.method.upper())
            and (self.status is None or record.status == self.status)
            and (self.path_prefix is None or record.path.startswith(self.path_prefix))
            and (self.outcome is None or record.outcome == self.outcome)
        )


class AuditLog:
    """Audit records in a Redis stream capped at `max_records` (approximately), newest first."""

    def __init__(
        self,
        redis: RedisClient,
        max_records: int = 100_000,
        keys: KeySpace = DEFAULT_KEYS,
        lean: Multiplexed | None = None,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.max_records = max_records
        #: The coordinator's lean connection, where there is one: records are written on it.
        self.lean = lean

    async def record(self, entry: AuditRecord) -> None:
        data = codec.wire.unstructure(entry)
        text = json.dumps(data, separators=(",", ":"))
        log.info('{"audit":%s}', text)
        with redis_errors("writing the audit log"):
            if self.lean is not None:
                trim = ("MAXLEN", "~", self.max_records)
                raise_first(await self.lean.call([("XADD", self.keys.audit, *trim, "*", "record", text)]))
                return
            await self.redis.xadd(
                self.keys.audit,
                {"record": text},
                trim_strategy=PureToken.MAXLEN,
                threshold=self.max_records,
                trim_operator=PureToken.APPROXIMATELY,
            )

    async def read(self, wanted: AuditFilter) -> list[AuditRecord]:
        """Newest first, at most `wanted.limit` records that match (older than `wanted.before`)."""
        found, _ = await self.read_page(wanted)
        return found

    async def read_page(self, wanted: AuditFilter) -> tuple[list[AuditRecord], bool]:
        """`read`, and whether more records that match are older than the last one returned."""
        found: list[AuditRecord] = []
        end = "+" if wanted.before is None else "(" + wanted.before
        want = wanted.limit + 1  # one more tells whether there is a next page
        with redis_errors("reading the audit log"):
            while len(found) < want:
                page = await self.redis.xrevrange(self.keys.audit, end, "-", count=500)
                for raw in page:
                    record = _record(raw)
                    if wanted.matches(record):
                        found.append(record)
                        if len(found) == want:
                            break
                if len(page) < 500:
                    break
                end = "(" + str(page[-1].identifier)
        return found[: wanted.limit], len(found) > wanted.limit


def _record(raw: Any) -> AuditRecord:
    data = json.loads(raw.field_values["record"])
    data["recordId"] = str(raw.identifier)
    return codec.wire.structure(data, AuditRecord)
