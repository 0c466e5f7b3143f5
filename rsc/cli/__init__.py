"""The `rsc` command line: the group, and every command added to it.

One module a family of commands: `serve_command` (`rsc serve`), `worker_command`
(`rsc worker`), `journal_commands` (`rsc journal ...`), `simulate_command` (`rsc simulate`),
`plan_commands` (`rsc diff`, `rsc apply`); the admin commands are `rsc.tools.stream_commands`'
(`rsc streams`, `rsc producers`), `rsc.tools.group_commands`' (`rsc groups`, `rsc members`),
`rsc.tools.audit_command`'s (`rsc audit`) and `rsc.tools.dead_letter_commands`' (`rsc dlq`);
`rsc purge` is `rsc.tools.purge`'s. `process_setup` holds what they share: logging and
`StartupError`.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from rsc import __version__
from rsc.cli.process_setup import logging_everywhere

__all__ = ["main"]

#: Each command: the module that defines it and its name there. A command's module is imported
#: only when the command runs (or `--help` lists them all): `rsc worker` loads neither the
#: coordinator nor its web framework (about half a second of CPU at every start).
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("rsc.cli.simulate_command", "simulate"),
    "journal": ("rsc.cli.journal_commands", "journal"),
    "serve": ("rsc.cli.serve_command", "serve"),
    "worker": ("rsc.cli.worker_command", "worker"),
    "streams": ("rsc.tools.stream_commands", "streams"),
    "groups": ("rsc.tools.group_commands", "groups"),
    "members": ("rsc.tools.group_commands", "members"),
    "producers": ("rsc.tools.stream_commands", "producers"),
    "audit": ("rsc.tools.audit_command", "audit"),
    "dlq": ("rsc.tools.dead_letter_commands", "dlq"),
    "purge": ("rsc.tools.purge", "purge_command"),
    "diff": ("rsc.cli.plan_commands", "diff"),
    "apply": ("rsc.cli.plan_commands", "apply"),
    "conformance": ("rsc.cli.conformance_command", "conformance"),
    "tail": ("rsc.tools.tail_command", "tail"),
}


class LazyGroup(click.Group):
    """A group whose commands are imported when first asked for (`COMMANDS`), each given the
    logging options of every command (`logging_everywhere`) then."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name]
            command: click.Command = getattr(importlib.import_module(module), attr)
            logging_everywhere(command)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="rsc")
def main() -> None:
    """rsc: a coordinator for sharded Redis Streams."""


def __getattr__(name: str) -> Any:
    """The commands by the names this module exported before they were loaded lazily
    (`from rsc.cli import serve` still works; `purge_command` is `rsc purge`)."""
    for command, (module, attr) in COMMANDS.items():
        if name in (attr, command):
            found: click.Command = getattr(importlib.import_module(module), attr)
            logging_everywhere(found)  # as `rsc` runs it (once: it is idempotent)
            return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
