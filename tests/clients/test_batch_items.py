"""A refused item of a batched heartbeat is a refusal with the HTTP status it would have got
alone: named by the item (this coordinator) or, from an older coordinator that names none,
the status its error code is answered with (`rsc.events.errors.HTTP_STATUS`). Before, every
item was taken for a 400, and a 429 (`QUOTA_EXCEEDED`, `RATE_LIMITED`), which a member waits
out, ended the worker."""

from __future__ import annotations

import pytest

from rsc.client.coordinator import _item_status
from rsc.events.errors import HTTP_STATUS


@pytest.mark.parametrize(
    ("item", "status"),
    [
        ({"error": "QUOTA_EXCEEDED", "status": 429}, 429),
        ({"error": "RATE_LIMITED", "status": 429}, 429),
        ({"error": "QUOTA_EXCEEDED"}, 429),  # an older coordinator: the code says it
        ({"error": "INCARNATION_MISMATCH"}, 409),
        ({"error": "UNKNOWN_STREAM"}, 404),
        ({"error": "INVALID_REQUEST"}, 400),
        ({"error": "SOMETHING_NEW"}, 400),
        ({"error": "QUOTA_EXCEEDED", "status": "429"}, 429),  # not a number: the code's
        ({"error": "QUOTA_EXCEEDED", "status": 200}, 429),  # not a refusal's status
        ({"error": "QUOTA_EXCEEDED", "status": True}, 429),
    ],
)
def test_a_refused_item_gets_the_status_it_would_have_got_alone(item: dict[str, object], status: int) -> None:
    assert _item_status(item) == status


def test_every_listed_code_is_a_client_error() -> None:
    assert all(400 <= status < 500 for status in HTTP_STATUS.values())
