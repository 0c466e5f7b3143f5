"""`rsc simulate`: the coordination core with simulated members and time (`rsc.simulate`)."""

from __future__ import annotations

import json
import sys

import click

from rsc.simulate import SimConfig, Simulation


@click.command()
@click.option(
    "--members", default=50, show_default=True, type=click.IntRange(0), help="Members at the start."
)
@click.option(
    "--shards", default=512, show_default=True, type=click.IntRange(1, 16_384), help="Shards at the start."
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random schedule.")
@click.option(
    "--churn", default=200, show_default=True, type=click.IntRange(0), help="Number of churn events."
)
@click.option("--heartbeat-interval-ms", default=1_000, show_default=True, type=click.IntRange(1))
@click.option("--lease-ttl-ms", default=5_000, show_default=True, type=click.IntRange(1))
@click.option("--revoke-timeout-ms", default=15_000, show_default=True, type=click.IntRange(1))
@click.option(
    "--assignment-interval-ms",
    default=None,
    type=click.IntRange(0),
    help="Least time between target computations [default: 0, or 1000 above 1,000 members].",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one final JSON object (progress goes to stderr)."
)
def simulate(
    members: int,
    shards: int,
    seed: int,
    churn: int,
    heartbeat_interval_ms: int,
    lease_ttl_ms: int,
    revoke_timeout_ms: int,
    assignment_interval_ms: int | None,
    as_json: bool,
) -> None:
    """Run the coordination core with simulated members and time (no Redis, no HTTP).

    Exits 1 if the run did not converge or broke an invariant.
    """
    if lease_ttl_ms < 3 * heartbeat_interval_ms:
        raise click.BadParameter(
            "the lease must be at least 3 heartbeat intervals", param_hint="--lease-ttl-ms"
        )
    if assignment_interval_ms is None:
        assignment_interval_ms = 1_000 if members > 1_000 else 0
    config = SimConfig(
        members=members,
        shards=shards,
        seed=seed,
        churn=churn,
        heartbeat_interval_ms=heartbeat_interval_ms,
        lease_ttl_ms=lease_ttl_ms,
        revoke_timeout_ms=revoke_timeout_ms,
        assignment_interval_ms=assignment_interval_ms,
    )
    out = sys.stderr if as_json else sys.stdout
    report = Simulation(config, progress=lambda line: print(line, file=out, flush=True)).run()
    if as_json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>24}: {value}")
    healthy = (
        report["converged"]
        and report["minimalMoves"]
        and report["maxImbalance"] <= 1
        and report["exclusivityViolations"] == 0
        and report["orderViolations"] == 0
    )
    sys.exit(0 if healthy else 1)
