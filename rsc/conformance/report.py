"""The conformance kit's verdicts as a table (stdout) and as JUnit XML (for CI)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from xml.etree import ElementTree

from rsc.conformance.scenarios import Outcome


def table(outcomes: Sequence[Outcome], client: str) -> str:
    """One line per scenario: PASS/FAIL, the rules it checks, the time, and why it failed."""
    width = max((len(o.scenario.name) for o in outcomes), default=8)
    lines = [f"rsc conformance: {client}", ""]
    for o in outcomes:
        verdict = "PASS" if o.passed else "FAIL"
        rules = ",".join(o.scenario.rules)
        lines.append(
            f"{verdict}  {o.scenario.name:<{width}}  {rules:<10} {o.seconds:5.1f} s  {o.scenario.summary}"
        )
        if not o.passed:
            lines.append(f"      {o.reason}")
    passed = sum(o.passed for o in outcomes)
    lines += ["", f"{passed} of {len(outcomes)} scenarios passed"]
    return "\n".join(lines)


def junit(outcomes: Sequence[Outcome], client: str, path: Path) -> None:
    """A JUnit XML file: one testcase per scenario, a failure element with the reason."""
    suite = ElementTree.Element(
        "testsuite",
        name="rsc-conformance",
        tests=str(len(outcomes)),
        failures=str(sum(not o.passed for o in outcomes)),
        time=f"{sum(o.seconds for o in outcomes):.3f}",
    )
    ElementTree.SubElement(
        ElementTree.SubElement(suite, "properties"), "property", name="client", value=client
    )
    for o in outcomes:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            classname=f"rsc.conformance.{'.'.join(o.scenario.rules)}",
            name=o.scenario.name,
            time=f"{o.seconds:.3f}",
        )
        if not o.passed:
            failure = ElementTree.SubElement(case, "failure", message=o.reason)
            failure.text = f"rules {', '.join(o.scenario.rules)}: {o.reason}"
    path.parent.mkdir(parents=True, exist_ok=True)
    ElementTree.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
