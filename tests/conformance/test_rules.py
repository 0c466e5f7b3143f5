"""The kit checks every client rule docs/protocol.md publishes: each by at least one scenario,
and what it cannot see of a rule is said (`rsc conformance --list`)."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from rsc.cli.conformance_command import conformance
from rsc.conformance.scenarios import LIMITS, RULES, SCENARIOS, coverage

PROTOCOL = Path(__file__).parents[2] / "docs" / "protocol.md"


def test_every_published_rule_is_checked_by_a_scenario() -> None:
    published = set(re.findall(r"^- \*\*([MP]\d+)\*\*", PROTOCOL.read_text(), re.MULTILINE))
    assert published == set(RULES)
    assert {rule for rule, names in coverage().items() if not names} == set()
    assert set(LIMITS) <= set(RULES)
    assert {r for s in SCENARIOS for r in s.rules} <= set(RULES)


def test_list_shows_each_rule_with_its_scenarios_and_limits() -> None:
    result = CliRunner().invoke(conformance, ["--list"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("P2    producer-rules") for line in lines)
    assert sum("not checked:" in line for line in lines) == len(LIMITS)
