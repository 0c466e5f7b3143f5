"""`rsc conformance`: the conformance kit, run against a client by its command line."""

from __future__ import annotations

import shlex
import sys
import tempfile
from pathlib import Path

import click

#: The client `--client` defaults to: the Python worker under the contract.
PYTHON_CLIENT = f"{shlex.quote(sys.executable)} -m rsc.conformance.python_client"


@click.command()
@click.option(
    "--client",
    "client_command",
    default=PYTHON_CLIENT,
    show_default="the Python worker",
    help="Command line that starts one process of the client under test (docs/clients.md).",
)
@click.option("--scenario", "names", multiple=True, help="Run only these scenarios (repeatable).")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), help="Also write JUnit XML here.")
@click.option(
    "--workdir", type=click.Path(file_okay=False), help="Keep logs and records here (default: a temp dir)."
)
@click.option("--redis-server", default="redis-server", show_default=True, help="The redis-server binary.")
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and the rules they check.")
def conformance(
    client_command: str,
    names: tuple[str, ...],
    junit_path: str | None,
    workdir: str | None,
    redis_server: str,
    list_only: bool,
) -> None:
    """Start a real Redis and coordinator, drive the client through every scenario, and judge
    it by the protocol rules (docs/protocol.md) and what Redis and the journal show. Exits 1
    if any scenario failed."""
    try:
        import redis  # noqa: F401, PLC0415  (an optional extra: the kit checks Redis with redis-py)
    except ImportError as error:
        raise click.ClickException("the conformance kit needs redis-py: pip install 'rsc[sync]'") from error
    from rsc.conformance import report, scenarios  # noqa: PLC0415  (needs redis-py)

    chosen = [s for s in scenarios.SCENARIOS if not names or s.name in names]
    unknown = set(names) - {s.name for s in scenarios.SCENARIOS}
    if unknown:
        raise click.BadParameter(f"no scenario {sorted(unknown)}", param_hint="--scenario")
    if list_only:
        for s in chosen:
            click.echo(f"{s.name:<21} {','.join(s.rules):<19} {s.summary}")
        click.echo("\nrule  checked by")
        for rule, names_ in scenarios.coverage().items():
            click.echo(f"{rule:<5} {', '.join(names_) or '-'}")
            if rule in scenarios.LIMITS:
                click.echo(f"      not checked: {scenarios.LIMITS[rule]}")
        return
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="rsc-conformance-"))
    outcomes = []
    for scenario in chosen:
        outcome = scenarios.run(scenario, client_command, base, redis_server)
        click.echo(
            f"{'PASS' if outcome.passed else 'FAIL'} {scenario.name} ({outcome.seconds:.1f} s)", err=True
        )
        outcomes.append(outcome)
    click.echo(report.table(outcomes, client_command))
    click.echo(f"logs and records: {base}")
    if junit_path:
        report.junit(outcomes, client_command, Path(junit_path))
    if not all(o.passed for o in outcomes):
        sys.exit(1)
