"""Who may do what: roles, credentials and one pure decision function.

The policy is data. A credential is a named bearer token (stored as its
SHA-256, never in clear) with roles and the stream prefixes it may touch,
given as patterns with segment semantics (`orders`, `orders-*`, `orders:*`,
`orders:**`): stream names are `:`-separated levels (the Redis key
convention), `*` matches within one level, `**` across levels, `?` one
character of a level, `[...]` one character of a class (never `:`), the
way Kafka ACLs name topics by literal or prefix (`orders:**` is Kafka's
PREFIXED `orders:`) and RabbitMQ topic bindings use `*` for one word. An
absent list means every stream (`**`). `decide` answers one question:
may this caller (a credential, the admin, or nobody) do this action on this
stream? `read_scope` answers the other: which streams a read path may show
it. The HTTP layer authenticates and asks; nothing here does I/O.

Roles and what they allow:

* `member`: heartbeats of consumer members (`POST /v1/heartbeat(s)`);
* `producer`: producer heartbeats and routing metadata;
* `monitor`: the read-only views and `/metrics` when those are protected;
* `admin`: the Admin API (HTTP Basic, the one account from config) and,
  like `monitor`, every view.

Creating a stream or a group by a heartbeat (auto-creation) needs a
credential with `create = true` on a matching prefix, besides the
coordinator's `auto_create_streams`.

Protected mode (in the spirit of Redis' `protected-mode`): with no
credentials configured, anonymous members and producers are accepted only
from loopback addresses, unless the operator said `insecure`.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping

import attrs


class Role(enum.Enum):
    ADMIN = "admin"
    MEMBER = "member"
    PRODUCER = "producer"
    MONITOR = "monitor"


class Action(enum.Enum):
    """What a request does, as the policy sees it."""

    MEMBER_HEARTBEAT = "member-heartbeat"
    PRODUCER_HEARTBEAT = "producer-heartbeat"
    ROUTING = "routing"  # GET /v1/streams/{p}/routing: producers and monitors
    VIEW = "view"  # GET /v1/streams...
    METRICS = "metrics"
    ADMIN = "admin"


#: The roles that may perform each action (on a stream their patterns match).
ROLES_FOR: Mapping[Action, frozenset[Role]] = {
    Action.MEMBER_HEARTBEAT: frozenset({Role.MEMBER}),
    Action.PRODUCER_HEARTBEAT: frozenset({Role.PRODUCER}),
    Action.ROUTING: frozenset({Role.PRODUCER, Role.MONITOR, Role.ADMIN}),
    Action.VIEW: frozenset({Role.MONITOR, Role.ADMIN}),
    Action.METRICS: frozenset({Role.MONITOR, Role.ADMIN}),
    Action.ADMIN: frozenset({Role.ADMIN}),
}

#: Credential names: shown in logs and metrics, so short and plain.
CREDENTIAL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
#: Stream patterns: the name characters plus the glob `*`, `?` and `[...]`.
STREAM_PATTERN = re.compile(r"^[A-Za-z0-9._:*?\[\]!-]{1,200}$")
MIN_TOKEN_LENGTH = 16
#: The pattern of every stream: any characters, `:` included.
EVERY_STREAM = "**"
#: A `*` that is not part of a run of two or more (`**`, `***`: any characters, `:` included).
_LONE_STAR = re.compile(r"(?<!\*)\*(?!\*)")


class PolicyError(ValueError):
    """The configured credentials are unusable; the message says which and why."""


class Verdict(enum.Enum):
    ALLOW = "allow"
    UNAUTHENTICATED = "unauthenticated"  # 401: say who you are
    FORBIDDEN = "forbidden"  # 403: you may not
    PROTECTED_MODE = "protected-mode"  # 403: anonymous, not from loopback, no credentials configured


def token_digest(token: str) -> str:
    """The hex SHA-256 under which a token is stored and looked up."""
    return hashlib.sha256(token.encode()).hexdigest()


@attrs.frozen
class Credential:
    """A named bearer token: its digest, roles, the stream patterns it covers, and creation rights."""

    name: str
    token_sha256: str
    roles: frozenset[Role]
    streams: tuple[str, ...] = (EVERY_STREAM,)
    create: bool = False
    #: The credential says its patterns are written for segment semantics (`pattern_syntax =
    #: "segments"`, a key an N-1 coordinator refuses): no warning for them at start.
    segments_declared: bool = False
    #: Its `quota` table: some of `rsc.events.quotas.NAMES`, each lowering the deployment's.
    quota: tuple[tuple[str, int], ...] = ()

    def covers(self, stream_prefix: str | None) -> bool:
        if stream_prefix is None or self.everything:
            return True
        return _covered(stream_prefix, self.streams)

    @property
    def everything(self) -> bool:
        """Whether the patterns cover every stream name."""
        return EVERY_STREAM in self.streams

    def narrowed(self) -> tuple[str, ...]:
        """Its patterns that match less than they did as fnmatch globs before 0.2.0 (where `*`,
        `?` and classes crossed `:`): `?`, `[`, or a `*` that is not part of `**`."""
        return tuple(p for p in self.streams if "?" in p or "[" in p or _LONE_STAR.search(p))


@functools.lru_cache(maxsize=4096)
def _covered(stream_prefix: str, patterns: tuple[str, ...]) -> bool:
    return any(pattern_regex(pattern).fullmatch(stream_prefix) is not None for pattern in patterns)


@functools.lru_cache(maxsize=1024)
def pattern_regex(pattern: str) -> re.Pattern[str]:
    """The regular expression of a stream pattern (segment semantics, see the module)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                out.append(".*")
                while i < n and pattern[i] == "*":
                    i += 1
                continue
            out.append("[^:]*")
        elif c == "?":
            out.append("[^:]")
        elif c == "[":  # a class: `[abc]` or `[!abc]`, its characters listed (no ranges)
            j = i + 1
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":  # a `]` first is one of the characters
                j += 1
            end = pattern.find("]", j)
            if end < 0:  # never closed: a literal `[`
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                negated = body.startswith("!")
                listed = body[1:] if negated else body
                if "-" in listed[1:-1]:  # `a-c` was a range to fnmatch: refused, never misread
                    raise ValueError(
                        f"[{body}]: a class lists its characters; ranges such as a-c are not read"
                    )
                members = "".join(re.escape(ch) for ch in listed)
                out.append(f"[^{members}:]" if negated else f"(?!:)[{members}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


#: The admin, authenticated by HTTP Basic (not a bearer credential).
ADMIN = Credential("admin", "", frozenset({Role.ADMIN}), (EVERY_STREAM,), create=True)


@attrs.frozen
class Policy:
    """Every credential, and which of the read-only surfaces need one."""

    credentials: tuple[Credential, ...] = ()
    protect_views: bool = False
    protect_metrics: bool = False
    #: Accept anonymous members and producers from anywhere when no credential exists.
    insecure: bool = False
    by_digest: Mapping[str, Credential] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "by_digest", {c.token_sha256: c for c in self.credentials})

    @property
    def enforced(self) -> bool:
        """Whether members and producers must present a credential."""
        return bool(self.credentials)

    def authenticate(self, token: str) -> Credential | None:
        """The credential whose token this is, or None.

        The lookup is by the token's SHA-256, so its time does not depend on how
        much of a stored token a guess matches; the final comparison is constant-time.
        """
        digest = token_digest(token)
        found = self.by_digest.get(digest)
        if found is None or not hmac.compare_digest(found.token_sha256, digest):
            return None
        return found


def decide(
    policy: Policy,
    caller: Credential | None,
    action: Action,
    stream_prefix: str | None = None,
    *,
    loopback: bool = True,
) -> Verdict:
    """May `caller` (None: anonymous) perform `action` on `stream_prefix`?

    `loopback` says the request came from a loopback address (protected mode).
    """
    if caller is None:
        return _anonymous(policy, action, loopback)
    if caller.roles & ROLES_FOR[action] and caller.covers(stream_prefix):
        return Verdict.ALLOW
    if _anonymous(policy, action, loopback) is Verdict.ALLOW:
        return Verdict.ALLOW  # a credential never allows less than none would
    return Verdict.FORBIDDEN


def _anonymous(policy: Policy, action: Action, loopback: bool) -> Verdict:
    if action is Action.ADMIN:
        return Verdict.UNAUTHENTICATED
    if action is Action.VIEW:
        return Verdict.UNAUTHENTICATED if policy.protect_views else Verdict.ALLOW
    if action is Action.METRICS:
        return Verdict.UNAUTHENTICATED if policy.protect_metrics else Verdict.ALLOW
    if policy.enforced:  # members, producers, routing: a credential is required
        return Verdict.UNAUTHENTICATED
    return Verdict.ALLOW if loopback or policy.insecure else Verdict.PROTECTED_MODE


@attrs.frozen
class Scope:
    """The streams a read path may show its caller: every one, or those a credential covers."""

    #: None: every stream.
    credential: Credential | None = None

    @property
    def everything(self) -> bool:
        """Whether every stream is in scope (so are aggregates over streams, without a stream)."""
        return self.credential is None or self.credential.everything

    def sees(self, stream_prefix: str) -> bool:
        return self.credential is None or self.credential.covers(stream_prefix)


def read_scope(policy: Policy, caller: Credential | None, action: Action) -> Scope:
    """What `caller`, already allowed `action` (a read: VIEW, METRICS, ROUTING: check with
    `decide` first, as an unchecked anonymous caller gets every stream), may see of the
    streams there are. Every stream when the action needs no credential (a credential never
    sees less than none would) or for the admin; else the streams its patterns cover. A read
    path leaves out whatever is not in scope: list items, metric series, names in details
    (series without a stream label aggregate every stream's data: only for `everything`)."""
    if caller is None or Role.ADMIN in caller.roles:
        return Scope()
    if _anonymous(policy, action, loopback=True) is Verdict.ALLOW:
        return Scope()
    return Scope(caller)


def sees_every_stream(policy: Policy, caller: Credential | None, action: Action) -> bool:
    """Whether `caller`, not checked yet (a public path, as `/readyz`), may see every stream
    through the read `action`: it is allowed the action and its scope is everything. Only such
    a caller may read what a public path would name of the streams. Raises nothing."""
    return decide(policy, caller, action) is Verdict.ALLOW and read_scope(policy, caller, action).everything


def may_create(policy: Policy, caller: Credential | None) -> bool:
    """Whether a heartbeat of `caller` may create the stream or group it names."""
    if caller is None:
        return not policy.enforced
    return caller.create


def credential(
    name: str,
    roles: Iterable[str],
    *,
    token: str | None = None,
    token_sha256: str | None = None,
    streams: Iterable[str] = (EVERY_STREAM,),
    create: bool = False,
    pattern_syntax: str | None = None,
    quota: Mapping[str, int] | None = None,
) -> Credential:
    """A validated credential from configuration values; raises `PolicyError`."""
    if not isinstance(name, str) or not CREDENTIAL_NAME.fullmatch(name):
        raise PolicyError(f"credential name {name!r} must match {CREDENTIAL_NAME.pattern}")
    if (token is None) == (token_sha256 is None):
        raise PolicyError(f"credential {name!r}: give exactly one of token and token_sha256")
    if token is not None:
        if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH or not token.isprintable():
            raise PolicyError(
                f"credential {name!r}: a token must be at least {MIN_TOKEN_LENGTH} printable characters"
            )
        digest = token_digest(token)
    else:
        digest = str(token_sha256).lower()
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise PolicyError(f"credential {name!r}: token_sha256 must be 64 hex digits")
    try:
        parsed_roles = frozenset(Role(r) for r in roles)
    except (ValueError, TypeError) as exc:
        choices = ", ".join(r.value for r in Role if r is not Role.ADMIN)
        raise PolicyError(f"credential {name!r}: roles must be some of {choices}") from exc
    if not parsed_roles or Role.ADMIN in parsed_roles:
        raise PolicyError(
            f"credential {name!r}: give roles among member, producer, monitor "
            "(admin is the Basic Auth account)"
        )
    patterns = tuple(streams)
    if not patterns or not all(isinstance(p, str) and STREAM_PATTERN.fullmatch(p) for p in patterns):
        raise PolicyError(f"credential {name!r}: streams must be non-empty glob patterns of stream names")
    for pattern in patterns:
        try:
            pattern_regex(pattern)
        except ValueError as exc:
            raise PolicyError(f"credential {name!r}: stream pattern {pattern!r}: {exc}") from exc
    if pattern_syntax not in (None, SEGMENTS):
        raise PolicyError(f"credential {name!r}: pattern_syntax must be {SEGMENTS!r} (or left out)")
    return Credential(
        name,
        digest,
        parsed_roles,
        patterns,
        bool(create),
        pattern_syntax == SEGMENTS,
        tuple(sorted((quota or {}).items())),
    )


#: The `pattern_syntax` a credential may declare: its patterns are written for segment semantics.
SEGMENTS = "segments"


def narrowing_warnings(credentials: Iterable[Credential]) -> list[str]:
    """One line per credential whose patterns match less than before 0.2.0 (fnmatch globs, where
    `*`, `?` and classes crossed `:`) and that does not declare `pattern_syntax = "segments"`."""
    lines = []
    for c in credentials:
        narrowed = c.narrowed()
        if narrowed and not c.segments_declared:
            shown = ", ".join(repr(p) for p in narrowed)
            lines.append(
                f"credential {c.name!r}: stream pattern(s) {shown} now match within one ':' level "
                "(before 0.2.0 '*', '?' and '[...]' crossed ':'); write '**' for any number of "
                'levels, and add pattern_syntax = "segments" to the credential to say it is '
                "written for this release (a 0.1.0 coordinator, which reads these patterns more "
                "widely, then refuses the configuration)"
            )
    return lines


def policy(credentials: Iterable[Credential], **flags: bool) -> Policy:
    """A policy; raises `PolicyError` on duplicate names or tokens."""
    listed = tuple(credentials)
    names = [c.name for c in listed]
    if len(set(names)) != len(names):
        raise PolicyError("credential names must be unique")
    if len({c.token_sha256 for c in listed}) != len(listed):
        raise PolicyError("two credentials share one token")
    return Policy(listed, **flags)
