"""The client's own exceptions: every transport or protocol failure maps to one of these, once.

Who raises what, and what the caller does:

* `RscError` (the base): raised as itself by a producer used wrongly (`publish` after `aclose`
  or `close`, or before it has a layout: the trio one before `run` started, the synchronous
  one before `start`). Catch it to catch everything below.
* `CoordinatorUnavailable`: a `Coordinator`/`SyncCoordinator` call after its retries (no
  coordinator answered, or only 502/503/504); `open_producer` and `SyncProducer.start` when no
  layout came within `start_timeout_s`. Retry later; check the coordinator URLs. `Member`
  treats it as a failed heartbeat and never raises it. Also, at once, constructing a
  `Coordinator`/`SyncCoordinator` with a CA bundle it cannot read (the message names the file
  and why): fix the file or `RSC_CA_BUNDLE`. (A coordinator URL that is malformed, not
  `http://` or `https://`, or without a host is a `ValueError` when constructing.)
* `CoordinatorUnintelligible` (a `CoordinatorUnavailable`): an answer that is not JSON or not
  of the expected shape, raised at once by a call; by `Member.run` after a lease of them.
  Upgrade this client, or check that the URL names a coordinator.
* `CoordinatorRejected`: a call the coordinator refused (4xx, and 5xx other than 502/503/504),
  at once; `Member.run` for a heartbeat refused for good (401/403...); a producer's `run`/start
  for a credential refused (401/403) before it registered. Fix the credential or the request.
* `MemberReplaced`: `Member.run` and `App.run`, when a newer process took the static member id
  over. Stop for good: do not restart with the same `RSC_INSTANCE_ID` (`rsc worker` exits 3).
* `RedisUnavailable`: `redis_call` (the poller's Redis calls), when Redis cannot answer now.
  Retry after a pause (the poller does; producers retry within `delivery_timeout_s`, then
  raise `PublishFailed`: a producer never lets a `RedisUnavailable` or `RedisCommandFailed` out).
* `RedisCommandFailed`: `redis_call`, when Redis refuses a command (`code`: `NOPERM`, `NOGROUP`...).
  Retrying will not help until what `code` names is fixed (an ACL, a lost key).
* `Fenced` (a `RedisCommandFailed`): `redis_call`, when a fenced script says the shard is not
  this member's. Touch the shard no more (the poller reports it stalled until the coordinator
  says whose it is).

Elsewhere: `rsc.client.producer_state` (`PublishFailed`, `ProducerPaused`, `NoWritableShards`,
`UnsupportedRouting`, all `RscError`s), `rsc.connect` (`RedisUnreachable`, `RedisRefused`:
`ConnectionError`s) and `rsc.client.admin_api.AdminError` (an `Exception`: what `AdminClient`
raises, an unusable URL or CA bundle and an answer it cannot read included).
"""

from __future__ import annotations

from typing import Any


class RscError(Exception):
    """Base of every error `rsc.client` raises."""


class CoordinatorUnavailable(RscError):
    """The coordinator could not be reached, or answered 5xx, even after retries.

    Only 502/503/504 are retried and end here; another 5xx is a `CoordinatorRejected`."""


#: Refusals a producer that has not registered yet gives up on at once: its credential is
#: wrong or does not cover the stream (other refusals, such as an unknown stream, may pass).
REFUSED_FOR_GOOD = frozenset({401, 403})


class CoordinatorRejected(RscError):
    """The coordinator refused the request (4xx): `code` is the protocol's error code.

    Also a 5xx other than 502/503/504 (not retried), and the refused item of a batch of
    heartbeats (`status` 400 whatever the item's code)."""

    def __init__(
        self, status: int, code: str, message: str, request_id: str = "", details: Any = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.details = details


class MemberReplaced(RscError):
    """A newer process joined with this member's static id and took it over (the coordinator
    answered FENCED, reason REPLACED): this member has dropped every shard and stopped for good.
    Two processes were started with one instance id (`RSC_INSTANCE_ID`), or this one was
    paused so long that it was restarted elsewhere."""


class CoordinatorUnintelligible(CoordinatorUnavailable):
    """The coordinator answered, but not in a form this client can read (not JSON, or a field
    it does not understand): a newer or broken coordinator. Counted as a failed request."""


class RedisUnavailable(RscError):
    """Redis could not answer now (connection lost or refused, a timeout, loading after a
    restart, a failover in progress): worth retrying after a pause."""


class RedisCommandFailed(RscError):
    """Redis refused a command (`code` is the Redis error code, e.g. `NOGROUP`, `NOPERM`)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class Fenced(RedisCommandFailed):
    """The shard's owner token names someone else: this member must not touch the shard."""
