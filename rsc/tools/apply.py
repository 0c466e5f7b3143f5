"""`rsc diff` / `rsc apply`: streams and groups from files, the GitOps way.

A file (TOML, or YAML when it ends in `.yaml`/`.yml`) holds the desired specs, many per
file, in the Admin API's own field names:

    [[streams]]
    name = "orders"
    shardCount = 8
    reshardMode = "online"          # optional: online
    retention = { keep = "acknowledged", maxAgeMs = 86400000 }   # optional (level 5): left out,
                                    # the stream keeps its policy; given, the others are defaults

    [[streams.groups]]
    name = "billing"
    maxConcurrency = 4              # optional: 1
    startFrom = "earliest"          # optional: earliest; applies when the group is created
    staticHoldMs = 30000            # optional: one member lease; static members' hold (level 4)

Each stream and group given is a whole spec, as a `PUT`: a field left out means its default.
The plan compares them with the coordinator: create, change (field from -> to), and, only
with `--prune`, delete what the files do not name (groups of the streams named; with
`--prune-streams` also streams). `apply` sends each change with `If-Match` of the revision
the plan read, so a change made meanwhile is detected (412) instead of overwritten, and a
second `apply` is a no-op.

Exit codes follow `terraform plan -detailed-exitcode`: 0 nothing to change, 2 changes
(`diff`, `apply --dry-run`), 1 an error. `apply` exits 0 once everything is applied.
"""

from __future__ import annotations

import difflib
import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import cattrs
import click
import yaml

from rsc.client.admin_api import AdminClient, AdminError
from rsc.events import codec
from rsc.events.model import MAX_STATIC_HOLD_MS
from rsc.events.retention import Retention

STREAM_FIELDS: dict[str, Any] = {"shardCount": None, "reshardMode": "online", "retention": None}
GROUP_FIELDS: dict[str, Any] = {"maxConcurrency": 1, "startFrom": "earliest", "staticHoldMs": None}
#: What each field may hold: (lowest, highest) for integers, the values for choices. The same
#: ranges as the Admin API's, checked here so that a bad value is an error in the plan.
RULES: dict[str, tuple[int, int] | tuple[str, ...]] = {
    "shardCount": (0, 16_384),
    "maxConcurrency": (1, 1_024),
    "reshardMode": ("online", "quiesce"),
    "startFrom": ("earliest", "latest"),
    "staticHoldMs": (0, MAX_STATIC_HOLD_MS),
}
#: Fields whose default is "unset" (null: the coordinator's own default; left out of specs).
NULLABLE = {"staticHoldMs"}
#: Fields whose absence means "leave it as it is" (not "the default"): neither sent nor compared.
KEPT_WHEN_OMITTED = {"retention"}
#: Fields that only apply when the object is created.
CREATE_ONLY = {"startFrom"}


class FileError(click.ClickException):
    """A desired-state file that cannot be used (exit 1)."""


@attrs.frozen
class Desired:
    streams: Mapping[str, Mapping[str, Any]]
    groups: Mapping[tuple[str, str], Mapping[str, Any]]


@attrs.frozen
class Change:
    """One step of a plan. `action`: create, change, delete; `fields`: name -> (from, to)."""

    action: str
    kind: str  # stream or group
    stream: str
    group: str | None
    spec: Mapping[str, Any]
    fields: Mapping[str, tuple[Any, Any]] = attrs.field(factory=dict)
    revision: int | None = None
    problem: str | None = None

    @property
    def name(self) -> str:
        return self.stream if self.group is None else f"{self.stream}/{self.group}"

    def line(self) -> str:
        sign = {"create": "+", "change": "~", "delete": "-"}[self.action]
        if self.problem:
            sign = "!"
        what = f"{sign} {self.kind} {self.name}"
        if self.action == "create":
            what += " (" + ", ".join(f"{k} {v}" for k, v in self.spec.items() if v is not None) + ")"
        elif self.action == "change":
            shown = {
                k: ("default" if a is None else a, "default" if b is None else b)
                for k, (a, b) in self.fields.items()
            }
            what += ": " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in shown.items())
        return what + (f"  [{self.problem}]" if self.problem else "")


def load(paths: Sequence[str]) -> Desired:
    """The desired streams and groups of every file (a name given twice is an error)."""
    streams: dict[str, dict[str, Any]] = {}
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    origin: dict[object, str] = {}
    for path in paths:
        data = _read(Path(path))
        _only(data, {"streams"}, path)
        items = data.get("streams", [])
        if not isinstance(items, list):
            raise FileError(f"{path}: streams must be a list of tables")
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise FileError(f"{path}: each stream needs a name")
            name = item["name"]
            _only(item, {"name", "groups", *STREAM_FIELDS}, f"{path}: stream {name}")
            if "shardCount" not in item:
                raise FileError(f"{path}: stream {name}: shardCount is required")
            if name in streams:
                raise FileError(f"{path}: stream {name} is given twice (also in {origin[name]})")
            origin[name] = path
            streams[name] = {k: item.get(k, d) for k, d in STREAM_FIELDS.items()}
            _check_values(streams[name], f"{path}: stream {name}")
            for group in item.get("groups", []):
                if not isinstance(group, dict) or not isinstance(group.get("name"), str):
                    raise FileError(f"{path}: stream {name}: each group needs a name")
                _only(group, {"name", *GROUP_FIELDS}, f"{path}: group {name}/{group['name']}")
                key = (name, group["name"])
                if key in groups:
                    where = f"group {name}/{group['name']}"
                    raise FileError(f"{path}: {where} is given twice (also in {origin[key]})")
                origin[key] = path
                groups[key] = {k: group.get(k, d) for k, d in GROUP_FIELDS.items()}
                _check_values(groups[key], f"{path}: group {name}/{group['name']}")
    return Desired(streams, groups)


def _check_values(spec: dict[str, Any], where: str) -> None:
    for field, value in spec.items():
        if field == "retention":
            if value is not None:
                spec[field] = _retention(value, where)
            continue
        if value is None and field in NULLABLE:
            continue
        rule = RULES[field]
        if isinstance(rule[0], int):
            low, high = rule
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise FileError(f"{where}: {field} must be an integer from {low} to {high}, not {value!r}")
        elif value not in rule:
            raise FileError(f"{where}: {field} must be one of {', '.join(map(repr, rule))}, not {value!r}")


def _retention(value: Any, where: str) -> dict[str, Any]:
    """A file's `retention` table as the whole policy the coordinator stores (the fields it
    leaves out at their defaults), checked as the Admin API checks it."""
    if not isinstance(value, dict):
        raise FileError(f"{where}: retention must be a table of the policy's fields")
    known = [codec.camel(a.name) for a in attrs.fields(Retention)]
    _only(value, set(known), f"{where}: retention")
    for field, given in value.items():  # each field alone, so that a problem names its field
        try:
            codec.wire.structure({field: given}, Retention)
        except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
            leaf: BaseException = exc
            while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
                leaf = leaf.exceptions[0]
            raise FileError(f"{where}: retention.{field} = {given!r} is not accepted ({leaf})") from exc
    policy = codec.wire.structure(value, Retention)
    whole: dict[str, Any] = codec.wire.unstructure(policy)
    return {k: whole.get(k) for k in known}


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise FileError(f"cannot read {path}: {exc}") from exc
    try:
        yaml_file = path.suffix in (".yaml", ".yml")
        data = (yaml.safe_load(text) or {}) if yaml_file else tomllib.loads(text)
    except Exception as exc:  # the parsers' own errors: one line, no traceback
        raise FileError(
            f"{path}: not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'TOML'}: {exc}"
        ) from exc
    if not isinstance(data, dict):
        raise FileError(f"{path}: the top level must be a table with `streams`")
    return data


def _only(data: Mapping[str, Any], known: set[str], where: object) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        hints = []
        for field in unknown:
            close = difflib.get_close_matches(field, sorted(known), n=1)
            hints.append(f"{field!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise FileError(f"{where}: unknown field(s) {', '.join(hints)}; known: {', '.join(sorted(known))}")


def plan(
    admin: AdminClient, desired: Desired, prune: bool = False, prune_streams: bool = False
) -> list[Change]:
    """What `apply` would do, read from the coordinator now."""
    changes: list[Change] = []
    existing = {s["streamPrefix"]: s for s in admin.streams()}
    for name, spec in desired.streams.items():
        current = _get(admin.stream, name)
        if current is None:
            changes.append(Change("create", "stream", name, None, spec))
        else:
            fields = _diff(current.body["spec"], spec)
            if fields:
                changes.append(Change("change", "stream", name, None, spec, fields, current.revision))
        wanted = {g for (s, g) in desired.groups if s == name}
        for group in sorted(wanted):
            gspec = desired.groups[(name, group)]
            found = _get(lambda n, g=group: admin.group(n, g), name) if current is not None else None
            if found is None:
                changes.append(Change("create", "group", name, group, gspec))
                continue
            fields = _diff(found.body["spec"], gspec)
            if fields:
                problem = None
                if set(fields) & CREATE_ONLY:
                    problem = "startFrom applies only when a group is created: delete and re-create it"
                changes.append(Change("change", "group", name, group, gspec, fields, found.revision, problem))
        if prune and current is not None:
            for group in sorted(set(existing.get(name, {}).get("groups", ())) - wanted):
                found = _get(lambda n, g=group: admin.group(n, g), name)
                revision = found.revision if found is not None else None
                changes.append(Change("delete", "group", name, group, {}, revision=revision))
    if prune_streams:
        for name in sorted(set(existing) - set(desired.streams)):
            found = _get(admin.stream, name)
            revision = found.revision if found is not None else None
            for group in sorted(existing[name]["groups"]):
                changes.append(Change("delete", "group", name, group, {}))
            changes.append(Change("delete", "stream", name, None, {}, revision=revision))
    return changes


def _get(read: Any, name: str) -> Any:
    try:
        return read(name)
    except AdminError as exc:
        if exc.status == 404:
            return None
        raise


def _diff(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {
        k: (current.get(k), v)
        for k, v in wanted.items()
        if current.get(k) != v and not (v is None and k in KEPT_WHEN_OMITTED)
    }


def _sent(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The body of a spec's `PUT`: the fields left out that keep their value are not sent."""
    return {k: v for k, v in spec.items() if not (v is None and k in KEPT_WHEN_OMITTED)}


def execute(admin: AdminClient, changes: Sequence[Change], report: Any = None) -> list[str]:
    """Apply `changes` in order, each with `If-Match` of the revision the plan read (a create
    with `If-None-Match: *`, so one made meanwhile is detected, not overwritten); `report`
    is told each one as soon as it is done."""
    done = []
    for c in changes:
        path = c.name
        if c.problem:
            raise click.ClickException(f"{c.kind} {path}: {c.problem}")
        if c.kind == "stream" and c.action == "create":
            answer = admin.put_stream(c.stream, _sent(c.spec), create_only=True)
        elif c.kind == "stream" and c.action == "change":
            answer = admin.put_stream(c.stream, _sent(c.spec), if_match=c.revision)
        elif c.kind == "stream":
            answer = admin.delete_stream(c.stream, if_match=c.revision)
        elif c.action == "create":
            assert c.group is not None
            answer = admin.put_group(c.stream, c.group, c.spec, create_only=True)
        elif c.action == "change":
            assert c.group is not None
            answer = admin.put_group(c.stream, c.group, c.spec, if_match=c.revision)
        else:
            assert c.group is not None
            answer = admin.delete_group(c.stream, c.group, if_match=c.revision)
        done.append(f"{c.line()}  (request {answer.request_id})")
        if report is not None:
            report(done[-1])
    return done


def _as_json(change: Change) -> dict[str, Any]:
    return {
        "action": change.action,
        "kind": change.kind,
        "stream": change.stream,
        "group": change.group,
        "spec": dict(change.spec),
        "fields": {k: {"from": a, "to": b} for k, (a, b) in change.fields.items()},
        "problem": change.problem,
    }


def summary(changes: Sequence[Change]) -> str:
    counts = {a: sum(c.action == a for c in changes) for a in ("create", "change", "delete")}
    return f"Plan: {counts['create']} to create, {counts['change']} to change, {counts['delete']} to delete."


def run(
    admin: AdminClient,
    files: Sequence[str],
    *,
    dry_run: bool,
    prune: bool,
    prune_streams: bool,
    output: str = "table",
) -> int:
    """Print the plan (and apply it unless `dry_run`); the exit code."""
    desired = load(files)
    changes = plan(admin, desired, prune, prune_streams)
    if output == "json":
        return _run_json(admin, changes, dry_run)
    if not changes:
        click.echo("No changes: the coordinator matches the files.")
        return 0
    for change in changes:
        click.echo(change.line())
    click.echo(summary(changes))
    if any(c.problem for c in changes):
        click.echo("Some changes cannot be made (marked !).", err=True)
        return 1
    if dry_run:
        return 2
    applied: list[str] = []

    def report(line: str) -> None:
        applied.append(line)
        click.echo(f"applied {line}")

    try:
        execute(admin, changes, report)
    except AdminError as exc:
        failed = changes[len(applied)]
        if exc.status == 412:
            click.echo(
                f"{failed.name} changed since the plan was read ({exc.message}): run it again", err=True
            )
        else:
            where = f" (request {exc.request_id})" if exc.request_id else ""
            click.echo(f"refused: {failed.line()}: {exc}{where}", err=True)
        click.echo(f"Applied {len(applied)} of {len(changes)} changes before the error.", err=True)
        return 1
    click.echo("Apply complete.")
    return 0


def _run_json(admin: AdminClient, changes: Sequence[Change], dry_run: bool) -> int:
    """`-o json`: one JSON document on stdout, the plan, each change with `applied` (and its
    `requestId`) once applied; what went wrong goes to stderr. Exit codes as in text."""
    out = [_as_json(c) for c in changes]
    code = 2 if changes else 0
    if any(c.problem for c in changes):
        click.echo("Some changes cannot be made (see problem).", err=True)
        code = 1
    elif changes and not dry_run:
        code = 0
        for item in out:
            item["applied"] = False
        for item, change in zip(out, changes, strict=True):
            try:
                (line,) = execute(admin, [change])
            except AdminError as exc:
                click.echo(f"refused: {change.line()}: {exc}", err=True)
                code = 1
                break
            item["applied"], item["requestId"] = True, line.rsplit("(request ", 1)[-1].rstrip(")")
    click.echo(json.dumps(out, indent=2, sort_keys=True))
    return code
