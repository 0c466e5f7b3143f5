"""Each benchmark that needs nothing beyond this repository runs at its smallest size and
writes its report (issue 30: `bench/rebalance.py` broke once and no test noticed). The
reports go to a temporary directory (`RSC_BENCH_RESULTS_DIR`), never over a measured one. No
figure is asserted: a benchmark is not a test of speed, only of still working."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: name: (arguments at the smallest size, what its report must hold)
SMOKE: dict[str, tuple[str, str]] = {
    "assignor": ("--quick --repeat 1", "rows"),
    "lists": ("--streams 20 --step 10 --heartbeat-streams 100", "rows"),
    "churn": (
        "--members 40 --batch 20 --shards 64 --seconds 2 --leaves 2 --joins 2 --interval-ms 1000 "
        "--settle-timeout 60 --shape interval",
        "churn",
    ),
    "scale": (
        "--members 200 --streams 20 --drivers 2 --batch 50 --interval-ms 1000 --seconds 2",
        "takeoverSeconds",
    ),
    "rebalance": ("--modes push --rate 100 --shards 4 --steady 0.5 --settle 1.5 --cycles 1", "results"),
    "soak": ("--minutes 0.1 --rate 200 --sample-s 2 --retention-ms 500", "samples"),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_benchmark_runs_at_its_smallest_size(name: str, tmp_path: Path) -> None:
    arguments, holds = SMOKE[name]
    env = {**os.environ, "RSC_BENCH_RESULTS_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{name}.py"), *arguments.split()],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report: dict[str, Any] = json.loads((tmp_path / f"{name}.json").read_text())
    assert report["benchmark"] == name
    assert report.get(holds), report
    assert str(tmp_path) in done.stdout  # it said where it wrote
    if name == "churn":  # every leave done and every join in, by the members' and the coordinator's count
        for shape in report["shapes"].values():
            members = shape["membersAtEnd"]
            assert members["agents"] == members["coordinator"] == members["expected"], members
            assert {"quiet", "churn", "pause", "reset"} <= set(shape), shape.keys()
