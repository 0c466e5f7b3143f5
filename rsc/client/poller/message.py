"""What a handler is given: one stream entry of one shard, and the handler's type."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

__all__ = ["Handler", "Message", "pairs"]


@attrs.define
class Message:
    shard: int
    key: str
    id: str
    fields: Mapping[str, str]
    #: How many times a handler has started on it, this time included (at most one more when
    #: a process stopped between reading and handling it); > `max_deliveries`: dead-lettered.
    deliveries: int = 1
    #: The member that read it (`<pod ip>/<listener>/<index>` under `rsc worker`).
    member_id: str = ""
    #: Handed out before (a retry, or pending under an earlier owner): maybe already handled.
    redelivered: bool = False
    #: The publisher's trace context (W3C `traceparent`/`tracestate`), taken out of `fields`
    #: (`rsc.tracing`); empty without one.
    trace: Mapping[str, str] = attrs.field(factory=dict, repr=False, eq=False)


Handler = Callable[[Message], Awaitable[None]]


def pairs(flat: Any) -> dict[str, str]:
    """An entry's fields as Redis replied them (a flat list, or a mapping) as a dict."""
    if isinstance(flat, dict):
        return {str(k): str(v) for k, v in flat.items()}
    if flat and isinstance(flat[0], str):  # decoded replies (the usual case): pair them as they are
        it = iter(flat)
        return dict(zip(it, it, strict=False))
    items = list(flat or [])
    return {str(items[i]): str(items[i + 1]) for i in range(0, len(items), 2)}
