"""The HTTP layer talks to the actors through one typed port (`rsc.actors.deployment`): it
imports from `rsc.actors` only the port and its errors, reaches no registry internals, needs no
`type: ignore`, and nothing crossing the port is `Any`."""

from __future__ import annotations

import ast
import inspect
import typing
import warnings
from pathlib import Path

import pytest

from rsc.actors import deployment
from rsc.actors.deployment import Deployment

HTTP = Path(__file__).parents[2] / "rsc" / "http"
#: What `rsc.http` may import of `rsc.actors`.
PORT = {"rsc.actors.deployment", "rsc.actors.errors"}


def actors_imports(path: Path) -> set[str]:
    """The `rsc.actors` modules `path` imports (`from rsc.actors import x` names `rsc.actors.x`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("rsc.actors"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rsc.actors"):
            if node.module == "rsc.actors":
                found.update(f"rsc.actors.{a.name}" for a in node.names)
            else:
                found.add(node.module)
    return found


MODULES = sorted(HTTP.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(HTTP)))
def test_an_http_module_imports_only_the_port_and_its_errors(path: Path) -> None:
    assert actors_imports(path) <= PORT


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(HTTP)))
def test_an_http_module_needs_no_type_ignore_and_reaches_no_effects(path: Path) -> None:
    text = path.read_text()
    assert "type: ignore" not in text
    assert ".effects." not in text
    assert "registry.effects" not in text


def test_every_method_of_the_port_is_typed_without_any() -> None:
    methods = [m for name, m in inspect.getmembers(Deployment) if not name.startswith("_")]
    assert len(methods) > 30
    for method in methods:
        target = method.fget if isinstance(method, property) else method
        hints = typing.get_type_hints(target, vars(deployment))
        assert "return" in hints, target
        params = [p for p in inspect.signature(target).parameters if p != "self"]
        assert set(params) <= set(hints), target
        for hint in hints.values():
            assert "Any" not in repr(hint), (target, hint)


def test_a_registry_given_to_the_http_layer_still_works_with_a_deprecation_warning() -> None:
    """0.2.0's `create_app(registry)`: wrapped in a `Deployment`, with a `DeprecationWarning`."""
    sentinel = object.__new__(deployment.Registry)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped = deployment.as_deployment(sentinel)
    assert isinstance(wrapped, Deployment)
    assert [w.category for w in caught] == [DeprecationWarning]
    port = Deployment(sentinel)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert deployment.as_deployment(port) is port
