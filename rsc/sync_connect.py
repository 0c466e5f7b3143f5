"""A redis-py client from a Redis URL, for the synchronous producer (`pip install 'rsc[sync]'`).

The same URLs as `rsc.connect.open_redis`: `redis://` and `rediss://` (redis-py's own URL
form, `ssl_*` options included) and the primary that Redis Sentinel names,
`redis+sentinel://[[user]:password@]h1:p1,h2:p2/service[/db][?sentinel_password=...]`
(`rediss+sentinel://` for TLS to the data nodes). One URL serves both producers:

    redis = sync_redis("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/main")
    with SyncProducer(SyncCoordinator("http://127.0.0.1:8080"), redis, "orders") as producer:
        producer.publish({"amount": "12"}, key="customer-7")

A sentinel client follows a promotion without a restart: redis-py's sentinel-managed
connections ask the sentinels where the primary is on every (re)connect, and a READONLY
reply from a primary demoted under an open connection drops that connection and raises
`ConnectionError`, which the producer retries. Nothing connects before the first command;
a URL that cannot work raises `rsc.connect.RedisRefused` at once. This is no cluster client
(the synchronous producer publishes to one Redis).
"""

from __future__ import annotations

from typing import Any

try:
    import redis
    import redis.sentinel
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("sync_redis needs redis-py: pip install 'rsc[sync]'") from exc

from rsc.connect import (
    DEFAULT_REDIS_URL,
    SENTINEL_TIMEOUT_S,
    RedisRefused,
    SentinelTarget,
    is_sentinel_url,
    parse_sentinel_url,
    redacted,
    tls_check_hostname,
)

__all__ = ["sync_redis"]


def sync_redis(url: str = DEFAULT_REDIS_URL, **kwargs: Any) -> redis.Redis:
    """A redis-py client for `url`; `kwargs` go to `redis.Redis` (for a sentinel URL: to the
    primary's connections, e.g. `decode_responses=True`, `socket_timeout=5`).

    Raises `RedisRefused` when the URL cannot work (its password never in the message).
    Nothing connects here: a Redis that does not answer or refuses the credential fails the
    first command, with redis-py's own errors (`ConnectionError`, `AuthenticationError`...).
    """
    if is_sentinel_url(url):
        try:
            target = parse_sentinel_url(url)
        except ValueError as exc:
            raise RedisRefused(f"unusable Redis URL {redacted(url)}: {exc}") from exc
        return _sentinel_primary(target, kwargs)
    scheme = url.partition("://")[0].lower()
    if scheme not in ("redis", "rediss"):
        raise RedisRefused(
            f"unusable Redis URL {redacted(url)}: a Redis URL starts with redis://, rediss:// "
            f"or (Sentinel) redis+sentinel://, not {scheme}://"
        )
    try:
        return redis.Redis.from_url(url, **kwargs)
    except ValueError as exc:
        raise RedisRefused(f"unusable Redis URL {redacted(url)}: {exc}") from exc


class SentinelPrimary(redis.Redis):
    """The client of a sentinel-named primary; closing it closes the connections to the sentinels too."""

    #: (Not `sentinel`: that name is redis-py's SENTINEL command.)
    sentinels: redis.sentinel.Sentinel | None = None

    def close(self) -> None:
        super().close()
        if self.sentinels is not None:
            self.sentinels.close()


def _sentinel_primary(target: SentinelTarget, kwargs: dict[str, Any]) -> redis.Redis:
    node: dict[str, Any] = {"username": target.username, "password": target.password, "db": target.db}
    if target.tls:
        options = dict(target.tls_options)
        reqs = options.get("ssl_cert_reqs", "required").lower()
        node.update(
            ssl=True,
            ssl_ca_certs=options.get("ssl_ca_certs"),
            ssl_certfile=options.get("ssl_certfile"),
            ssl_keyfile=options.get("ssl_keyfile"),
            ssl_cert_reqs=reqs,
            ssl_check_hostname=reqs == "required" and tls_check_hostname(options),
        )
    node.update(kwargs)
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        list(target.sentinels),
        sentinel_kwargs={
            "socket_timeout": kwargs.get("socket_timeout") or SENTINEL_TIMEOUT_S,
            "socket_connect_timeout": kwargs.get("socket_connect_timeout") or SENTINEL_TIMEOUT_S,
            "password": target.sentinel_password,
        },
    )
    client = sentinel.master_for(target.service, redis_class=SentinelPrimary, **node)  # type: ignore[no-untyped-call,unused-ignore]
    assert isinstance(client, SentinelPrimary)
    client.sentinels = sentinel
    return client
