"""The previous release, built from git into a venv of its own, to run beside this one.

`tests/compat/BASELINE` names the release (tag) and its commit; a fresh clone may
lack the tag, so the commit is what is checked out (`git archive`, no network).
The venv is made without pip (offline): the baseline declares the same
dependencies as this release, so a `.pth` file puts the baseline's source first
and this project's installed dependencies after it. Built once per commit under
`.compat/` (git-ignored) and reused.

    python -m tests.compat.baseline      # build it and print its python
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
BASELINE_FILE = Path(__file__).with_name("BASELINE")
CACHE = ROOT / ".compat"


@attrs.frozen
class Baseline:
    tag: str
    commit: str
    source: Path  # the release's tree: `rsc/`, `tests/`
    python: Path  # its venv's interpreter

    @property
    def version(self) -> str:
        return self.tag.removeprefix("v")

    def env(self, **extra: str) -> dict[str, str]:
        """The environment to run the baseline in (its own tree first on the path)."""
        return {**os.environ, "PYTHONPATH": str(self.source), **extra}


def recorded() -> tuple[str, str]:
    """The tag and commit that BASELINE names."""
    for line in BASELINE_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            tag, commit = line.split()
            return tag, commit
    raise RuntimeError(f"{BASELINE_FILE} names no release")


def build(cache: Path = CACHE) -> Baseline:
    """The baseline's tree and venv, built on first use (a few seconds)."""
    tag, commit = recorded()
    home = cache / commit
    source, venv = home / "src", home / "venv"
    python = venv / "bin" / "python"
    if not (home / "ready").exists():
        home.mkdir(parents=True, exist_ok=True)
        # One builder at a time: the compat tests run on several xdist workers at once, and two
        # building side by side removed each other's tree (the tier's tests then errored).
        with (home / "build.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (home / "ready").exists():
                _archive(commit, source)
                _venv(venv, source)
                (home / "ready").write_text(f"{tag} {commit}\n")
    return Baseline(tag, commit, source, python)


def _archive(commit: str, source: Path) -> None:
    found = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True, check=False
    )
    if found.returncode != 0:
        raise RuntimeError(
            f"the baseline commit {commit} is not in this clone (a shallow clone?): "
            "fetch the full history (git fetch --unshallow) to run the compat tier"
        )
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "baseline.tar"
        subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), commit], check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(source, filter="data")


def _venv(venv: Path, source: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dependencies = sysconfig.get_paths()["purelib"]  # this project's venv: the same dependencies
    (Path(site) / "rsc_baseline.pth").write_text(f"{source}\n{dependencies}\n")


if __name__ == "__main__":
    baseline = build()
    print(f"{baseline.tag} ({baseline.commit[:12]}): {baseline.python}")
