"""Shared test vectors for clients in any language (shipped in the package).

`jump-v1.json` holds, for a set of partition keys (UTF-8 text and raw bytes as hex), the
64-bit routing hash (hex), the bucket for several active-shard counts, and the shard index a
key routes to in layouts with retired and draining shards. The Python tests
(tests/core/test_routing.py) and the Node client's tests (clients/node) check their routing
against the same file. `python -m rsc.conformance.vectors` writes it again from
`rsc.events.routing`; a test fails when the file and the code disagree.
"""

from __future__ import annotations

import contextlib
import json
from importlib.resources import files
from typing import Any

from rsc.events.model import Layout, Shard, ShardState
from rsc.events.routing import JUMP_V1, bucket_of, key_hash, route

#: The active-shard counts every key is bucketed over.
COUNTS = (1, 2, 3, 4, 5, 8, 16, 31, 100, 1000, 16384)
#: Layouts (index, state) where routing must skip what is not ACTIVE.
LAYOUTS: tuple[tuple[tuple[int, str], ...], ...] = (
    ((0, "ACTIVE"), (1, "ACTIVE"), (2, "ACTIVE")),
    ((0, "RETIRED"), (1, "ACTIVE"), (2, "DRAINING"), (3, "ACTIVE"), (4, "ACTIVE")),
    ((0, "DRAINING"), (1, "DRAINING"), (2, "ACTIVE"), (5, "ACTIVE"), (6, "ACTIVE"), (7, "ACTIVE")),
)


def _keys() -> list[bytes]:
    keys = [b"", b"a", b"order-42", b"customer:1001", "Grüße".encode(), "注文-7".encode()]
    keys += [bytes([0, 255, 1, 254]), bytes(range(32))]
    keys += [f"key-{i}".encode() for i in range(100)]
    return keys


def _entry(key: bytes) -> dict[str, Any]:
    entry: dict[str, Any] = {"keyHex": key.hex()}
    with contextlib.suppress(UnicodeDecodeError):
        entry["key"] = key.decode("utf-8")
    entry["hash"] = f"{key_hash(key):016x}"
    entry["buckets"] = [bucket_of(key, n) for n in COUNTS]
    return entry


def build() -> dict[str, Any]:
    """The vector document, computed from `rsc.events.routing`."""
    keys = _keys()
    layouts = []
    for shards in LAYOUTS:
        layout = Layout(
            metadata_version=1,
            routing=JUMP_V1,
            shards=tuple(Shard(i, f"s:{{t}}:{i}", ShardState(state)) for i, state in shards),
        )
        layouts.append(
            {
                "shards": [{"index": i, "state": state} for i, state in shards],
                "routes": [route(layout, key).index for key in keys],
            }
        )
    return {
        "protocol": JUMP_V1,
        "about": "key (UTF-8 when it is text) and keyHex (its bytes) -> hash: the first 8 bytes "
        "of SHA-256(key) as big-endian hex; buckets: jump(hash, n) for each n of counts; "
        "layouts: the shard index each key (in the order of vectors) routes to",
        "counts": list(COUNTS),
        "vectors": [_entry(k) for k in keys],
        "layouts": layouts,
    }


def render() -> str:
    """The file's text (stable: sorted keys are not used, the order is the document's)."""
    doc = build()
    one = {k: json.dumps(v, ensure_ascii=False) for k, v in doc.items() if k not in ("vectors", "layouts")}
    parts = [f' "{k}": {v}' for k, v in one.items()]
    for name in ("vectors", "layouts"):
        rows = ",\n".join(f"  {json.dumps(row, ensure_ascii=False)}" for row in doc[name])
        parts.append(f' "{name}": [\n{rows}\n ]')
    return "{\n" + ",\n".join(parts) + "\n}\n"


def load() -> dict[str, Any]:
    """The shipped file, parsed."""
    data: dict[str, Any] = json.loads((files(__name__) / "jump-v1.json").read_text(encoding="utf-8"))
    return data
