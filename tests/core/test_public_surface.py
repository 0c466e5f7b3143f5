"""The stable public surface: `rsc`'s top level (`__all__`, loaded lazily) and every import
path 0.1.0's docs gave, still working (a moved one with a `DeprecationWarning`), and no public
name gone without a "Deprecated" entry in the CHANGELOG."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import rsc

ROOT = Path(__file__).resolve().parents[2]
#: The import paths 0.1.0's docs and examples gave (every one must keep working).
DOCUMENTED_0_1 = (
    ("rsc.client.app", "App"),
    ("rsc.client.poller", "Message"),
    ("rsc.client.coordinator", "Coordinator"),
    ("rsc.client.producer", "open_producer"),
    ("rsc.client.sync", "SyncCoordinator"),
    ("rsc.client.sync", "SyncProducer"),
    ("rsc.connect", "open_redis"),
)
#: The top-level names of 0.2.0: a release may add names, never drop one silently.
PUBLIC_0_2 = frozenset(
    {
        "AdminClient",
        "App",
        "Coordinator",
        "MemberSettings",
        "Message",
        "NoWritableShards",
        "PollerSettings",
        "Producer",
        "ProducerFenced",
        "ProducerPaused",
        "PublishFailed",
        "RedisOutOfMemory",
        "RscError",
        "ShardFull",
        "SyncCoordinator",
        "SyncProducer",
        "connect_producer",
        "connect_sync_producer",
        "open_producer",
        "open_redis",
    }
)


def run(code: str) -> dict[str, object]:
    """`code` in a fresh interpreter (warnings recorded); what it prints as JSON."""
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    found: dict[str, object] = json.loads(done.stdout)
    return found


def test_import_rsc_loads_no_client_code() -> None:
    loaded = run(
        "import json, sys, rsc; print(json.dumps(sorted(m for m in sys.modules if m.startswith('rsc.'))))"
    )
    assert loaded == []


def test_rsc_worker_loads_neither_the_coordinator_nor_its_web_framework() -> None:
    """`rsc worker` (and each command) imports only its own module: a worker starts in about
    half the CPU it took when the command line imported every command first."""
    loaded = run(
        "import json, sys, click\n"
        "from rsc.cli import main\n"
        "assert main.get_command(click.Context(main), 'worker').name == 'worker'\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('rsc', 'quart', 'flask'))))"
    )
    assert isinstance(loaded, list)
    assert "rsc.cli.worker_command" in loaded
    heavy = ("rsc.actors.", "rsc.http", "rsc.coordinator", "quart", "flask")
    assert not [m for m in loaded if m.startswith(heavy) and m != "rsc.actors.errors"]
    assert not [
        m
        for m in loaded
        if m.startswith("rsc.cli.") and m not in ("rsc.cli.worker_command", "rsc.cli.process_setup")
    ]


def test_every_public_name_resolves_from_the_top_level() -> None:
    assert set(rsc.__all__) - {"__version__"} >= PUBLIC_0_2 - deprecated()
    for name in rsc.__all__:
        assert getattr(rsc, name) is not None, name
    code = (
        "import json; from rsc import App, Producer, Message; "
        "print(json.dumps([App.__name__, Producer.__name__]))"
    )
    assert run(code) == ["App", "Producer"]
    with pytest.raises(AttributeError):
        rsc.NotAName  # noqa: B018


@pytest.mark.parametrize(("module", "name"), DOCUMENTED_0_1)
def test_every_import_path_0_1_documented_still_works(module: str, name: str) -> None:
    code = (
        "import json, warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        f"    from {module} import {name}\n"
        "print(json.dumps([str(w.message) for w in seen if w.category is DeprecationWarning]))"
    )
    warned = run(code)
    if module == "rsc.client.app":  # moved in 0.2.0: one warning naming the new path
        assert len(warned) == 1
        assert "rsc.client.worker" in str(warned[0])
    else:
        assert warned == []
        assert getattr(importlib.import_module(module), name) is not None


def deprecated() -> set[str]:
    """The names the CHANGELOG's "Deprecated" sections name (in backquotes)."""
    text = (ROOT / "CHANGELOG.md").read_text()
    names: set[str] = set()
    for section in text.split("### Deprecated")[1:]:
        body = section.split("\n### ")[0].split("\n## ")[0]
        names.update(part.split("`")[0] for part in body.split("`")[1::2])
    return names


def test_no_public_name_disappears_without_a_deprecation() -> None:
    gone = {n for n in PUBLIC_0_2 if n not in rsc.__all__} - deprecated()
    assert not gone, f"public names removed without a CHANGELOG 'Deprecated' entry: {sorted(gone)}"
