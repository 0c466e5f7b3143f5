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

import click

from rsc import __version__
from rsc.cli.conformance_command import conformance
from rsc.cli.journal_commands import journal
from rsc.cli.plan_commands import apply, diff
from rsc.cli.process_setup import logging_everywhere
from rsc.cli.serve_command import serve
from rsc.cli.simulate_command import simulate
from rsc.cli.worker_command import worker
from rsc.tools.audit_command import audit
from rsc.tools.dead_letter_commands import dlq
from rsc.tools.group_commands import groups, members
from rsc.tools.purge import purge_command
from rsc.tools.stream_commands import producers, streams
from rsc.tools.tail_command import tail

__all__ = ["main"]


@click.group()
@click.version_option(__version__, prog_name="rsc")
def main() -> None:
    """rsc: a coordinator for sharded Redis Streams."""


_ADMIN_COMMANDS = (streams, groups, members, producers, audit, dlq)
for _command in (
    simulate,
    journal,
    serve,
    worker,
    *_ADMIN_COMMANDS,
    purge_command,
    diff,
    apply,
    conformance,
    tail,
):
    main.add_command(_command)
logging_everywhere(main)
