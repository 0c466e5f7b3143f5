"""The pure authorization policy and the admin login throttle: plain values, no I/O."""

from __future__ import annotations

from pathlib import Path

import pytest

from rsc.config import ConfigError, load
from rsc.events import auth
from rsc.events.auth import Action, Verdict, credential, decide, policy
from rsc.http.throttle import FailureThrottle

MEMBER = credential("workers", ["member"], token="m" * 20, streams=["orders", "billing-*"])
PRODUCER = credential("shop", ["producer"], token="p" * 20, streams=["orders"], create=True)
MONITOR = credential("grafana", ["monitor"], token="g" * 20, streams=["orders"])
POLICY = policy([MEMBER, PRODUCER, MONITOR])


@pytest.mark.parametrize(
    ("caller", "action", "stream", "verdict"),
    [
        (MEMBER, Action.MEMBER_HEARTBEAT, "orders", Verdict.ALLOW),
        (MEMBER, Action.MEMBER_HEARTBEAT, "billing-eu", Verdict.ALLOW),
        (MEMBER, Action.MEMBER_HEARTBEAT, "billing", Verdict.FORBIDDEN),  # the pattern needs the dash
        (MEMBER, Action.MEMBER_HEARTBEAT, "ordersX", Verdict.FORBIDDEN),  # literal, not prefix
        (MEMBER, Action.PRODUCER_HEARTBEAT, "orders", Verdict.FORBIDDEN),
        (MEMBER, Action.VIEW, "orders", Verdict.ALLOW),  # views are public here: as anyone
        (PRODUCER, Action.PRODUCER_HEARTBEAT, "orders", Verdict.ALLOW),
        (PRODUCER, Action.ROUTING, "orders", Verdict.ALLOW),
        (PRODUCER, Action.MEMBER_HEARTBEAT, "orders", Verdict.FORBIDDEN),
        (MONITOR, Action.VIEW, "orders", Verdict.ALLOW),
        (MONITOR, Action.VIEW, None, Verdict.ALLOW),
        (MONITOR, Action.METRICS, None, Verdict.ALLOW),
        (MONITOR, Action.ADMIN, None, Verdict.FORBIDDEN),
        (auth.ADMIN, Action.VIEW, "anything", Verdict.ALLOW),
        (auth.ADMIN, Action.MEMBER_HEARTBEAT, "orders", Verdict.FORBIDDEN),
        (None, Action.MEMBER_HEARTBEAT, "orders", Verdict.UNAUTHENTICATED),
        (None, Action.PRODUCER_HEARTBEAT, "orders", Verdict.UNAUTHENTICATED),
        (None, Action.ROUTING, "orders", Verdict.UNAUTHENTICATED),
        (None, Action.VIEW, "orders", Verdict.ALLOW),  # views are public unless protected
        (None, Action.ADMIN, None, Verdict.UNAUTHENTICATED),
    ],
)
def test_decisions(
    caller: auth.Credential | None, action: Action, stream: str | None, verdict: Verdict
) -> None:
    assert decide(POLICY, caller, action, stream, loopback=True) is verdict


def test_protected_views_and_metrics_need_a_credential() -> None:
    protected = policy([MONITOR], protect_views=True, protect_metrics=True)
    assert decide(protected, None, Action.VIEW, "orders") is Verdict.UNAUTHENTICATED
    assert decide(protected, None, Action.METRICS) is Verdict.UNAUTHENTICATED
    assert decide(protected, MONITOR, Action.VIEW, "payments") is Verdict.FORBIDDEN
    member = credential("w", ["member"], token="w" * 20)
    assert decide(policy([member], protect_views=True), member, Action.VIEW, "x") is Verdict.FORBIDDEN


def test_protected_mode_without_credentials() -> None:
    """No credentials: anonymous members and producers only from loopback, unless insecure."""
    open_policy = policy([])
    for action in (Action.MEMBER_HEARTBEAT, Action.PRODUCER_HEARTBEAT, Action.ROUTING):
        assert decide(open_policy, None, action, "orders", loopback=True) is Verdict.ALLOW
        assert decide(open_policy, None, action, "orders", loopback=False) is Verdict.PROTECTED_MODE
        insecure = policy([], insecure=True)
        assert decide(insecure, None, action, "orders", loopback=False) is Verdict.ALLOW
    assert auth.may_create(open_policy, None)
    assert not auth.may_create(POLICY, None)
    assert not auth.may_create(POLICY, MEMBER)
    assert auth.may_create(POLICY, PRODUCER)


def test_tokens_are_looked_up_by_digest_only() -> None:
    assert POLICY.authenticate("m" * 20) is MEMBER
    assert POLICY.authenticate("m" * 19) is None
    assert POLICY.authenticate("") is None
    assert "m" * 20 not in repr(POLICY)  # only digests are kept
    hashed = credential("ci", ["producer"], token_sha256=auth.token_digest("x" * 32))
    assert policy([hashed]).authenticate("x" * 32) is hashed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "bad name", "roles": ["member"], "token": "t" * 20}, "name"),
        ({"name": "w", "roles": ["member"], "token": "short"}, "at least 16"),
        ({"name": "w", "roles": ["member"]}, "exactly one"),
        ({"name": "w", "roles": ["member"], "token": "t" * 20, "token_sha256": "0" * 64}, "exactly one"),
        ({"name": "w", "roles": ["member"], "token_sha256": "xyz"}, "64 hex"),
        ({"name": "w", "roles": ["root"], "token": "t" * 20}, "roles"),
        ({"name": "w", "roles": ["admin"], "token": "t" * 20}, "Basic Auth"),
        ({"name": "w", "roles": [], "token": "t" * 20}, "roles"),
        ({"name": "w", "roles": ["member"], "token": "t" * 20, "streams": ["a b"]}, "patterns"),
    ],
)
def test_unusable_credentials_are_refused(kwargs: dict[str, object], message: str) -> None:
    name = kwargs.pop("name")
    roles = kwargs.pop("roles")
    with pytest.raises(auth.PolicyError, match=message):
        credential(name, roles, **kwargs)  # type: ignore[arg-type]


def test_credentials_from_toml_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "rsc.toml"
    path.write_text(
        '[[credentials]]\nname = "workers"\ntoken = "0123456789abcdef"\nroles = ["member"]\n'
        'streams = ["orders-*"]\n'
    )
    settings = load(path, environ={})
    assert settings.policy.enforced
    assert settings.credentials[0].streams == ("orders-*",)
    env = {"RSC_CREDENTIALS": '[{"name": "p", "token": "fedcba9876543210", "roles": ["producer"]}]'}
    assert load(environ=env).credentials[0].roles == frozenset({auth.Role.PRODUCER})
    with pytest.raises(ConfigError, match="unknown keys"):
        load(environ={"RSC_CREDENTIALS": '[{"name": "p", "tokn": "x", "roles": ["producer"]}]'})
    twice = '{"name": "%s", "token": "fedcba9876543210", "roles": ["producer"]}'
    with pytest.raises(ConfigError, match="share one token"):
        load(environ={"RSC_CREDENTIALS": f"[{twice % 'a'}, {twice % 'b'}]"})
    with pytest.raises(ConfigError, match="JSON"):
        load(environ={"RSC_CREDENTIALS": "workers:member"})


def test_the_throttle_blocks_an_address_for_the_rest_of_its_window() -> None:
    throttle = FailureThrottle(max_failures=3, window_s=60)
    for t in range(3):
        assert throttle.retry_after("10.0.0.9", t) is None
        throttle.failed("10.0.0.9", t)
    assert throttle.retry_after("10.0.0.9", 10) == 50  # blocked until the window ends
    assert throttle.retry_after("10.0.0.9", 59.5) == 1
    assert throttle.retry_after("10.0.0.1", 10) is None  # other addresses are not affected
    assert throttle.expired(30) == []
    ended = throttle.expired(60)
    assert [(b.address, b.failures, b.blocked) for b in ended] == [("10.0.0.9", 3, 2)]
    assert throttle.retry_after("10.0.0.9", 61) is None  # a new window
    assert throttle.expired(1_000) == []  # audited once


def test_the_throttle_table_is_bounded() -> None:
    throttle = FailureThrottle(max_failures=1, window_s=60, max_addresses=100)
    for i in range(1_000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}", 0)
    assert len(throttle.windows) == 100
