"""`rsc simulate`: deterministic, converging, and honest about violations."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rsc.cli import main
from rsc.events.member_machine import MemberMachine, Steps
from rsc.events.wire import HeartbeatRequest, HeartbeatResponse
from rsc.simulate import SimConfig, Simulation

REQUIRED = {
    "converged",
    "steps",
    "moves",
    "minimalMoves",
    "maxImbalance",
    "exclusivityViolations",
    "orderViolations",
}


def simulate(*args: str) -> tuple[int, dict[str, object]]:
    result = CliRunner().invoke(main, ["simulate", "--json", *args])
    return result.exit_code, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_small_runs_converge_without_violations(seed: int) -> None:
    code, report = simulate("--members", "20", "--shards", "64", "--churn", "80", "--seed", str(seed))
    assert report.keys() >= REQUIRED
    assert code == 0
    assert report["converged"] is True
    assert report["minimalMoves"] is True
    assert report["maxImbalance"] in (0, 1)
    assert report["exclusivityViolations"] == report["orderViolations"] == 0
    churn = report["churn"]
    assert isinstance(churn, dict)
    assert sum(churn.values()) == 80


def test_same_seed_same_output() -> None:
    first = CliRunner().invoke(
        main, ["simulate", "--members", "10", "--shards", "32", "--churn", "30", "--seed", "9"]
    )
    second = CliRunner().invoke(
        main, ["simulate", "--members", "10", "--shards", "32", "--churn", "30", "--seed", "9"]
    )
    assert first.exit_code == 0
    assert first.stdout == second.stdout
    other = CliRunner().invoke(
        main, ["simulate", "--members", "10", "--shards", "32", "--churn", "30", "--seed", "10"]
    )
    assert other.stdout != first.stdout


def test_churn_exercises_fencing_and_lost_responses() -> None:
    report = Simulation(SimConfig(members=30, shards=128, churn=150, seed=4)).run()
    assert report["fenced"] > 0
    assert report["lostResponses"] > 0
    assert report["moves"] > 0
    assert report["converged"] is True


def test_an_unsettled_run_is_reported_not_converged() -> None:
    """With no time to settle the verdict must be a failure, not a silent pass."""
    sim = Simulation(SimConfig(members=5, shards=16, churn=40, seed=1, settle_limit_ms=0))
    assert sim.run()["converged"] is False


def test_nonsense_timing_is_refused() -> None:
    result = CliRunner().invoke(
        main, ["simulate", "--heartbeat-interval-ms", "1000", "--lease-ttl-ms", "2000"]
    )
    assert result.exit_code == 2
    assert "lease" in result.output


def test_the_simulator_checks_the_shipped_member(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deliberate bug in the member machine (acknowledging a revoke while still reading the
    shard) shows in the simulator: the simulated members are the shipped machine."""
    assert Simulation(SimConfig(members=10, shards=32, churn=40, seed=1)).run()["exclusivityViolations"] == 0
    receive = MemberMachine.receive

    def acks_before_it_stops(
        self: MemberMachine, request: HeartbeatRequest, response: HeartbeatResponse, now: float
    ) -> Steps:
        steps = receive(self, request, response, now)
        self.to_ack |= self.revoking  # the bug: acknowledged at once, still reading
        return steps

    monkeypatch.setattr(MemberMachine, "receive", acks_before_it_stops)
    report = Simulation(SimConfig(members=10, shards=32, churn=40, seed=1)).run()
    assert report["exclusivityViolations"] > 0
