"""What every `rsc` admin command shares: the Admin API connection, errors as one line, output.

Every command takes `--url` (or `RSC_COORDINATOR_URL`), `--user` and the password from
`RSC_ADMIN_PASSWORD` or a netrc-style file (`rsc.client.admin_api.credentials`), and
`--output table|json`. Mutating commands print what changed, the request id, and the audit
record of that request. Exit codes: 0 done, 1 the coordinator refused or failed (its error
code is printed), 2 a usage error.
"""

from __future__ import annotations

import datetime
import functools
import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click

from rsc.client.admin_api import AdminClient, AdminError, Answer

F = TypeVar("F", bound=Callable[..., Any])
OUTPUTS = click.Choice(["table", "json"])


def connection_options(command: F) -> F:
    """`--url`, `--user`, `--output` for an admin command; passes `admin` and `output`.

    The wrapped command raises click.ClickException (one line, with the request id and a hint
    for a missing password) for every AdminError that `command` lets out.
    """

    @click.option("--url", envvar="RSC_COORDINATOR_URL", help="Coordinator URL [env RSC_COORDINATOR_URL].")
    @click.option("--user", envvar="RSC_ADMIN_USER", help="Admin user [env RSC_ADMIN_USER; default admin].")
    @click.option("-o", "--output", type=OUTPUTS, default="table", show_default=True)
    @functools.wraps(command)
    def wrapper(url: str | None, user: str | None, output: str, **kwargs: Any) -> Any:
        admin: AdminClient | None = None
        try:
            with AdminClient(url, user) as admin:
                return command(admin=admin, output=output, **kwargs)
        except AdminError as exc:
            where = f" (request {exc.request_id})" if exc.request_id else ""
            hint = ""
            if exc.status == 401 and admin is not None and not admin.sends_credentials:
                hint = "; set RSC_ADMIN_PASSWORD or a netrc entry (RSC_NETRC, ~/.netrc)"
            raise click.ClickException(f"{exc}{hint}{where}") from None

    return wrapper  # type: ignore[return-value]


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns aligned on the widest cell; numbers right-aligned.

    Raises IndexError for a row shorter than `headers`, ValueError for a longer one.
    """
    text = [[cell(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in text)]) for i, h in enumerate(headers)]
    numeric = [
        all(_is_number(r[i]) for r in text) and any(r[i] != "-" for r in text) for i in range(len(headers))
    ]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in text)])


def cell(value: Any) -> str:
    """One table cell: None as `-`, booleans as yes/no, collections sorted and comma-joined.

    Raises TypeError for a collection whose items cannot be sorted together.
    """
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(str(v) for v in sorted(value)) or "-"
    return str(value)


def _is_number(text: str) -> bool:
    return text == "-" or text.lstrip("-").replace(".", "", 1).isdigit()


def emit(output: str, data: Any, text: Callable[[], str]) -> None:
    """`data` as indented JSON (`--output json`), else what `text()` renders.

    Raises TypeError if `data` is not JSON-serializable, and whatever `text()` raises.
    """
    click.echo(json.dumps(data, indent=2, sort_keys=True) if output == "json" else text())


def done(admin: AdminClient, output: str, answer: Answer, what: str) -> None:
    """What a mutation did, its request id and its audit record.

    Raises AdminError if the audit record cannot be read.
    """
    records = admin.audit(requestId=answer.request_id, limit=1)
    record = records[0] if records else None
    if output == "json":
        click.echo(
            json.dumps({"result": answer.body, "requestId": answer.request_id, "audit": record}, indent=2)
        )
        return
    click.echo(what)
    click.echo(f"request {answer.request_id}")
    if record is not None:
        click.echo(
            f"audit: {record['method']} {record['path']} -> {record['status']} {record['outcome']} "
            f"by {record['caller']} at {utc_time(record['timeMs'])} (revision {record.get('revision')})"
        )


def utc_time(ms: int) -> str:
    """Milliseconds since the epoch as an ISO 8601 UTC time with milliseconds (`...T...Z`).

    Raises OverflowError or OSError for a time outside the platform's range.
    """
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def said_412(change: Callable[[], Answer], meaning: str | None) -> Answer:
    """`change()`, with its precondition's 412 said as `meaning` (the create-only or must-exist
    header the command sent); None: the 412 as the server said it (a revision given by hand).

    Raises click.ClickException(meaning) for a 412 when `meaning` is given; any other AdminError
    of `change()` as it came.
    """
    try:
        return change()
    except AdminError as exc:
        if exc.status == 412 and meaning is not None:
            raise click.ClickException(meaning) from exc
        raise


def iso_ms(text: str, option: str) -> int:
    """Milliseconds since the epoch of an ISO-8601 time (UTC unless it says otherwise). Raises
    `click.BadParameter` naming `option`."""
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise click.BadParameter(f"{text!r} is not an ISO-8601 time", param_hint=option) from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)
