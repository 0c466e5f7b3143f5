"""`terraform-provider-rsc`: a Terraform provider for rsc streams and groups (the `tf` package).

Resources `rsc_stream` and `rsc_group`, data source `rsc_stream_layout`. Everything goes
through `rsc.client.admin_api.AdminClient`, so the provider drives exactly the Admin API (each
change audited as the admin). Install with `pip install 'rsc[terraform]'` and point a
Terraform CLI config's `dev_overrides` at the directory holding the `terraform-provider-rsc`
script (docs/operations.md, "Terraform").

Drift: `read` returns what the coordinator holds, so a change made through the API or the
CLI shows in `terraform plan`; a stream or group deleted meanwhile is planned for creation.
Nothing may be written to stdout here: it carries the plugin handshake.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from tf import schema, types
from tf.iface import (
    Config,
    CreateContext,
    DataSource,
    DeleteContext,
    ImportContext,
    Provider,
    ReadContext,
    ReadDataContext,
    Resource,
    State,
    UpdateContext,
)
from tf.runner import run_provider
from tf.utils import Diagnostics

from rsc.client.admin_api import AdminClient, AdminError
from rsc.events.model import MAX_STATIC_HOLD_MS
from rsc.events.retention import MAX_ENTRIES, MAX_RETENTION_MS

SOURCE = "registry.terraform.io/rsc/rsc"


class RscProvider(Provider):  # type: ignore[misc]  # tf ships no types
    """Provider settings: `url`, `user`, `password` (each falling back to the environment)."""

    def __init__(self) -> None:
        self.settings: dict[str, Any] = {}

    def full_name(self) -> str:
        return SOURCE

    def get_model_prefix(self) -> str:
        return "rsc_"

    def get_provider_schema(self, diags: Diagnostics) -> schema.Schema:
        return schema.Schema(
            attributes=[
                schema.Attribute(
                    "url", types.String(), optional=True, description="Coordinator URL [RSC_COORDINATOR_URL]"
                ),
                schema.Attribute(
                    "user", types.String(), optional=True, description="Admin user [RSC_ADMIN_USER]"
                ),
                schema.Attribute(
                    "password",
                    types.String(),
                    optional=True,
                    sensitive=True,
                    description="Admin password [RSC_ADMIN_PASSWORD, or a netrc entry]",
                ),
            ]
        )

    def validate_config(self, diags: Diagnostics, config: Config) -> None:
        url = config.get("url")
        if isinstance(url, str) and not url.startswith(("http://", "https://")):
            diags.add_error("url must be an http:// or https:// URL", f"got {url!r}", path=["url"])

    def configure_provider(self, diags: Diagnostics, config: Config) -> None:
        self.settings = {k: v for k, v in config.items() if isinstance(v, str)}

    def admin(self) -> AdminClient:
        return AdminClient(self.settings.get("url"), self.settings.get("user"), self.settings.get("password"))

    def get_resources(self) -> list[type[Resource]]:
        return [Stream, Group]

    def get_data_sources(self) -> list[type[DataSource]]:
        return [StreamLayout]


def _call(ctx: Any, what: str, work: Callable[[AdminClient], State | None], provider: RscProvider) -> Any:
    """Run `work`; the coordinator's refusal becomes a Terraform error naming its code."""
    try:
        with provider.admin() as admin:
            return work(admin)
    except AdminError as exc:
        request = f" (request {exc.request_id})" if exc.request_id else ""
        ctx.diagnostics.add_error(f"{what}: {exc.code}", f"{exc.message}{request}")
        return None


#: What each attribute may hold (the Admin API's ranges), checked at plan time.
RULES: dict[str, tuple[int, int] | tuple[str, ...]] = {
    "shard_count": (0, 16_384),
    "max_concurrency": (1, 1_024),
    "reshard_mode": ("online", "quiesce"),
    "start_from": ("earliest", "latest"),
    "static_hold_ms": (0, MAX_STATIC_HOLD_MS),
    "retention_keep": ("acknowledged", "all"),
    "retention_max_age_ms": (1, MAX_RETENTION_MS),
    "retention_max_entries_per_shard": (1, MAX_ENTRIES),
    "retention_when_full": ("drop-oldest", "refuse"),
    "retention_inactive_group_ms": (1, MAX_RETENTION_MS),
    "retention_dead_letter_max_entries": (1, MAX_ENTRIES),
}
#: `rsc_stream`'s retention attributes -> the policy's wire fields (feature level 5). Each is
#: managed only when set: one left unset is neither sent nor read back (the stream's own value
#: stays, and no drift is shown for it); a policy sent has the others at their defaults.
RETENTION_ATTRIBUTES = {
    "retention_keep": "keep",
    "retention_max_age_ms": "maxAgeMs",
    "retention_max_entries_per_shard": "maxEntriesPerShard",
    "retention_when_full": "whenFull",
    "retention_inactive_group_ms": "inactiveGroupMs",
    "retention_dead_letter_max_entries": "deadLetterMaxEntries",
}


def _validate(diags: Diagnostics, config: Config) -> None:
    """Refuse values the coordinator would refuse, at `terraform plan`, naming the attribute
    (values not known yet, `tf.types.Unknown`, are checked at apply by the coordinator)."""
    for name, rule in RULES.items():
        value = config.get(name)
        if value is None or not isinstance(value, int | float | str) or isinstance(value, bool):
            continue
        if isinstance(rule[0], int):
            low, high = rule
            if not isinstance(value, int | float) or value != int(value) or not low <= value <= high:
                diags.add_error(
                    f"{name} must be an integer from {low} to {high}", f"got {value!r}", path=[name]
                )
        elif value not in rule:
            choices = ", ".join(map(repr, rule))
            diags.add_error(f"{name} must be one of {choices}", f"got {value!r}", path=[name])


def _missing(read: Callable[[], Any]) -> Any:
    """`read()`, or None when the coordinator says 404."""
    try:
        return read()
    except AdminError as exc:
        if exc.status == 404:
            return None
        raise


class Stream(Resource):  # type: ignore[misc]  # tf ships no types
    """`rsc_stream`: a stream's spec. `name` is its id; changing it replaces the stream."""

    def __init__(self, provider: RscProvider) -> None:
        self.provider = provider

    def validate(self, diags: Diagnostics, type_name: str, config: Config) -> None:
        _validate(diags, config)

    @classmethod
    def get_name(cls) -> str:
        return "stream"

    @classmethod
    def get_schema(cls) -> schema.Schema:
        return schema.Schema(
            version=1,
            attributes=[
                schema.Attribute("id", types.String(), computed=True),
                schema.Attribute("name", types.String(), required=True, requires_replace=True),
                schema.Attribute("shard_count", types.Number(), required=True, description="ACTIVE shards"),
                schema.Attribute(
                    "reshard_mode",
                    types.String(),
                    optional=True,
                    computed=True,
                    default="online",
                    description="online or quiesce",
                ),
                *(
                    schema.Attribute(
                        attribute,
                        types.String() if field in ("keep", "whenFull") else types.Number(),
                        optional=True,
                        description=f"retention.{field} (feature level 5; unset: not managed)",
                    )
                    for attribute, field in RETENTION_ATTRIBUTES.items()
                ),
            ],
        )

    @staticmethod
    def _state(name: str, spec: dict[str, Any], managed: State | None = None) -> State:
        """The state of `spec`; the retention attributes `managed` sets are read back."""
        retention = spec.get("retention") or {}
        state: State = {
            "id": name,
            "name": name,
            "shard_count": spec["shardCount"],
            "reshard_mode": spec["reshardMode"],
        }
        for attribute, field in RETENTION_ATTRIBUTES.items():
            given = managed is not None and managed.get(attribute) is not None
            state[attribute] = retention.get(field) if given else None
        return state

    @staticmethod
    def _spec(planned: State) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "shardCount": int(planned["shard_count"]),
            "reshardMode": planned["reshard_mode"] or "online",
        }
        retention = {
            field: value if isinstance(value, str) else int(value)
            for attribute, field in RETENTION_ATTRIBUTES.items()
            if (value := planned.get(attribute)) is not None
        }
        if retention:
            spec["retention"] = retention
        return spec

    def create(self, ctx: CreateContext, planned: State) -> State | None:
        name = planned["name"]

        def work(admin: AdminClient) -> State | None:
            if _missing(lambda: admin.stream(name)) is not None:
                ctx.diagnostics.add_error(
                    f"stream {name} already exists", f"import it: terraform import rsc_stream.<label> {name}"
                )
                return None
            answer = admin.put_stream(name, self._spec(planned), create_only=True)
            return self._state(name, answer.body["spec"], planned)

        return _call(ctx, f"creating stream {name}", work, self.provider)

    def read(self, ctx: ReadContext, current: State) -> State | None:
        name = current["name"] or current["id"]

        def work(admin: AdminClient) -> State | None:
            found = _missing(lambda: admin.stream(name))
            return None if found is None else self._state(name, found.body["spec"], current)

        return _call(ctx, f"reading stream {name}", work, self.provider)

    def update(self, ctx: UpdateContext, current: State, planned: State) -> State | None:
        name = planned["name"]

        def work(admin: AdminClient) -> State | None:
            found = admin.stream(name)
            now = self._state(name, found.body["spec"], current)
            if _changed_since_plan(ctx, f"stream {name}", current, now):
                return None
            # A change made between this read and the write is refused too (412).
            answer = admin.put_stream(name, self._spec(planned), found.revision)
            return self._state(name, answer.body["spec"], planned)

        return _call(ctx, f"updating stream {name}", work, self.provider)

    def delete(self, ctx: DeleteContext, current: State) -> None:
        name = current["name"]

        def work(admin: AdminClient) -> None:
            if _missing(lambda: admin.delete_stream(name)) is None:
                return  # gone already

        _call(ctx, f"deleting stream {name}", work, self.provider)

    def import_(self, ctx: ImportContext, id: str) -> State | None:
        def work(admin: AdminClient) -> State | None:
            found = _missing(lambda: admin.stream(id))
            if found is None:
                ctx.diagnostics.add_error(f"no stream {id}", "the coordinator has no such stream")
                return None
            return self._state(id, found.body["spec"])

        return _call(ctx, f"importing stream {id}", work, self.provider)


def _changed_since_plan(ctx: UpdateContext, what: str, planned_from: State, now: State) -> bool:
    """True (with an error) if the resource changed after the plan was made: applying the plan
    would overwrite a change nobody has seen in a plan."""
    changed = sorted(k for k in now if k in planned_from and now[k] != planned_from[k])
    if changed:
        ctx.diagnostics.add_error(
            f"{what} changed since the plan was made ({', '.join(changed)})",
            "run terraform plan again to see the change, then apply",
        )
    return bool(changed)


class Group(Resource):  # type: ignore[misc]  # tf ships no types
    """`rsc_group`: a consumer group's spec; id `<stream>/<group>`. `start_from` applies when
    the group is created: changing it replaces the group (its Redis consumer groups restart)."""

    def __init__(self, provider: RscProvider) -> None:
        self.provider = provider

    def validate(self, diags: Diagnostics, type_name: str, config: Config) -> None:
        _validate(diags, config)

    @classmethod
    def get_name(cls) -> str:
        return "group"

    @classmethod
    def get_schema(cls) -> schema.Schema:
        return schema.Schema(
            version=1,
            attributes=[
                schema.Attribute("id", types.String(), computed=True),
                schema.Attribute("stream", types.String(), required=True, requires_replace=True),
                schema.Attribute("name", types.String(), required=True, requires_replace=True),
                schema.Attribute("max_concurrency", types.Number(), optional=True, computed=True, default=1),
                schema.Attribute(
                    "start_from",
                    types.String(),
                    optional=True,
                    computed=True,
                    default="earliest",
                    requires_replace=True,
                    description="earliest or latest: where the group starts reading, when created",
                ),
                schema.Attribute(
                    "static_hold_ms",
                    types.Number(),
                    optional=True,
                    computed=True,
                    default=None,
                    description="how long a static member's shards wait for it (null: one lease; level 4)",
                ),
            ],
        )

    @staticmethod
    def _state(stream: str, name: str, spec: dict[str, Any]) -> State:
        return {
            "id": f"{stream}/{name}",
            "stream": stream,
            "name": name,
            "max_concurrency": spec["maxConcurrency"],
            "start_from": spec["startFrom"],
            "static_hold_ms": spec.get("staticHoldMs"),
        }

    @staticmethod
    def _spec(planned: State) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "maxConcurrency": int(planned["max_concurrency"] or 1),
            "startFrom": planned["start_from"] or "earliest",
        }
        hold = planned.get("static_hold_ms")
        if isinstance(hold, int | float) and not isinstance(hold, bool):
            spec["staticHoldMs"] = int(hold)  # left out: the coordinator's default
        return spec

    def create(self, ctx: CreateContext, planned: State) -> State | None:
        stream, name = planned["stream"], planned["name"]

        def work(admin: AdminClient) -> State | None:
            if _missing(lambda: admin.group(stream, name)) is not None:
                ctx.diagnostics.add_error(
                    f"group {stream}/{name} already exists",
                    f"import it: terraform import rsc_group.<label> {stream}/{name}",
                )
                return None
            answer = admin.put_group(stream, name, self._spec(planned), create_only=True)
            return self._state(stream, name, answer.body["spec"])

        return _call(ctx, f"creating group {stream}/{name}", work, self.provider)

    def read(self, ctx: ReadContext, current: State) -> State | None:
        stream, name = current["stream"], current["name"]

        def work(admin: AdminClient) -> State | None:
            found = _missing(lambda: admin.group(stream, name))
            return None if found is None else self._state(stream, name, found.body["spec"])

        return _call(ctx, f"reading group {stream}/{name}", work, self.provider)

    def update(self, ctx: UpdateContext, current: State, planned: State) -> State | None:
        stream, name = planned["stream"], planned["name"]

        def work(admin: AdminClient) -> State | None:
            found = admin.group(stream, name)
            now = self._state(stream, name, found.body["spec"])
            if _changed_since_plan(ctx, f"group {stream}/{name}", current, now):
                return None
            answer = admin.put_group(stream, name, self._spec(planned), found.revision)
            return self._state(stream, name, answer.body["spec"])

        return _call(ctx, f"updating group {stream}/{name}", work, self.provider)

    def delete(self, ctx: DeleteContext, current: State) -> None:
        stream, name = current["stream"], current["name"]

        def work(admin: AdminClient) -> None:
            _missing(lambda: admin.delete_group(stream, name))

        _call(ctx, f"deleting group {stream}/{name}", work, self.provider)

    def import_(self, ctx: ImportContext, id: str) -> State | None:
        stream, _, name = id.partition("/")
        if not stream or not name:
            ctx.diagnostics.add_error(f"bad group id {id!r}", "import takes <stream>/<group>")
            return None

        def work(admin: AdminClient) -> State | None:
            found = _missing(lambda: admin.group(stream, name))
            if found is None:
                ctx.diagnostics.add_error(f"no group {id}", "the coordinator has no such group")
                return None
            return self._state(stream, name, found.body["spec"])

        return _call(ctx, f"importing group {id}", work, self.provider)


class StreamLayout(DataSource):  # type: ignore[misc]  # tf ships no types
    """`data.rsc_stream_layout`: a stream's routing metadata (what producers route with)."""

    def __init__(self, provider: RscProvider) -> None:
        self.provider = provider

    @classmethod
    def get_name(cls) -> str:
        return "stream_layout"

    @classmethod
    def get_schema(cls) -> schema.Schema:
        return schema.Schema(
            attributes=[
                schema.Attribute("name", types.String(), required=True),
                schema.Attribute("metadata_version", types.Number(), computed=True),
                schema.Attribute("routing", types.String(), computed=True),
                schema.Attribute("shard_count", types.Number(), computed=True),
                schema.Attribute("shard_keys", types.List(types.String()), computed=True),
            ]
        )

    def read(self, ctx: ReadDataContext, config: Config) -> State | None:
        name = config["name"]

        def work(admin: AdminClient) -> State | None:
            layout = admin.request("GET", f"/v1/streams/{name}/routing").body
            return {
                "name": name,
                "metadata_version": layout["metadataVersion"],
                "routing": layout["routing"],
                "shard_count": layout["shardCount"],
                "shard_keys": [s["key"] for s in layout["shards"]],
            }

        return _call(ctx, f"reading the layout of {name}", work, self.provider)


def main() -> None:
    run_provider(RscProvider(), sys.argv)
