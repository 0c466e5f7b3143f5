"""`rsc diff` and `rsc apply`: the coordinator made to match files of desired streams and groups
(`rsc.tools.apply`), with exit codes as `terraform plan -detailed-exitcode`'s."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from rsc.tools import admin_terminal
from rsc.tools import apply as applying


def _apply_options(command: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "-f",
            "--file",
            "files",
            multiple=True,
            required=True,
            type=click.Path(dir_okay=False),
            help="Desired streams and groups (TOML, or YAML by extension); repeatable.",
        ),
        click.option(
            "--prune", is_flag=True, help="Also delete groups of the named streams not in the files."
        ),
        click.option(
            "--prune-streams", is_flag=True, help="Also delete streams not in the files (and their groups)."
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


class _PlanUsageError(click.UsageError):
    exit_code = 1


class _PlanCommand(click.Command):
    """`rsc diff` and `rsc apply` exit like `terraform plan -detailed-exitcode`: 2 means changes,
    so a usage error (click's exit code 2) exits 1 instead, and a pipeline never reads a typo
    as a plan with changes."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise _PlanUsageError(exc.message, exc.ctx) from exc


@click.command("diff", cls=_PlanCommand)
@_apply_options
@admin_terminal.connection_options
def diff(admin: Any, output: str, files: tuple[str, ...], prune: bool, prune_streams: bool) -> None:
    """Show what `rsc apply` would change. Exit 0: nothing; 2: changes; 1: an error."""
    sys.exit(
        applying.run(admin, files, dry_run=True, prune=prune, prune_streams=prune_streams, output=output)
    )


@click.command("apply", cls=_PlanCommand)
@_apply_options
@click.option("--dry-run", is_flag=True, help="Only show the plan (exit 2 when it has changes).")
@admin_terminal.connection_options
def apply(
    admin: Any, output: str, files: tuple[str, ...], prune: bool, prune_streams: bool, dry_run: bool
) -> None:
    """Make the coordinator match the files (If-Match on every change). Exit 0: done; 1: error."""
    sys.exit(
        applying.run(admin, files, dry_run=dry_run, prune=prune, prune_streams=prune_streams, output=output)
    )
