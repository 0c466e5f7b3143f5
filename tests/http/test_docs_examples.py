"""The worked examples of docs/operations.md, run: each `<!-- docs-example: NAME -->` console
block's commands run against a real coordinator and must print what the page shows, so the
page cannot rot. Request ids and times are shown as `<id>` and `<ms>`; the stream `orders` of
the page is a fresh name per run; files the page shows (a block starting `# NAME`) are written
first."""

from __future__ import annotations

import re
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import httpx
import pytest
import trio
from click.testing import CliRunner

from rsc.cli import main as rsc_main
from tests.httpkit import FAST, serve_on

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
EXAMPLE = re.compile(r"<!-- docs-example: (\w+) -->\n```console\n(.*?)```", re.S)
FILE = re.compile(r"```(?:toml|yaml)\n# ([\w.-]+)\n(.*?)```", re.S)


def examples() -> dict[str, list[tuple[str, str]]]:
    """Each example's (command, expected output) pairs, in order."""
    found: dict[str, list[tuple[str, str]]] = {}
    for name, block in EXAMPLE.findall(PAGE.read_text()):
        steps: list[tuple[str, str]] = []
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], ""))
            else:
                command, output = steps[-1]
                steps[-1] = (command, output + line + "\n")
        found[name] = steps
    return found


def normalized(text: str, prefix: str) -> str:
    text = text.replace(prefix, "orders")
    text = re.sub(r"request [0-9a-f]{32}", "request <id>", text)
    return re.sub(r"at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", "at <time>", text)


@pytest.fixture
async def http(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url, admin_password="s3cret")) as client:
        yield client


def test_the_page_has_the_examples() -> None:
    assert set(examples()) == {"cli", "apply"}
    assert all(command.startswith("rsc ") for steps in examples().values() for command, _ in steps)


@pytest.mark.parametrize("name", ["cli", "apply"])
async def test_each_example_prints_what_the_page_shows(
    http: httpx.AsyncClient, prefix: str, tmp_path: Path, name: str
) -> None:
    for filename, text in FILE.findall(PAGE.read_text()):
        (tmp_path / filename).write_text(text.replace('"orders"', f'"{prefix}"'))
    env = {
        "RSC_COORDINATOR_URL": str(http.base_url),
        "RSC_ADMIN_PASSWORD": "s3cret",
        "RSC_NETRC": "/nonexistent",
    }
    runner = CliRunner()
    for command, expected in examples()[name]:
        args = [a.replace("orders", prefix) for a in shlex.split(command)[1:]]
        args = [str(tmp_path / a) if (tmp_path / a).exists() else a for a in args]
        result = await trio.to_thread.run_sync(lambda args=args: runner.invoke(rsc_main, args, env=env))
        assert normalized(result.output, prefix) == expected, f"$ {command}"
