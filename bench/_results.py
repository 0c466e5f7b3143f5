"""Where a benchmark writes its JSON: `bench/results/<name>`, or under `RSC_BENCH_RESULTS_DIR`
when it is set (the smoke tests run each benchmark at its smallest size there, so that they
never overwrite a measured result)."""

from __future__ import annotations

import os
from pathlib import Path


def results_path(name: str) -> Path:
    root = os.environ.get("RSC_BENCH_RESULTS_DIR")
    return (Path(root) if root else Path(__file__).parent / "results") / name
