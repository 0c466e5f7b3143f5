"""What the `rsc` commands share: logging (text or JSON lines; `--log-level` and `--log-format`
on every command) and `StartupError` (a process that cannot start: one line, exit 2)."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from typing import Any

import click


class JsonLines(logging.Formatter):
    """One JSON object per log record: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Logging of a long-running command: `level` for rsc, third parties at WARNING (one line per
    HTTP request or Redis script-cache retry is noise), text or JSON lines on stderr.

    Raises `ValueError` for a `level` that `logging` does not know (the options offer only known ones)."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonLines())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("rsc").setLevel(level.upper())
    logging.getLogger("hypercorn.error").setLevel(level.upper())


def logging_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--log-level` and `--log-format` (also `RSC_LOG_LEVEL`, `RSC_LOG_FORMAT`). Raises nothing."""
    command = click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        envvar="RSC_LOG_FORMAT",
        help="Log lines as text or as JSON objects [env RSC_LOG_FORMAT].",
    )(command)
    return click.option(
        "--log-level",
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
        default="INFO",
        show_default=True,
        envvar="RSC_LOG_LEVEL",
        help="Least severity logged by rsc [env RSC_LOG_LEVEL].",
    )(command)


class StartupError(click.ClickException):
    """A process that cannot start (bad configuration, a port in use, Redis not answering, a
    target that does not load): one line on stderr, exit code 2."""

    exit_code = 2


def logging_everywhere(command: click.Command) -> None:
    """`--log-level` and `--log-format` on every command (`serve` and `worker` declare their
    own): one way to turn on DEBUG, or JSON lines, whatever the command. Raises nothing (the
    wrapped commands raise what they raised)."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            logging_everywhere(sub)
        return
    if command.callback is None or any(param.name == "log_level" for param in command.params):
        return
    callback = command.callback
    with_options = logging_options(lambda log_level, log_format: None)
    command.params.extend(with_options.__click_params__)  # type: ignore[attr-defined]

    @functools.wraps(callback)
    def configured(*args: Any, log_level: str, log_format: str, **kwargs: Any) -> Any:
        # A short command logs only warnings unless asked (by option or environment).
        context = click.get_current_context()
        defaults = (None, click.core.ParameterSource.DEFAULT)
        if any(context.get_parameter_source(name) not in defaults for name in ("log_level", "log_format")):
            setup_logging(log_level, log_format)
        return callback(*args, **kwargs)

    command.callback = configured
