"""Every module of rsc imports on its own, whichever of them a program imports first.

A cycle of imports works in one order and fails in another: `import rsc.http.app` on its own
once failed (`rsc.http.monitoring_routes` imported the admin routes, which took a function
from `rsc.http.monitoring_routes` before it was defined), while the coordinator, importing
them in another order, ran. Importing each of the ~190 modules in a fresh interpreter costs
minutes of CPU, so this test plays Python's import of each module from the source instead:
module bodies run top to bottom, parents before children, a module already being imported is
handed over as far as it got, and `from X import name` fails when X is part-way and `name` is
not bound yet (nor a submodule, nor served by a module `__getattr__` defined by then).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import attrs

ROOT = Path(__file__).parents[2] / "rsc"


@attrs.define
class Module:
    name: str
    package: bool
    body: list[ast.stmt]


def _modules() -> dict[str, Module]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if package else parts)
        found[name] = Module(name, package, ast.parse(path.read_text(), str(path)).body)
    return found


MODULES = _modules()


def _executed(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements a module body runs at import, in order (into `if`, `try` and `with`
    blocks; not into `if TYPE_CHECKING:`, functions or classes)."""
    for statement in body:
        if isinstance(statement, ast.If):
            if "TYPE_CHECKING" in ast.unparse(statement.test):
                yield from _executed(statement.orelse)
                continue
            yield from _executed(statement.body)
            yield from _executed(statement.orelse)
        elif isinstance(statement, ast.Try):
            yield from _executed(statement.body)
            for handler in statement.handlers:
                yield from _executed(handler.body)
            yield from _executed(statement.orelse)
            yield from _executed(statement.finalbody)
        elif isinstance(statement, ast.With):
            yield from _executed(statement.body)
        else:
            yield statement


def _binds(statement: ast.stmt) -> set[str]:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in statement.names}
    targets = statement.targets if isinstance(statement, ast.Assign) else []
    if isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        targets = [statement.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


class Importer:
    """One program's imports, from nothing loaded."""

    def __init__(self) -> None:
        self.done: set[str] = set()
        self.bound: dict[str, set[str]] = {}  # a module being imported: the names bound so far
        self.failures: list[str] = []

    def load(self, name: str) -> None:
        if name in self.done or name in self.bound or name not in MODULES:
            return
        if "." in name:
            self.load(name.rsplit(".", 1)[0])
        module = MODULES[name]
        bound = self.bound[name] = set()
        for statement in _executed(module.body):
            if isinstance(statement, ast.Import):
                for alias in statement.names:
                    self.load(alias.name)
            elif isinstance(statement, ast.ImportFrom):
                self._from(module, statement)
            bound |= _binds(statement)
        del self.bound[name]
        self.done.add(name)

    def _from(self, module: Module, statement: ast.ImportFrom) -> None:
        source = statement.module or ""
        if statement.level:
            base = module.name.split(".")
            base = base if module.package else base[:-1]
            base = base[: len(base) - statement.level + 1]
            source = ".".join([*base, *([source] if source else [])])
        if source.split(".")[0] != "rsc":
            return
        self.load(source)
        for alias in statement.names:
            if f"{source}.{alias.name}" in MODULES:
                self.load(f"{source}.{alias.name}")
            elif source in self.bound and not self.bound[source] & {alias.name, "__getattr__"}:
                self.failures.append(f"{module.name}: from {source} import {alias.name} ({source} part-way)")


def test_every_module_imports_first_without_a_circular_import_failure() -> None:
    failures = {}
    for name in MODULES:
        importer = Importer()
        importer.load(name)
        if importer.failures:
            failures[name] = importer.failures
    assert failures == {}


def test_the_player_finds_the_cycle_that_broke_rsc_http_app() -> None:
    """The check can fail: the order that broke (a module taking a name from one part-way)."""
    cycle = {
        "rsc.cyc": Module("rsc.cyc", True, []),
        "rsc.cyc.a": Module("rsc.cyc.a", False, ast.parse("from rsc.cyc.b import g\ndef f(): pass\n").body),
        "rsc.cyc.b": Module("rsc.cyc.b", False, ast.parse("from rsc.cyc.a import f\ndef g(): pass\n").body),
    }
    MODULES.update(cycle)
    try:
        first_a = Importer()
        first_a.load("rsc.cyc.a")
        assert first_a.failures == ["rsc.cyc.b: from rsc.cyc.a import f (rsc.cyc.a part-way)"]
    finally:
        for name in cycle:
            del MODULES[name]
