"""Stream patterns with segment semantics (`rsc.events.auth.pattern_regex`), against a reference
matcher written independently (token by token, recursive), against fnmatch (what 0.1.0 used:
never wider than it, and the same where `Credential.narrowed` says so), and the scope rule."""

from __future__ import annotations

import fnmatch
import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsc.config import ConfigError, load
from rsc.events import auth
from rsc.events.auth import Action, credential, narrowing_warnings, pattern_regex, policy, read_scope

TOKEN = "t" * 20
CLASSES = ["[ab]", "[!a]", "[:]", "[!:]", "[a:]", "[]a]"]
#: Pattern pieces: literals, `:`, wildcards, well-formed classes.
piece = st.sampled_from(["a", "b", ":", "-", ".", "*", "**", "?", *CLASSES])
patterns = st.lists(piece, min_size=1, max_size=7).map("".join)
names = st.text(alphabet="ab:-.]", min_size=0, max_size=8)


def tokens(pattern: str) -> list[str]:
    """`**` (a run of two or more stars), `*`, `?`, a class `[...]`, or one literal character."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            j = i
            while j < len(pattern) and pattern[j] == "*":
                j += 1
            out.append("**" if j - i > 1 else "*")
            i = j
        elif c == "[":
            start = i + 2 if pattern[i + 1 : i + 2] == "!" else i + 1
            j = pattern.index("]", start + 1 if pattern[start : start + 1] == "]" else start)
            out.append(pattern[i : j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return out


def reference(pattern: str, name: str) -> bool:
    """Does `name` match `pattern`: `*` any run without `:`, `**` any run, `?` and classes one
    character that is not `:`."""
    toks = tokens(pattern)

    @functools.cache
    def match(i: int, j: int) -> bool:
        if i == len(toks):
            return j == len(name)
        t = toks[i]
        if t == "**":
            return any(match(i + 1, k) for k in range(j, len(name) + 1))
        if t == "*":
            k = j
            while True:
                if match(i + 1, k):
                    return True
                if k == len(name) or name[k] == ":":
                    return False
                k += 1
        if j == len(name):
            return False
        c = name[j]
        if t == "?":
            return c != ":" and match(i + 1, j + 1)
        if t.startswith("["):
            negated = t.startswith("[!")
            members = t[2:-1] if negated else t[1:-1]
            return c != ":" and ((c in members) != negated) and match(i + 1, j + 1)
        return c == t and match(i + 1, j + 1)

    return match(0, 0)


@given(patterns, names)
def test_patterns_match_as_the_reference_does(pattern: str, name: str) -> None:
    assert (pattern_regex(pattern).fullmatch(name) is not None) == reference(pattern, name)


@given(patterns, names)
def test_a_pattern_never_matches_more_than_the_fnmatch_glob_of_0_1_0(pattern: str, name: str) -> None:
    """Segment semantics only narrow: what a pattern covers now, it covered before; and a
    pattern `narrowed` does not name covers exactly what it did (no warning owed)."""
    now = pattern_regex(pattern).fullmatch(name) is not None
    before = fnmatch.fnmatchcase(name, pattern)
    assert not now or before
    if not credential("c", ["monitor"], token=TOKEN, streams=[pattern]).narrowed():
        assert now == before


def test_segment_examples() -> None:
    orders = credential("c", ["member"], token=TOKEN, streams=["orders:*"])
    assert orders.covers("orders:eu")
    assert not orders.covers("orders:eu:secret")
    assert not orders.covers("orders")
    deep = credential("d", ["member"], token=TOKEN, streams=["orders:**"])
    assert deep.covers("orders:eu:secret")
    assert not deep.covers("orders")
    every = credential("e", ["member"], token=TOKEN)  # the default: every stream, any depth
    assert every.streams == ("**",)
    assert every.everything
    assert every.covers("a:b:c")
    one_level = credential("o", ["member"], token=TOKEN, streams=["*"])
    assert one_level.covers("orders")
    assert not one_level.covers("orders:eu")


def test_a_credential_whose_patterns_match_less_than_before_is_named_once() -> None:
    wide = credential("wide", ["member"], token="w" * 20, streams=["orders:**", "billing"])
    narrowed = credential("old", ["member"], token="o" * 20, streams=["orders:*", "b?", "x:**", "y:***"])
    declared = credential("new", ["member"], token="n" * 20, streams=["orders:*"], pattern_syntax="segments")
    lines = narrowing_warnings([wide, narrowed, declared])
    assert len(lines) == 1
    assert "'old'" in lines[0]
    assert "'orders:*', 'b?'" in lines[0]
    assert "x:**" not in lines[0]
    assert "y:***" not in lines[0]  # a run of stars is `**`: it matches across levels as before


def test_pattern_syntax_is_a_credential_key_0_1_0_refuses() -> None:
    """A configuration written for segment patterns says so with `pattern_syntax`: 0.1.0 refuses
    unknown credential keys, so it never reads these patterns more widely than this release."""
    env = {
        "RSC_CREDENTIALS": f'[{{"name": "w", "token": "{TOKEN}", "roles": ["member"], "streams": ["o:*"], '
        '"pattern_syntax": "segments"}]'
    }
    (loaded,) = load(environ=env).credentials
    assert loaded.segments_declared
    assert loaded.streams == ("o:*",)
    bad = env["RSC_CREDENTIALS"].replace('"segments"', '"glob"')
    with pytest.raises(ConfigError, match="pattern_syntax must be 'segments'"):
        load(environ={"RSC_CREDENTIALS": bad})


@given(st.lists(patterns, min_size=1, max_size=3), st.sampled_from(list(Action)), names)
def test_read_scope_is_what_decide_allows(pats: list[str], action: Action, name: str) -> None:
    """A scoped read shows a stream exactly when the caller may read that stream on its own."""
    monitor = credential("m", ["monitor", "producer"], token=TOKEN, streams=pats)
    for protected in (False, True):
        rules = policy([monitor], protect_views=protected, protect_metrics=protected)
        if action not in (Action.VIEW, Action.METRICS, Action.ROUTING):
            continue
        scope = read_scope(rules, monitor, action)
        allowed = auth.decide(rules, monitor, action, name) is auth.Verdict.ALLOW
        assert scope.sees(name) == allowed
        assert read_scope(rules, auth.ADMIN, action).everything


@pytest.mark.parametrize("pattern", ["orders-[a-c]", "t-[!0-9]", "x[ab-]y:[a-z]"])
def test_a_class_with_a_range_is_refused_rather_than_read_differently(pattern: str) -> None:
    """fnmatch read `[a-c]` as a range; read as listed characters it would cover `orders--`
    (and `[!a-c]` would cover `orders-b`): more than before. It is refused at load instead."""
    with pytest.raises(auth.PolicyError, match="ranges"):
        credential("c", ["member"], token=TOKEN, streams=[pattern])
    assert credential("c", ["member"], token=TOKEN, streams=["x[-a]y", "x[a-]y"]).covers("x-y")
