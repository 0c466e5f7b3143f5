"""`rsc serve --demo` as the README's quick start runs it: starts, demos, and stops cleanly on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.httpkit import wait_for_output
from tests.redis_servers import free_port


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
