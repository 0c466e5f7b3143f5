"""`rsc serve --demo` as the README's quick start runs it: starts, demos, and stops cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
import httpx
import pytest

from rsc import cli
from tests import redis_servers
from tests.httpkit import hb, wait_for_output
from tests.redis_servers import DurableServer, free_port


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_demo_server_stops_cleanly(standalone_url: str, tmp_path: Path, signum: signal.Signals) -> None:
    port = free_port()
    env = {**os.environ, "RSC_REDIS_URL": standalone_url}
    command = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}", "--demo"]
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_output(process, log_path, "demo: 10.0.0.1/demo-worker/0 epoch")
            assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
            process.send_signal(signum)
            process.wait(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    text = log_path.read_text()
    assert process.returncode == 0, text
    assert "Traceback" not in text, text
    assert "left gracefully" in text, text  # its members leave before it stops
    assert "the Admin API is off: set RSC_ADMIN_PASSWORD" in text, text  # said at start


def test_make_run_again_right_after_ctrl_c_finds_no_member_in_its_way(
    standalone_url: str, tmp_path: Path
) -> None:
    """`make run`, Ctrl-C, `make run` at once: the demo's members left with the first run, so
    the second run's members join at once instead of waiting for the old ones' leases."""
    port = free_port()
    env = {**os.environ, "RSC_REDIS_URL": standalone_url, "RSC_KEY_PREFIX": f"rerun{port}:"}
    command = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}", "--demo"]
    texts = []
    for run in range(2):
        log_path = tmp_path / f"serve-{run}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                began = time.monotonic()
                wait_for_output(process, log_path, "demo: 10.0.0.1/demo-worker/0 epoch")
                reading = time.monotonic() - began
                process.send_signal(signal.SIGINT)
                process.wait(timeout=20)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        texts.append(log_path.read_text())
    assert "another incarnation" not in texts[1], texts[1]
    assert reading < 8, texts[1]  # not a lease (10 s) of waiting for the first run's member


TAKEN = "{taken}"
START_UP_MISTAKES = [
    (["serve", "--bind", TAKEN], f"cannot listen on {TAKEN}: Address already in use"),
    (
        ["serve", "--bind", "localhost"],
        "--bind needs HOST:PORT (for example 127.0.0.1:8080), not 'localhost'",
    ),
    (
        ["serve", "--bind", "127.0.0.1:0", "--redis-url", "redis://127.0.0.1:1"],
        "cannot reach Redis at 127.0.0.1:1: Unable to establish a connection to 127.0.0.1:1",
    ),
    (["worker", "no_such_module:app"], "cannot load 'no_such_module:app': No module named 'no_such_module'"),
    (["worker", "rsc.cli:main"], "'rsc.cli:main' is not an rsc.client.App"),
]


@pytest.mark.parametrize(("args", "says"), START_UP_MISTAKES)
def test_start_up_mistakes_are_one_line_and_exit_2(args: list[str], says: str, standalone_url: str) -> None:
    """Real processes: a port in use, a bind without a port, Redis not answering, a worker
    target that does not load: one line saying so on stderr (no traceback), exit code 2."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        argv = [a.replace(TAKEN, address) for a in args]
        env = {**os.environ, "RSC_REDIS_URL": standalone_url}
        command = [sys.executable, "-m", "rsc", *argv]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    errors = [line for line in result.stderr.splitlines() if not re.match(r"\d{4}-\d\d-\d\d ", line)]
    assert result.returncode == 2, result.stderr
    assert errors == [f"Error: {says.replace(TAKEN, address)}"], result.stderr
    assert "Traceback" not in result.stderr


def test_log_lines_can_be_json_objects(standalone_url: str, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "RSC_REDIS_URL": standalone_url}
    command = [
        *(sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"),
        *("--log-format", "json", "--log-level", "debug"),
    ]
    err_path = tmp_path / "serve.err"
    with err_path.open("wb") as err:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            wait_for_output(process, err_path, "coordinator lease")
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=20)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    lines = [json.loads(line) for line in err_path.read_text().splitlines()]
    assert lines
    assert all(set(line) >= {"time", "level", "logger", "message"} for line in lines)
    assert any(line["logger"] == "rsc.leadership" for line in lines)
    assert not any(
        line["logger"].startswith(("httpx", "coredis")) and line["level"] == "INFO" for line in lines
    )


def _leaves(command: click.Command, path: str = "rsc") -> list[tuple[str, click.Command]]:
    """Every command under `command`, asked as click asks (`rsc`'s commands load when asked)."""
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        subs = [(name, command.get_command(ctx, name)) for name in command.list_commands(ctx)]
        return [leaf for name, sub in subs if sub is not None for leaf in _leaves(sub, f"{path} {name}")]
    return [(path, command)]


def test_every_command_takes_the_same_log_options() -> None:
    leaves = _leaves(cli.main)
    assert len(leaves) > 20
    for path, command in leaves:
        options = {param.name: param for param in command.params if isinstance(param, click.Option)}
        for name, choices in (("log_level", 4), ("log_format", 2)):
            assert name in options, f"{path} has no --{name.replace('_', '-')}"
            assert len(options[name].type.choices) == choices, path  # type: ignore[attr-defined]
            assert options[name].envvar == f"RSC_{name.upper()}", path


def test_log_options_of_a_short_command_take_effect(standalone_url: str) -> None:
    """`rsc journal show` with `--log-level debug --log-format json`: rsc's debug lines as JSON."""
    env = {**os.environ, "RSC_REDIS_URL": standalone_url}
    command = [sys.executable, "-m", "rsc", "journal", "show", "nope", "--log-level", "debug"]
    result = subprocess.run(
        [*command, "--log-format", "json"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert "Error: no journal for stream 'nope'" in result.stderr
    logged = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert logged, result.stderr
    assert all(line["logger"].startswith("rsc") for line in logged)


def test_a_redis_outage_is_two_lines_in_the_coordinator_log(tmp_path: Path) -> None:
    """A real coordinator whose Redis crashes and comes back while members keep heartbeating:
    one line when the outage begins, one when it ends with the count of repeats not logged
    (it used to log every failed request, actor write, reload and lease renewal)."""
    port = free_port()
    with DurableServer(tmp_path / "redis") as server:
        env = {**os.environ, "RSC_REDIS_URL": server.url, "RSC_HEARTBEAT_INTERVAL_MS": "200"}
        command = [sys.executable, "-m", "rsc", "serve", "--bind", f"127.0.0.1:{port}"]
        log_path = tmp_path / "serve.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_output(process, log_path, "took the coordinator lease")
            wait_for_output(process, log_path, "Running on")  # and listening (the lease may come first)
            url = f"http://127.0.0.1:{port}/v1/heartbeat"
            with httpx.Client(timeout=5) as client:
                join = client.post(url, json=hb("outage", "m", 0))
                assert join.status_code == 200, join.text
                server.stop(signal.SIGKILL)
                refused = 0
                for n in range(20):  # joins: each must be written (a stable member's beat need not)
                    answer = client.post(url, json=hb("outage", f"joiner-{n}", 0))
                    refused += answer.status_code == 503
                    time.sleep(0.1)
                assert refused >= 10
                server.start()
                wait_for_output(process, log_path, "Redis answers again after")
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    text = log_path.read_text()
    warnings = [line for line in text.splitlines() if " WARNING " in line]
    began = [line for line in warnings if "Redis unavailable, retrying" in line]
    ended = [line for line in warnings if "Redis answers again after" in line]
    assert (len(began), len(ended)) == (1, 1), text
    repeats = re.search(r"\((\d+) repeated failures not logged\)", ended[0])
    assert repeats is not None, ended[0]
    assert int(repeats.group(1)) >= refused, ended[0]
    # Nothing else repeats the failure: every other warning is an event of its own.
    # (the outage's own first line names whichever call met it first: a refused connection, or a
    # connection reset under a side effect)
    noisy = [line for line in warnings if "Unable to establish" in line or "Connection refused" in line]
    assert [line for line in noisy if line not in began] == [], text
    assert "Traceback" not in text, text


def _redis_commands() -> list[tuple[str, list[str]]]:
    """Every command with a `--redis-url` option, with its required arguments filled in."""
    fill = {"stream": "nope", "target": "tests.workerapp:app", "key_prefix": "nope:"}
    out = []
    for path, command in _leaves(cli.main):
        names = {p.name for p in command.params}
        if "redis_url" not in names or path in ("rsc journal show", "rsc journal replay"):
            continue  # (the journal commands share one way to Redis: `verify` stands for them)
        args = path.split()[1:]
        for param in command.params:
            if param.required:
                value = fill[param.name or ""]
                args += [value] if isinstance(param, click.Argument) else [param.opts[0], value]
        out.append((path, args))
    return out


REDIS_COMMANDS = _redis_commands()


@pytest.fixture(scope="module")
def guarded_redis() -> Iterator[str]:
    """A redis-server that asks for a password."""
    with redis_servers.standalone(password="right-pass") as url:
        yield url


@pytest.mark.parametrize(("path", "args"), REDIS_COMMANDS, ids=[p for p, _ in REDIS_COMMANDS])
@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://127.0.0.1:1", "cannot reach Redis at 127.0.0.1:1"),
        ("foo://127.0.0.1:6379", "foo://127.0.0.1:6379"),
        ("{guarded}", "refused the connection"),
    ],
    ids=["unreachable", "unusable", "refused"],
)
def test_every_command_that_talks_to_redis_says_a_redis_mistake_in_one_line(
    path: str, args: list[str], url: str, says: str, guarded_redis: str
) -> None:
    """Redis not answering, a URL it cannot use, a password it refuses: one `Error:` line,
    never a traceback, from every command that has `--redis-url` (a start-up mistake of
    `serve` and `worker` exits 2, a short command 1)."""
    assert len(REDIS_COMMANDS) >= 4, REDIS_COMMANDS  # serve, worker, journal, purge
    redis_url = url.replace("{guarded}", guarded_redis.replace("right-pass", "wrong-pass"))
    env = {**os.environ, "RSC_COORDINATOR_URL": "http://127.0.0.1:1"}
    extra = ["--bind", "127.0.0.1:0"] if path == "rsc serve" else []
    command = [sys.executable, "-m", "rsc", *args, *extra, "--redis-url", redis_url]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert "Traceback" not in result.stderr, result.stderr
    assert len(errors) == 1, result.stderr
    assert says in errors[0], errors[0]
    assert "wrong-pass" not in result.stdout + result.stderr
    assert result.returncode == (2 if path in ("rsc serve", "rsc worker") else 1), result.stderr
