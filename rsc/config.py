"""Coordinator configuration: a TOML file, each key overridable by environment.

The file holds only what the design allows: the Redis connection, the admin
account, and control-plane defaults. Streams and groups never live here;
they come from requests and the Admin API.

    redis_url = "redis://127.0.0.1:6379"      # RSC_REDIS_URL
    key_prefix = ""                           # RSC_KEY_PREFIX: every key rsc writes starts with it
    admin_user = "admin"                      # RSC_ADMIN_USER
    admin_password = "..."                    # RSC_ADMIN_PASSWORD
    admin_password_sha256 = "..."             # RSC_ADMIN_PASSWORD_SHA256 (instead of the password)
    heartbeat_interval_ms = 3000              # RSC_HEARTBEAT_INTERVAL_MS
    member_lease_ttl_ms = 10000               # RSC_MEMBER_LEASE_TTL_MS
    tick_interval_ms = 1000                   # RSC_TICK_INTERVAL_MS
    revoke_timeout_ms = 60000                 # RSC_REVOKE_TIMEOUT_MS
    default_shard_count = 4                   # RSC_DEFAULT_SHARD_COUNT
    auto_create_streams = true                # RSC_AUTO_CREATE_STREAMS
    auto_create_groups = true                 # RSC_AUTO_CREATE_GROUPS: a first join creates its group
    protect_views = false                     # RSC_PROTECT_VIEWS: GET /v1/streams... need monitor/admin
    protect_metrics = false                   # RSC_PROTECT_METRICS: /metrics needs monitor/admin
    insecure = false                          # RSC_INSECURE: anonymous members/producers from anywhere
    max_batch_items = 500                     # RSC_MAX_BATCH_ITEMS: heartbeats per POST /v1/heartbeats
    redis_connect_timeout_ms = 2000           # RSC_REDIS_CONNECT_TIMEOUT_MS
    redis_command_timeout_ms = 2000           # RSC_REDIS_COMMAND_TIMEOUT_MS
    admin_auth_max_failures = 10              # RSC_ADMIN_AUTH_MAX_FAILURES per address and window
    admin_auth_window_s = 60                  # RSC_ADMIN_AUTH_WINDOW_S
    certfile = "/etc/rsc/tls.crt"             # RSC_CERTFILE: serve HTTPS (with keyfile)
    keyfile = "/etc/rsc/tls.key"              # RSC_KEYFILE

    [[credentials]]                           # RSC_CREDENTIALS: the same list as JSON
    name = "billing-workers"                  # shown in logs and metrics
    token_sha256 = "..."                      # or token = "..." (at least 16 characters)
    roles = ["member"]                        # member, producer, monitor
    streams = ["billing-*", "orders:**"]      # patterns: * one ':' level, ** any (default ["**"])
    create = false                            # may heartbeats create streams and groups?
    pattern_syntax = "segments"               # optional: written for 0.2.0 patterns (0.1.0 refuses)
    quota = { streams = 50 }                  # optional: lower any of the five quotas for it
    max_body_bytes = 1048576                  # RSC_MAX_BODY_BYTES
    keep_alive_timeout_ms = 5000              # RSC_KEEP_ALIVE_TIMEOUT_MS: idle connections close
    body_timeout_ms = 60000                   # RSC_BODY_TIMEOUT_MS: a body arrives (else 408)
    max_connections = 1000                    # RSC_MAX_CONNECTIONS: more are answered 503
    coordinator_lease_ttl_ms = 4000           # RSC_COORDINATOR_LEASE_TTL_MS: one active coordinator
    coordinator_lease_replicas = 0            # RSC_COORDINATOR_LEASE_REPLICAS: replicas to ack it (WAIT)
    advertise_url = "http://10.0.0.5:8080"    # RSC_ADVERTISE_URL: what standbys tell clients
    initial_feature_level = 4                 # RSC_INITIAL_FEATURE_LEVEL: a new deployment's level
    quiesce_pause_timeout_ms = 30000          # RSC_QUIESCE_PAUSE_TIMEOUT_MS: PAUSING's bound
    quiesce_consume_timeout_ms = 300000       # RSC_QUIESCE_CONSUME_TIMEOUT_MS: QUIESCED's bound
    consumer_prune_interval_ms = 30000        # RSC_CONSUMER_PRUNE_INTERVAL_MS: departed members' consumers
    metrics_sample_interval_ms = 10000        # RSC_METRICS_SAMPLE_INTERVAL_MS: shard figures in /metrics
    retention_interval_ms = 5000              # RSC_RETENTION_INTERVAL_MS: streams trimmed by their
                                              # retention policy (0: never)
    retention_shards_per_s = 2000             # RSC_RETENTION_SHARDS_PER_S: trim calls a second, at most
    retired_shard_retention_ms = 604800000    # RSC_RETIRED_SHARD_RETENTION_MS: how long a retired
                                              # (drained) shard key is kept (default 7 days)
    quota_streams = 100000                    # RSC_QUOTA_STREAMS: streams in the deployment, and
                                              # per credential (those it created; docs: Quotas)
    quota_shards_per_stream = 4096            # RSC_QUOTA_SHARDS_PER_STREAM
    quota_groups_per_stream = 1000            # RSC_QUOTA_GROUPS_PER_STREAM
    quota_members_per_group = 10000           # RSC_QUOTA_MEMBERS_PER_GROUP (live members)
    quota_producers_per_stream = 10000        # RSC_QUOTA_PRODUCERS_PER_STREAM (live producers)
    anonymous_quota_streams = 10000           # RSC_ANONYMOUS_QUOTA_STREAMS: what anonymous callers
    anonymous_quota_shards_per_stream = 1024  # may create, all together (the same five quotas)
    anonymous_quota_groups_per_stream = 100
    anonymous_quota_members_per_group = 2000
    anonymous_quota_producers_per_stream = 1000
    rate_limit_party_per_interval = 10        # RSC_RATE_LIMIT_PARTY_PER_INTERVAL: heartbeats per member
    rate_limit_party_burst = 100              # or producer id per heartbeat interval, and burst
    rate_limit_heartbeats_per_s = 200000      # RSC_RATE_LIMIT_HEARTBEATS_PER_S per credential/address
    rate_limit_views_per_s = 1000             # RSC_RATE_LIMIT_VIEWS_PER_S per credential/address
    rate_limit_admin_writes_per_s = 50        # RSC_RATE_LIMIT_ADMIN_WRITES_PER_S per address (0: off)
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs

from rsc.actors.keys import check_namespace
from rsc.actors.store_connection import DEFAULT_REDIS_URL
from rsc.connect import is_sentinel_url, parse_sentinel_url, redacted
from rsc.events import auth, quotas
from rsc.events.versions import MAX_FEATURE_LEVEL


class ConfigError(ValueError):
    """The configuration is unusable; the message says which key and why."""


@attrs.frozen
class Settings:
    redis_url: str = attrs.field(default=DEFAULT_REDIS_URL, repr=redacted)
    #: The namespace of every key (`rsc.actors.keys.KeySpace`): "" or e.g. "demo:".
    key_prefix: str = ""
    admin_user: str = "admin"
    admin_password: str | None = attrs.field(default=None, repr=False)  # never in a log line
    admin_password_sha256: str | None = attrs.field(default=None, repr=False)
    heartbeat_interval_ms: int = 3_000
    member_lease_ttl_ms: int = 10_000
    tick_interval_ms: int = 1_000
    revoke_timeout_ms: int = 60_000
    default_shard_count: int = 4
    auto_create_streams: bool = True
    auto_create_groups: bool = True
    protect_views: bool = False
    protect_metrics: bool = False
    insecure: bool = False
    max_batch_items: int = 500
    redis_connect_timeout_ms: int = 2_000
    redis_command_timeout_ms: int = 2_000
    admin_auth_max_failures: int = 10
    admin_auth_window_s: int = 60
    certfile: str | None = None
    keyfile: str | None = None
    credentials: tuple[auth.Credential, ...] = ()
    max_body_bytes: int = 1_048_576
    #: Connection limits (rsc.http.server): an idle connection closes after the keep-alive
    #: timeout (also the longest a request head may take), a request body must arrive
    #: within the body timeout (408), and connections beyond the maximum get 503.
    keep_alive_timeout_ms: int = 5_000
    body_timeout_ms: int = 60_000
    max_connections: int = 1_000
    #: High availability: the lease that makes one coordinator per Redis active (the
    #: others are standbys), and the URL the active one tells standbys to name to clients
    #: (default: the address it listens on, unless that is a wildcard).
    coordinator_lease_ttl_ms: int = 4_000
    #: Replicas that must acknowledge each lease acquisition and renewal (`WAIT`) before it
    #: counts: 1 with a Sentinel- or Cluster-managed replica, so that a failover cannot hand
    #: the lease to a second coordinator while the first believes it is active. 0: off.
    coordinator_lease_replicas: int = 0
    advertise_url: str | None = None
    #: The feature level a deployment starts at when the first coordinator that knows feature
    #: levels finds none in Redis and no stream exists there yet (an upgraded 0.1.0
    #: deployment starts at 1, whatever this says). Lower it to keep 0.1.0 coordinators usable.
    initial_feature_level: int = MAX_FEATURE_LEVEL
    #: Quiesce-mode resharding: how long producers may take to report `quiesced` (PAUSING),
    #: and the groups to consume everything on every shard (QUIESCED), before the migration
    #: stops for an operator to resume or abort it.
    quiesce_pause_timeout_ms: int = 30_000
    quiesce_consume_timeout_ms: int = 300_000
    #: How long a retired shard key (drained: nothing pending, nothing to deliver) is kept
    #: before Redis deletes it with its seal, owner tokens, dead letters and retention counts
    #: (default 7 days; None, from Python only: until the stream is deleted).
    retired_shard_retention_ms: int | None = 7 * 24 * 3600 * 1000
    #: How often the Redis consumers of members that left or were fenced are deleted (once
    #: nothing is pending under them); 0 switches it off.
    consumer_prune_interval_ms: int = 30_000
    #: How often shard lengths, lag, pending and dead letters are read for `/metrics`.
    metrics_sample_interval_ms: int = 10_000
    #: How often each stream with a retention policy is trimmed (0: never), and the most trim
    #: calls (one shard key each) a second over every stream (docs/operations.md, Retention).
    retention_interval_ms: int = 5_000
    retention_shards_per_s: int = 2_000
    #: Quotas (`rsc.events.quotas`): the deployment's (each credential's too, unless its
    #: `quota` table lowers them), and what anonymous callers may create all together.
    quota_streams: int = quotas.DEFAULT_LIMITS.streams
    quota_shards_per_stream: int = quotas.DEFAULT_LIMITS.shards_per_stream
    quota_groups_per_stream: int = quotas.DEFAULT_LIMITS.groups_per_stream
    quota_members_per_group: int = quotas.DEFAULT_LIMITS.members_per_group
    quota_producers_per_stream: int = quotas.DEFAULT_LIMITS.producers_per_stream
    anonymous_quota_streams: int = quotas.ANONYMOUS_LIMITS.streams
    anonymous_quota_shards_per_stream: int = quotas.ANONYMOUS_LIMITS.shards_per_stream
    anonymous_quota_groups_per_stream: int = quotas.ANONYMOUS_LIMITS.groups_per_stream
    anonymous_quota_members_per_group: int = quotas.ANONYMOUS_LIMITS.members_per_group
    anonymous_quota_producers_per_stream: int = quotas.ANONYMOUS_LIMITS.producers_per_stream
    #: Rate limits (`rsc.http.ratelimit`; 0 switches one off): heartbeats per member id or
    #: producer id per heartbeat interval (and its burst), and per caller (a credential, or an
    #: anonymous caller's address) heartbeats, views and Admin API writes a second.
    rate_limit_party_per_interval: int = 10
    rate_limit_party_burst: int = 100
    rate_limit_heartbeats_per_s: int = 200_000
    rate_limit_views_per_s: int = 1_000
    rate_limit_admin_writes_per_s: int = 50

    @property
    def redis_url_configured(self) -> bool:
        """Whether the Redis URL came from the file or the environment (not the default)."""
        return self.redis_url != DEFAULT_REDIS_URL

    @property
    def limits(self) -> quotas.Limits:
        """The deployment's quotas (an admin's, and every credential's at most)."""
        return quotas.Limits(**{name: getattr(self, f"quota_{name}") for name in quotas.NAMES})

    def quota_for(self, caller: auth.Credential | None) -> quotas.Quota:
        """The quotas of a request's caller (None: anonymous)."""
        limits = self.limits
        if caller is None:
            anonymous = {name: getattr(self, f"anonymous_quota_{name}") for name in quotas.NAMES}
            return quotas.Quota(quotas.ANONYMOUS, limits.lowered(anonymous), limits.streams)
        if caller is auth.ADMIN:
            return quotas.Quota("admin", limits, limits.streams)
        # (A kind prefix: a credential named "admin" or "anonymous" counts apart from those.)
        owner = f"credential:{caller.name}"
        return quotas.Quota(owner, limits.lowered(dict(caller.quota)), limits.streams)

    @property
    def policy(self) -> auth.Policy:
        """Who may do what (see `rsc.events.auth`)."""
        return auth.Policy(
            self.credentials,
            protect_views=self.protect_views,
            protect_metrics=self.protect_metrics,
            insecure=self.insecure,
        )


__all__ = ["ConfigError", "Settings", "load", "redacted", "validate"]

_FIELDS = {a.name: a for a in attrs.fields(Settings)}


def load(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read `path` (optional), apply `RSC_*` environment overrides, validate; raise `ConfigError`."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    if path is not None:
        try:
            values.update(tomllib.loads(Path(path).read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
    for name in _FIELDS:
        env = f"RSC_{name.upper()}"
        if environ.get(env, "") != "":  # an empty variable counts as unset
            values[name] = environ[env]
    settings = Settings(**{name: _coerce(name, value) for name, value in values.items()})
    if "coordinator_lease_ttl_ms" not in values:  # unset: what fits the member lease
        fitting = min(settings.coordinator_lease_ttl_ms, settings.member_lease_ttl_ms // 2)
        settings = attrs.evolve(settings, coordinator_lease_ttl_ms=fitting)
    validate(settings)
    return settings


def _coerce(name: str, value: Any) -> Any:
    if name == "credentials":
        return _credentials(value)
    kind = str(_FIELDS[name].type)
    try:
        if kind in ("int", "int | None"):
            return _as_int(value)
        if kind == "bool":
            return _as_bool(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: {value!r} is not valid: {exc}") from exc
    return None if value is None else str(value)


def _quota_table(value: Any) -> dict[str, int]:
    """A credential's `quota` table: some of the five quotas, each a whole number >= 1."""
    if not isinstance(value, dict):
        raise ConfigError(f"quota must be a table of some of {', '.join(quotas.NAMES)}")
    unknown = sorted(set(value) - set(quotas.NAMES))
    if unknown:
        raise ConfigError(f"unknown quotas {', '.join(unknown)} (known: {', '.join(quotas.NAMES)})")
    table = {}
    for name, limit in value.items():
        whole = isinstance(limit, int) and not isinstance(limit, bool)
        if not whole and not (isinstance(limit, str) and limit.isdigit()):
            raise ConfigError(f"quota {name} must be a whole number, not {limit!r}")
        table[name] = int(limit)
        if table[name] < 1:
            raise ConfigError(f"quota {name} must be at least 1 (to create nothing, leave create false)")
    return table


def _credentials(value: Any) -> tuple[auth.Credential, ...]:
    """`[[credentials]]` tables, or the same list as JSON (from RSC_CREDENTIALS)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigError(f"credentials: not a JSON list: {exc}") from exc
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ConfigError("credentials must be a list of tables (name, token or token_sha256, roles, ...)")
    known = {"name", "token", "token_sha256", "roles", "streams", "create", "pattern_syntax", "quota"}
    out = []
    for item in value:
        unknown = sorted(set(item) - known)
        if unknown:
            raise ConfigError(f"credentials: unknown keys {', '.join(unknown)}")
        roles = item.get("roles", [])
        streams = item.get("streams", [auth.EVERY_STREAM])
        if not isinstance(roles, list) or not isinstance(streams, list):
            raise ConfigError("credentials: roles and streams must be lists")
        try:
            out.append(
                auth.credential(
                    item.get("name", ""),
                    roles,
                    token=item.get("token"),
                    token_sha256=item.get("token_sha256"),
                    streams=streams,
                    create=_as_bool(item.get("create", False)),
                    pattern_syntax=item.get("pattern_syntax"),
                    quota=_quota_table(item.get("quota", {})),
                )
            )
        except (auth.PolicyError, ValueError) as exc:
            raise ConfigError(f"credentials: {exc}") from exc
    try:
        auth.policy(out)
    except auth.PolicyError as exc:
        raise ConfigError(f"credentials: {exc}") from exc
    return tuple(out)


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError("a boolean is not a number")
    return int(value)


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _check_redis_url(url: str) -> None:
    """A Redis URL that can be connected to: redis:// or rediss://, a host, a port, a database
    number; or a sentinel URL (`redis+sentinel://h1:p1,h2:p2/service[/db]`)."""
    shown = redacted(url)
    if is_sentinel_url(url):
        try:
            parse_sentinel_url(url)
        except ValueError as exc:
            raise ConfigError(f"redis_url {shown}: {exc}") from exc
        return
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"redis_url {shown}: {exc}") from exc
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ConfigError(
            f"redis_url {shown}: expected redis://[user:password@]host[:port][/db] (or rediss://, "
            "or redis+sentinel://host:port[,host:port...]/service[/db])"
        )
    if port == 0:
        raise ConfigError(f"redis_url {shown}: port 0")
    db = parts.path.lstrip("/")
    if db and not (db.isdigit() and int(db) < 16_384):
        raise ConfigError(f"redis_url {shown}: the database must be a number, not {db!r}")


def validate(settings: Settings) -> None:
    """Refuse settings that cannot work together."""
    for name in ("heartbeat_interval_ms", "member_lease_ttl_ms", "tick_interval_ms", "revoke_timeout_ms"):
        if getattr(settings, name) <= 0:
            raise ConfigError(f"{name} must be positive")
    if settings.member_lease_ttl_ms < 3 * settings.heartbeat_interval_ms:
        raise ConfigError(
            f"member_lease_ttl_ms ({settings.member_lease_ttl_ms}) must be at least 3 x "
            f"heartbeat_interval_ms ({settings.heartbeat_interval_ms}), "
            "so that one lost heartbeat never fences a member"
        )
    if settings.tick_interval_ms > settings.member_lease_ttl_ms:
        raise ConfigError("tick_interval_ms must not exceed member_lease_ttl_ms")
    if not 1 <= settings.default_shard_count <= 16_384:
        raise ConfigError("default_shard_count must be between 1 and 16384")
    _check_redis_url(settings.redis_url)
    try:
        check_namespace(settings.key_prefix)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if settings.max_body_bytes < 1_024:
        raise ConfigError("max_body_bytes must be at least 1024")
    for name in ("keep_alive_timeout_ms", "body_timeout_ms", "max_connections"):
        if getattr(settings, name) <= 0:
            raise ConfigError(f"{name} must be positive")
    if not 1 <= settings.max_batch_items <= 100_000:
        raise ConfigError("max_batch_items must be between 1 and 100000")
    for name in ("redis_connect_timeout_ms", "redis_command_timeout_ms"):
        if not 1 <= getattr(settings, name) <= 600_000:
            raise ConfigError(f"{name} must be between 1 and 600000")
    if settings.admin_auth_max_failures < 1 or settings.admin_auth_window_s < 1:
        raise ConfigError("admin_auth_max_failures and admin_auth_window_s must be positive")
    if (settings.certfile is None) != (settings.keyfile is None):
        raise ConfigError("certfile and keyfile go together: give both or neither")
    _validate_high_availability(settings)
    if not 0 <= settings.coordinator_lease_replicas <= 16:
        raise ConfigError("coordinator_lease_replicas must be between 0 and 16")
    if not 1 <= settings.initial_feature_level <= MAX_FEATURE_LEVEL:
        raise ConfigError(f"initial_feature_level must be between 1 and {MAX_FEATURE_LEVEL}")
    for name in ("quiesce_pause_timeout_ms", "quiesce_consume_timeout_ms"):
        if getattr(settings, name) <= 0:
            raise ConfigError(f"{name} must be positive")
    if settings.metrics_sample_interval_ms <= 0:
        raise ConfigError("metrics_sample_interval_ms must be positive")
    for name in ("consumer_prune_interval_ms", "retention_interval_ms"):
        if getattr(settings, name) < 0:
            raise ConfigError(f"{name} must not be negative (0: never)")
    if settings.retention_shards_per_s < 1:
        raise ConfigError("retention_shards_per_s must be at least 1")
    if settings.retired_shard_retention_ms is not None and settings.retired_shard_retention_ms < 0:
        raise ConfigError("retired_shard_retention_ms must not be negative (unset: keep until deleted)")
    for name in quotas.NAMES:
        for setting in (f"quota_{name}", f"anonymous_quota_{name}"):
            if getattr(settings, setting) < 1:
                raise ConfigError(f"{setting} must be at least 1")
    for name in (
        "rate_limit_party_per_interval",
        "rate_limit_party_burst",
        "rate_limit_heartbeats_per_s",
        "rate_limit_views_per_s",
        "rate_limit_admin_writes_per_s",
    ):
        if getattr(settings, name) < 0:
            raise ConfigError(f"{name} must not be negative (0: no limit)")
    # Streams made by a heartbeat get the default count: a quota below it would refuse them all.
    lowest = [("quota_shards_per_stream", settings.quota_shards_per_stream)]
    lowest.append(("anonymous_quota_shards_per_stream", settings.anonymous_quota_shards_per_stream))
    lowest += [
        (f"the quota of credential {c.name!r}", dict(c.quota)[quotas.SHARDS_PER_STREAM])
        for c in settings.credentials
        if quotas.SHARDS_PER_STREAM in dict(c.quota)
    ]
    for what, limit in lowest:
        if settings.default_shard_count > limit:
            raise ConfigError(
                f"default_shard_count ({settings.default_shard_count}) must not exceed "
                f"{what} ({limit} shards per stream)"
            )


def _validate_high_availability(settings: Settings) -> None:
    if settings.coordinator_lease_ttl_ms < 100:
        raise ConfigError("coordinator_lease_ttl_ms must be at least 100")
    if 2 * settings.coordinator_lease_ttl_ms > settings.member_lease_ttl_ms:
        raise ConfigError(
            f"coordinator_lease_ttl_ms ({settings.coordinator_lease_ttl_ms}) must be at most half of "
            f"member_lease_ttl_ms ({settings.member_lease_ttl_ms}), so that members outlive a "
            "coordinator failover within their lease"
        )
    url = urlsplit(settings.advertise_url or "")
    if settings.advertise_url is not None and (url.scheme not in ("http", "https") or not url.hostname):
        raise ConfigError(f"advertise_url: {settings.advertise_url!r} is not an http:// or https:// URL")
