"""OpenTelemetry traces from publish to handler (the `otel` extra: `pip install 'rsc[otel]'`).

On whenever `opentelemetry-api` is importable and `RSC_OTEL` is not `0`/`false`/`off`: spans go
to whatever tracer provider the application set (a no-op one by default: the SDK and its
exporters are the application's choice). Without the API, or turned off, nothing of OpenTelemetry
is imported and every function here is a no-op.

Messaging semantic conventions: a producer's call is a `send {stream}` span (kind PRODUCER)
whose context each message carries in two reserved entry fields, `rsc:traceparent` and
`rsc:tracestate` (W3C trace context; a worker strips them from `Message.fields` before the
handler sees them; workers of 0.2.0 and older pass them through to handlers as ordinary
fields); a handler call is a `process {stream}` span (kind CONSUMER), a child of that context
(one message at a time: the same trace), its error recorded; a dead-lettering is a
`settle {stream}` span. `messaging.system` is `rsc`: the messaging semantics (groups, shards,
redeliveries, dead letters) are rsc's, over Redis Streams; Redis itself appears as a database
(`db.system` `redis`) in the spans of a Redis client instrumentation, if any.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

#: The reserved entry fields that carry the publisher's trace context.
TRACEPARENT, TRACESTATE = "rsc:traceparent", "rsc:tracestate"
RESERVED = (TRACEPARENT, TRACESTATE)
SYSTEM = "rsc"


def _api() -> Any:
    """The `opentelemetry` API modules (trace, propagate), or None: not installed, or off."""
    if os.environ.get("RSC_OTEL", "").lower() in ("0", "false", "off", "no"):
        return None
    try:
        from opentelemetry import propagate, trace  # noqa: PLC0415  (optional: the `otel` extra)
    except ImportError:
        return None
    return trace, propagate


_LOADED: Any = None
_TRIED = False


def api() -> Any:
    """The API, looked up once (`enable(False)` turns it off for the process)."""
    global _LOADED, _TRIED
    if not _TRIED:
        _LOADED, _TRIED = _api(), True
    return _LOADED


def enable(on: bool) -> None:
    """Turn tracing on (if the API is importable) or off for this process."""
    global _LOADED, _TRIED
    _LOADED, _TRIED = (_api() if on else None), True


def _tracer() -> Any:
    found = api()
    return None if found is None else found[0].get_tracer("rsc")


def _carrier(span_context_holder: Any) -> dict[str, str]:
    found = api()
    carrier: dict[str, str] = {}
    if found is None:
        return carrier
    found[1].inject(carrier, context=span_context_holder)
    out = {TRACEPARENT: carrier["traceparent"]} if "traceparent" in carrier else {}
    if carrier.get("tracestate"):
        out[TRACESTATE] = carrier["tracestate"]
    return out


@contextlib.contextmanager
def send_span(stream: str, count: int) -> Iterator[dict[str, str]]:
    """A `send {stream}` span around one publish call of `count` messages; yields the fields
    each message carries (empty when tracing is off)."""
    tracer = _tracer()
    if tracer is None:
        yield {}
        return
    trace = api()[0]
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": stream,
        "messaging.batch.message_count": count,
    }
    with tracer.start_as_current_span(
        f"send {stream}", kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        yield _carrier(trace.set_span_in_context(span))


def set_message_id(ids: list[str]) -> None:
    """The entry id of a one-message publish, on the current `send` span."""
    found = api()
    if found is None or len(ids) != 1:
        return
    span = found[0].get_current_span()
    span.set_attribute("messaging.message.id", ids[0])


def with_context(fields: Mapping[str, Any], carried: Mapping[str, str]) -> Mapping[str, Any]:
    """`fields` with the trace fields added (the same object when there are none)."""
    if not carried:
        return fields
    return {**fields, **carried}


def split(fields: Mapping[str, str]) -> tuple[Mapping[str, str], dict[str, str]]:
    """An entry's fields without the reserved trace fields, and the W3C carrier they make."""
    if TRACEPARENT not in fields:
        return fields, {}
    carrier = {"traceparent": fields[TRACEPARENT]}
    if TRACESTATE in fields:
        carrier["tracestate"] = fields[TRACESTATE]
    return {k: v for k, v in fields.items() if k not in RESERVED}, carrier


def joined(fields: Mapping[str, str], carrier: Mapping[str, str]) -> Mapping[str, str]:
    """`fields` with the trace fields `split` took out put back (a dead letter keeps them)."""
    if not carrier:
        return fields
    out = {**fields, TRACEPARENT: carrier["traceparent"]}
    if "tracestate" in carrier:
        out[TRACESTATE] = carrier["tracestate"]
    return out


@contextlib.contextmanager
def process_span(
    stream: str, group: str, shard: int, entry_id: str, deliveries: int, carrier: Mapping[str, str]
) -> Iterator[Any]:
    """A `process {stream}` span around one handler call, a child of the publisher's context
    (`carrier`); an exception is recorded on it (and raised on)."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    trace, propagate = api()
    parent = propagate.extract(dict(carrier)) if carrier else None
    attributes = _consumer_attributes(stream, group, shard, entry_id, deliveries, "process")
    with tracer.start_as_current_span(
        f"process {stream}", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span


@contextlib.contextmanager
def settle_span(
    stream: str, group: str, shard: int, entry_id: str, deliveries: int, carrier: Mapping[str, str], how: str
) -> Iterator[None]:
    """A `settle {stream}` span: the entry dead-lettered (`how`), a child of the publisher's context."""
    tracer = _tracer()
    if tracer is None:
        yield
        return
    trace, propagate = api()
    parent = propagate.extract(dict(carrier)) if carrier else None
    attributes = _consumer_attributes(stream, group, shard, entry_id, deliveries, "settle")
    attributes["messaging.rsc.settle"] = how
    with tracer.start_as_current_span(
        f"settle {stream}", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes
    ):
        yield


def _consumer_attributes(
    stream: str, group: str, shard: int, entry_id: str, deliveries: int, operation: str
) -> MutableMapping[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
        "messaging.destination.name": stream,
        "messaging.consumer.group.name": group,
        "messaging.destination.partition.id": str(shard),
        "messaging.message.id": entry_id,
        "messaging.rsc.message.delivery_count": deliveries,
    }


#: One member heartbeat (or batch) in this many is a span of the coordinator's (0: none).
_SAMPLE = os.environ.get("RSC_OTEL_HEARTBEAT_SAMPLE", "100").strip()
HEARTBEAT_SAMPLE = int(_SAMPLE) if _SAMPLE.isdigit() else 100  # (not a number: the default)
_heartbeats = itertools.count()


@contextlib.contextmanager
def heartbeat_span(stream: str | None, group: str | None, items: int) -> Iterator[None]:
    """A `heartbeat {stream}` span around the coordinator's answer to one heartbeat (a batch of
    `items`, of any streams: `heartbeats`), for one in `HEARTBEAT_SAMPLE` of them (thousands
    arrive a second)."""
    tracer = _tracer()
    if tracer is None or HEARTBEAT_SAMPLE <= 0 or next(_heartbeats) % HEARTBEAT_SAMPLE:
        yield
        return
    attributes: dict[str, Any] = {"messaging.system": SYSTEM, "rsc.heartbeats": items}
    attributes["rsc.sampled_one_in"] = HEARTBEAT_SAMPLE
    if stream is not None and group is not None:
        attributes["messaging.destination.name"] = stream
        attributes["messaging.consumer.group.name"] = group
    name = "heartbeats" if stream is None else f"heartbeat {stream}"
    with tracer.start_as_current_span(name, attributes=attributes):
        yield


@contextlib.contextmanager
def coordinator_span(name: str, attributes: Mapping[str, Any]) -> Iterator[None]:
    """A span of the coordinator's (a rebalance, a layout change), if tracing is on."""
    tracer = _tracer()
    if tracer is None:
        yield
        return
    with tracer.start_as_current_span(name, attributes={"messaging.system": SYSTEM, **attributes}):
        yield


def trace_group(before: Any, after: Any, events: Any) -> None:
    """A group observer of the coordinator (`Registry.group_observers`): a span for each
    rebalance (a new target), layout change, pause, resume and position reset, with the
    group's epochs. Nothing when tracing is off."""
    if api() is None:
        return
    for event in events:
        name = type(event).__name__
        kind = _GROUP_SPANS.get(name)
        if kind is None:
            continue
        attributes = {
            "messaging.destination.name": after.stream_prefix,
            "messaging.consumer.group.name": after.group,
            "rsc.group_epoch": after.group_epoch,
            "rsc.assignment_epoch": after.assignment_epoch,
            "rsc.members": len(after.members),
            "rsc.layout_version": after.layout.metadata_version,
        }
        with coordinator_span(f"{kind} {after.stream_prefix}", attributes):
            pass


#: The group events a coordinator span is made of, and the span's name.
_GROUP_SPANS = {
    "TargetAssignmentUpdated": "rebalance",
    "LayoutApplied": "layout",
    "GroupPaused": "pause",
    "GroupResumed": "resume",
    "GroupPositionReset": "reset",
}
