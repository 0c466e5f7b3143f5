"""Every Redis call of the client library goes through the one error boundary (issue 12).

A Redis call outside `rsc.client.redis_calls.redis_call` lets a coredis exception (or an
exception group of them) escape as it is: the bug that killed every worker on a Redis
restart. This test reads the source, so that a new call cannot be added without it.
"""

from __future__ import annotations

import ast
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "rsc" / "client"
#: Modules that talk to Redis through coredis (the sync producer maps redis-py's errors itself):
#: the trio producer and every module of the poller package.
TRIO_MODULES = ["producer.py", *sorted(f"poller/{p.name}" for p in (CLIENT / "poller").glob("*.py"))]
#: Modules among them that must be found calling Redis (else the check looks at the wrong thing).
CALLERS = {"producer.py", "poller/scripts.py", "poller/wakeup.py", "poller/reclaim.py"}
#: The attributes that hold a coredis client (the poller's blocking wake-up reads have their own),
#: or the lean connection the member scripts go on where there is one.
CLIENTS = {"redis", "wake_client", "lean"}


def redis_uses(tree: ast.Module) -> list[ast.AST]:
    """Each use of a client (`self.redis`, `CLIENTS`) and each call of a script registered with
    `register_script`, outside `__init__` (registering a script does not talk to Redis)."""
    scripts = {
        target.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and node.value.func.attr == "register_script"
        for target in node.targets
        if isinstance(target, ast.Attribute)
    }
    uses: list[ast.AST] = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) or function.name == "__init__":
            continue
        for node in ast.walk(function):
            if _is_self_attribute(node) and (
                node.attr in CLIENTS or (node.attr in scripts and _called_or_passed(function, node))
            ):
                uses.append(node)
    return uses


def _is_self_attribute(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _called_or_passed(function: ast.AST, attribute: ast.Attribute) -> bool:
    return any(isinstance(n, ast.Call) and attribute in [n.func, *n.args] for n in ast.walk(function))


def inside_boundary(tree: ast.Module, node: ast.AST, bounded: frozenset[str] = frozenset()) -> bool:
    """`node` is lexically inside `with redis_call(...)`, or inside a method of `bounded`."""
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    current: ast.AST | None = node
    while current is not None:
        if isinstance(current, ast.With | ast.AsyncWith) and any(
            isinstance(item.context_expr, ast.Call)
            and isinstance(item.context_expr.func, ast.Name)
            and item.context_expr.func.id == "redis_call"
            for item in current.items
        ):
            return True
        if isinstance(current, ast.FunctionDef | ast.AsyncFunctionDef):
            return current.name in bounded
        current = parents.get(current)
    return False


def bounded_methods(tree: ast.Module) -> frozenset[str]:
    """The methods whose every call site (`self.<name>(...)`, at least one) is inside the
    boundary, or inside another such method (as the poller scripts' `_eval`)."""
    calls: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_self_attribute(node.func):
            calls.setdefault(node.func.attr, []).append(node)  # type: ignore[attr-defined]
    methods = {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    bounded: frozenset[str] = frozenset()
    while True:
        more = frozenset(
            name
            for name in methods
            if calls.get(name) and all(inside_boundary(tree, call, bounded) for call in calls[name])
        )
        if more == bounded:
            return bounded
        bounded = more


def test_every_redis_call_of_the_client_goes_through_the_boundary() -> None:
    outside = []
    for name in TRIO_MODULES:
        tree = ast.parse((CLIENT / name).read_text())
        uses = redis_uses(tree)
        assert uses or name not in CALLERS, (
            f"{name}: no Redis call found; is the test looking at the right thing?"
        )
        bounded = bounded_methods(tree)
        for node in uses:
            if inside_boundary(tree, node, bounded):
                continue
            # Scripts passed to `_call` are run inside its boundary.
            parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
            call = parents.get(node)
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "_call"
                and node in call.args
            ):
                continue
            outside.append(f"{name}:{getattr(node, 'lineno', '?')}")
    assert outside == [], f"Redis calls outside redis_call(): {outside}"


def test_the_check_sees_a_call_outside_the_boundary() -> None:
    tree = ast.parse(
        "class P:\n"
        "    def __init__(self, redis):\n"
        "        self.redis = redis\n"
        "        self._x = redis.register_script('return 1')\n"
        "    async def ok(self):\n"
        "        with redis_call('x'):\n"
        "            return await self.redis.get('k')\n"
        "    async def bad(self):\n"
        "        return await self._x(keys=[], args=[])\n"
    )
    uses = redis_uses(tree)
    assert [inside_boundary(tree, u) for u in uses] == [True, False]
