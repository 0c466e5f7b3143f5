"""The kit's verdicts as a table and as JUnit XML, which CI systems read."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree

from rsc.conformance.report import junit, table
from rsc.conformance.scenarios import SCENARIOS, Outcome


def outcomes() -> list[Outcome]:
    return [
        Outcome(SCENARIOS[0], True, "", 1.5),
        Outcome(SCENARIOS[1], False, "M14: SIGTERM: exit code 1", 2.0),
    ]


def test_the_table_names_each_verdict_rule_and_reason() -> None:
    text = table(outcomes(), "node client.js")
    assert f"PASS  {SCENARIOS[0].name}" in text
    assert f"FAIL  {SCENARIOS[1].name}" in text
    assert "M14: SIGTERM: exit code 1" in text
    assert "1 of 2 scenarios passed" in text


def test_junit_has_a_testcase_per_scenario_and_a_failure_with_its_reason(tmp_path: Path) -> None:
    path = tmp_path / "out" / "junit.xml"
    junit(outcomes(), "node client.js", path)
    suite = ElementTree.parse(path).getroot()
    assert (suite.tag, suite.get("tests"), suite.get("failures")) == ("testsuite", "2", "1")
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert cases[SCENARIOS[0].name].find("failure") is None
    failure = cases[SCENARIOS[1].name].find("failure")
    assert failure is not None
    assert failure.get("message") == "M14: SIGTERM: exit code 1"


def test_every_scenario_names_rules_the_protocol_defines() -> None:
    page = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    names = [s.name for s in SCENARIOS]
    assert len(set(names)) == len(names)
    for scenario in SCENARIOS:
        assert scenario.rules
        for rule in scenario.rules:
            assert f"- **{rule}**" in page, f"{scenario.name}: rule {rule} is not in docs/protocol.md"
    clients = (Path(__file__).parents[2] / "docs" / "clients.md").read_text()
    for name in names:
        assert f"| `{name}` |" in clients, f"docs/clients.md does not describe scenario {name}"
