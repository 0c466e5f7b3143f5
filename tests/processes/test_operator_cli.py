"""The operator tools against a real coordinator: the `rsc` admin commands and `rsc apply`.

The commands run in-process (click's runner, in a thread while the coordinator serves on
the trio loop) with the URL and password in the environment, as an operator runs them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import httpx
import pytest
import redis as redis_py
import trio
from click.testing import CliRunner, Result

from rsc.cli import main as rsc_main
from rsc.client.admin_api import AdminClient, AdminError
from rsc.tools import apply as applying
from tests.httpkit import FAST, beat, hb, serve_on

AUTH = ("admin", "s3cret")


@pytest.fixture
async def http(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = attrs.evolve(FAST, redis_url=standalone_url, admin_password="s3cret")
    async with serve_on(settings) as client:
        yield client


async def rsc(http: httpx.AsyncClient, *args: str, password: str = "s3cret") -> Result:
    env = {
        "RSC_COORDINATOR_URL": str(http.base_url),
        "RSC_ADMIN_PASSWORD": password,
        "RSC_NETRC": "/nonexistent",
    }
    runner = CliRunner()
    return await trio.to_thread.run_sync(
        lambda: runner.invoke(rsc_main, list(args), env=env, catch_exceptions=False)
    )


def normalized(text: str) -> str:
    """Request ids, times and lease countdowns vary from run to run."""
    text = re.sub(r"request [0-9a-f-]{8,}", "request <id>", text)
    text = re.sub(r"at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", "at <time>", text)
    return re.sub(r"\d+\.\ds\b", "<s>", text)


async def test_streams_create_describe_scale_and_delete(
    http: httpx.AsyncClient, prefix: str, standalone_url: str
) -> None:
    created = await rsc(http, "streams", "create", prefix, "--shards", "2")
    assert created.exit_code == 0, created.output
    lines = normalized(created.output).splitlines()
    assert lines[0] == f"stream {prefix}: 2 shard(s), reshardMode online"
    assert lines[1] == "request <id>"
    assert lines[2].startswith(
        f"audit: PUT /v1/admin/streams/{prefix} -> 200 ok by admin at <time> (revision "
    )
    checker = redis_py.Redis.from_url(standalone_url, decode_responses=True)
    keys = [s["key"] for s in (await http.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]
    for n in range(3):
        checker.xadd(keys[0], {"n": str(n)})
    checker.close()
    described = await rsc(http, "streams", "describe", prefix)
    assert described.exit_code == 0, described.output
    assert described.output == (
        f"stream {prefix}: 2 ACTIVE shard(s), layout v1, reshardMode online\n"
        "\n"
        "SHARD  STATE   KEY" + " " * (len(keys[0]) - 3) + "  LENGTH  NODE\n"
        f"    0  ACTIVE  {keys[0]}       3  -\n"
        f"    1  ACTIVE  {keys[1]}       0  -\n"
    )
    listed = await rsc(http, "streams", "list", "-o", "json")
    mine = [s for s in json.loads(listed.output) if s["streamPrefix"] == prefix]
    assert mine == [{"streamPrefix": prefix, "metadataVersion": 1, "shardCount": 2, "groups": []}]
    scaled = await rsc(http, "streams", "scale", prefix, "3")
    assert scaled.exit_code == 0, scaled.output
    assert scaled.output.splitlines()[0] == f"stream {prefix}: target 3 shard(s), migration 1 DONE"
    stale = await rsc(http, "streams", "scale", prefix, "4", "--if-match", "1")
    assert stale.exit_code == 1
    assert "412 PRECONDITION_FAILED" in stale.output
    deleted = await rsc(http, "streams", "delete", prefix)
    assert deleted.exit_code == 0, deleted.output
    missing = await rsc(http, "streams", "describe", prefix)
    assert missing.exit_code == 1
    assert "404 UNKNOWN_STREAM" in missing.output


async def test_describe_shows_owners_members_migration_and_producers(
    http: httpx.AsyncClient, prefix: str
) -> None:
    await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)
    a = await beat(http, hb(prefix, "a", 0))
    assert a["assignment"]["assigned"] == [0, 1]
    producer = {"protocolVersion": 2, "streamPrefix": prefix, "producerId": "p1", "metadataVersion": 1}
    assert (await http.post("/v1/producers/heartbeat", json=producer)).status_code == 200
    await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 1}, auth=AUTH)
    out = normalized((await rsc(http, "streams", "describe", prefix)).output)
    assert (
        out.splitlines()[0]
        == f"stream {prefix}: 1 ACTIVE shard(s), 1 DRAINING, layout v2, reshardMode online"
    )
    assert "group billing: epoch" in out
    assert re.search(r"\n\s*0  ACTIVE\s+a\s+0\s+0\s+0  -\n\s*1  DRAINING\s+a\s+0\s+0\s+0  -\n", out), out
    assert re.search(r"\na\s+\d+  [A-Z]+\s+<s>\s+0,1\n", out), out
    assert "migration 1 (online, 2 -> 1 shards): SWITCHING" in out
    assert "waiting for producers: p1" in out
    assert "  shard 1 DRAINING: drained, producers not on the layout: p1\n" in out, out  # why it stays
    assert re.search(r"\np1\s+1  no\s+no\n", out), out
    members = json.loads((await rsc(http, "members", "list", prefix, "billing", "-o", "json")).output)
    assert [m["memberId"] for m in members] == ["a"]
    producers = (await rsc(http, "producers", "list", prefix)).output
    assert producers.splitlines()[0].split() == [
        "PRODUCER",
        "VERSION",
        "UP",
        "TO",
        "DATE",
        "QUIESCED",
        "LEASE",
        "LEFT",
    ]
    groups = (await rsc(http, "groups", "list", prefix)).output
    assert groups.splitlines()[1].split()[:3] == ["billing", str(a["groupEpoch"] + 1), "1"]  # + the layout


async def test_groups_set_pause_resume_and_the_audit_trail(http: httpx.AsyncClient, prefix: str) -> None:
    await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)
    typo = await rsc(http, "groups", "set", prefix, "billng", "--max-concurrency", "2")
    assert (typo.exit_code, typo.output) == (
        1,
        f"Error: there is no group 'billng' of '{prefix}' (`rsc groups create` makes one)\n",
    )
    made = await rsc(http, "groups", "create", prefix, "billing", "--start-from", "latest")
    assert made.exit_code == 0, made.output
    assert made.output.splitlines()[0] == f"group billing of {prefix}: maxConcurrency 1, startFrom latest"
    again = await rsc(http, "groups", "create", prefix, "billing")
    assert again.exit_code == 1
    assert "exists: `rsc groups set` changes it" in again.output
    changed = await rsc(http, "groups", "set", prefix, "billing", "--max-concurrency", "4")
    assert "maxConcurrency 4, startFrom latest" in changed.output  # the other field stays
    immutable = await rsc(http, "groups", "set", prefix, "billing", "--start-from", "earliest")
    assert immutable.exit_code == 1
    assert "409 IMMUTABLE_FIELD" in immutable.output
    for command in ("pause", "resume"):
        done = await rsc(http, "streams", command, prefix)
        assert done.exit_code == 0, done.output
    paused = await rsc(http, "groups", "pause", prefix, "billing", "--reason", "downstream down")
    assert paused.output.splitlines()[0] == f"group billing of {prefix}: paused", paused.output
    described = await rsc(http, "groups", "describe", prefix, "billing")
    assert "PAUSED: downstream down" in described.output
    resumed = await rsc(http, "groups", "resume", prefix, "billing")
    assert resumed.output.splitlines()[0] == f"group billing of {prefix}: resumed", resumed.output
    trail = await rsc(http, "audit", "--path-prefix", f"/v1/admin/streams/{prefix}", "--limit", "20")
    lines = trail.output.splitlines()
    assert [line.split()[1:4] for line in lines] == [
        ["ok", "200", "PUT"],
        ["rejected", "412", "PATCH"],  # the misspelt group: nothing made
        ["ok", "200", "PUT"],
        ["rejected", "412", "PUT"],  # created already
        ["ok", "200", "PATCH"],
        ["rejected", "409", "PATCH"],
        ["ok", "200", "POST"],
        ["ok", "200", "POST"],
        ["ok", "200", "POST"],  # the group paused
        ["ok", "200", "POST"],  # and resumed
    ]
    assert lines[-1].endswith(tuple("0123456789"))  # a revision
    wrong = await rsc(http, "audit", password="nope")
    assert wrong.exit_code == 1
    assert "401 UNAUTHENTICATED" in wrong.output


async def test_audit_follow_prints_new_records_as_they_come(http: httpx.AsyncClient, prefix: str) -> None:
    env = {"RSC_COORDINATOR_URL": str(http.base_url), "RSC_ADMIN_PASSWORD": "s3cret"}
    command = [
        "rsc",
        "audit",
        "--follow",
        "--interval",
        "0.2",
        "--path-prefix",
        f"/v1/admin/streams/{prefix}",
    ]
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            lambda task_status: trio.run_process(
                [_venv_bin("rsc"), *command[1:]],
                env={**_environ(), **env},
                stdout=subprocess.PIPE,
                check=False,
                task_status=task_status,
            )
        )
        await trio.sleep(1.0)
        await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 1}, auth=AUTH)
        seen = b""
        with trio.fail_after(10):
            assert process.stdout is not None
            while f"/v1/admin/streams/{prefix}".encode() not in seen:
                seen += await process.stdout.receive_some(4096)
        process.terminate()
    assert b" ok        200 PUT" in seen


def _venv_bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def _environ() -> dict[str, str]:
    return dict(os.environ)


# --- rsc apply ------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


async def apply(http: httpx.AsyncClient, *args: str) -> Result:
    return await rsc(http, *args)


def spec_file(
    tmp_path: Path, prefix: str, shards: int = 2, concurrency: int = 2, name: str = "rsc.toml"
) -> str:
    return write(
        tmp_path,
        name,
        f"""
[[streams]]
name = "{prefix}"
shardCount = {shards}

[[streams.groups]]
name = "billing"
maxConcurrency = {concurrency}

[[streams.groups]]
name = "audit"
startFrom = "latest"
""",
    )


async def test_apply_plans_applies_is_idempotent_and_sees_drift(
    http: httpx.AsyncClient, prefix: str, tmp_path: Path
) -> None:
    path = spec_file(tmp_path, prefix)
    diff = await apply(http, "diff", "-f", path)
    assert diff.exit_code == 2, diff.output
    assert diff.output == (
        f"+ stream {prefix} (shardCount 2, reshardMode online)\n"
        f"+ group {prefix}/audit (maxConcurrency 1, startFrom latest)\n"
        f"+ group {prefix}/billing (maxConcurrency 2, startFrom earliest)\n"
        "Plan: 3 to create, 0 to change, 0 to delete.\n"
    )
    assert (
        await http.get(f"/v1/admin/streams/{prefix}", auth=AUTH)
    ).status_code == 404  # diff changes nothing
    dry = await apply(http, "apply", "-f", path, "--dry-run")
    assert dry.exit_code == 2
    done = await apply(http, "apply", "-f", path)
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[-1] == "Apply complete."
    again = await apply(http, "apply", "-f", path)
    assert (again.exit_code, again.output) == (0, "No changes: the coordinator matches the files.\n")
    assert (await apply(http, "diff", "-f", path)).exit_code == 0
    # Drift: a change made through the API shows in the next plan, and apply undoes it.
    await http.patch(f"/v1/admin/streams/{prefix}/groups/billing", json={"maxConcurrency": 7}, auth=AUTH)
    drift = await apply(http, "diff", "-f", path)
    assert (drift.exit_code, drift.output.splitlines()[0]) == (
        2,
        f"~ group {prefix}/billing: maxConcurrency 7 -> 2",
    )
    assert (await apply(http, "apply", "-f", path)).exit_code == 0
    spec = (await http.get(f"/v1/admin/streams/{prefix}/groups/billing", auth=AUTH)).json()["spec"]
    assert spec["maxConcurrency"] == 2
    # A static hold set elsewhere is drift too: the file's group is a whole spec (default hold).
    await http.patch(f"/v1/admin/streams/{prefix}/groups/billing", json={"staticHoldMs": 30000}, auth=AUTH)
    held = await apply(http, "diff", "-f", path)
    assert held.output.splitlines()[0] == f"~ group {prefix}/billing: staticHoldMs 30000 -> default"
    assert (await apply(http, "apply", "-f", path)).exit_code == 0
    spec = (await http.get(f"/v1/admin/streams/{prefix}/groups/billing", auth=AUTH)).json()["spec"]
    assert "staticHoldMs" not in spec
    # Scaling is a change of the file.
    bigger = spec_file(tmp_path, prefix, shards=4, name="bigger.toml")
    scaled = await apply(http, "apply", "-f", bigger)
    assert scaled.output.splitlines()[0] == f"~ stream {prefix}: shardCount 2 -> 4"
    assert (await http.get(f"/v1/streams/{prefix}")).json()["shardCount"] == 4


async def test_apply_sets_a_retention_policy_sees_its_drift_and_leaves_it_when_left_out(
    http: httpx.AsyncClient, prefix: str, tmp_path: Path
) -> None:
    stream = f"/v1/admin/streams/{prefix}"
    await http.put(stream, json={"shardCount": 2, "retention": {"keep": "all"}}, auth=AUTH)
    # a file without retention leaves the stream's policy as it is: no change
    assert (await apply(http, "diff", "-f", spec_file(tmp_path, prefix))).output.startswith("+ group")
    text = f'[[streams]]\nname = "{prefix}"\nshardCount = 2\nretention = {{ maxAgeMs = 60000 }}\n'
    path = write(tmp_path, "retention.toml", text)
    diff = await apply(http, "diff", "-f", path)
    assert diff.exit_code == 2, diff.output
    assert diff.output.splitlines()[0].startswith(f"~ stream {prefix}: retention ")
    assert (await apply(http, "apply", "-f", path)).exit_code == 0
    policy = (await http.get(stream, auth=AUTH)).json()["spec"]["retention"]
    assert (policy["keep"], policy["maxAgeMs"]) == ("acknowledged", 60000)  # the rest: defaults
    assert (await apply(http, "diff", "-f", path)).exit_code == 0
    await http.patch(stream, json={"retention": {"maxAgeMs": 5}}, auth=AUTH)
    assert (await apply(http, "diff", "-f", path)).exit_code == 2  # drift
    assert (await apply(http, "apply", "-f", path)).exit_code == 0
    assert (await http.get(stream, auth=AUTH)).json()["spec"]["retention"]["maxAgeMs"] == 60000
    for bad, said in [
        ("maxAgeMs = 0", "maxAgeMs"),
        ("maxAge = 5", "did you mean 'maxAgeMs'"),
        ('keep = "x"', "keep"),
    ]:
        text = f'[[streams]]\nname = "{prefix}"\nshardCount = 2\nretention = {{ {bad} }}\n'
        refused = await apply(http, "diff", "-f", write(tmp_path, "bad.toml", text))
        assert refused.exit_code == 1, refused.output
        assert said in refused.output, refused.output


async def test_apply_prunes_only_when_asked_and_reads_yaml(
    http: httpx.AsyncClient, prefix: str, tmp_path: Path
) -> None:
    assert (await apply(http, "apply", "-f", spec_file(tmp_path, prefix))).exit_code == 0
    only_billing = write(
        tmp_path,
        "rsc.yaml",
        f"streams:\n  - name: {prefix}\n    shardCount: 2\n"
        "    groups:\n      - name: billing\n        maxConcurrency: 2\n",
    )
    assert (await apply(http, "diff", "-f", only_billing)).exit_code == 0  # audit is not pruned
    pruned = await apply(http, "diff", "-f", only_billing, "--prune")
    assert (pruned.exit_code, pruned.output.splitlines()[0]) == (2, f"- group {prefix}/audit")
    assert (await apply(http, "apply", "-f", only_billing, "--prune")).exit_code == 0
    assert (await http.get(f"/v1/admin/streams/{prefix}/groups/audit", auth=AUTH)).status_code == 404


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[streams]]\nname = "x"\nshardCont = 2\n', "did you mean 'shardCount'"),
        ('[[streams]]\nname = "x"\n', "shardCount is required"),
        ("[[streams]\n", "not valid TOML"),
        (
            '[[streams]]\nname = "x"\nshardCount = 1\n[[streams.groups]]\nname = "g"\nmaxConcurency = 2\n',
            "maxConcurrency",
        ),
        ('[[stream]]\nname = "x"\n', "did you mean 'streams'"),
        (
            '[[streams]]\nname = "x"\nshardCount = "6"\n',
            "shardCount must be an integer from 0 to 16384, not '6'",
        ),
        (
            '[[streams]]\nname = "x"\nshardCount = 1\n'
            '[[streams.groups]]\nname = "g"\nstartFrom = "begining"\n',
            "startFrom must be one of 'earliest', 'latest', not 'begining'",
        ),
        ('[[streams]]\nname = "x"\nshardCount = 1\nreshardMode = "quiesced"\n', "reshardMode must be one of"),
    ],
)
async def test_a_bad_file_is_an_error_naming_the_problem(
    http: httpx.AsyncClient, tmp_path: Path, text: str, message: str
) -> None:
    result = await apply(http, "diff", "-f", write(tmp_path, "bad.toml", text))
    assert result.exit_code == 1
    assert message in result.output


async def test_a_change_made_between_plan_and_apply_is_detected(
    http: httpx.AsyncClient, prefix: str, tmp_path: Path
) -> None:
    """`apply` sends If-Match of the revision its plan read: the concurrent change wins, apply
    says so and exits 1, and the next run plans again from what is there."""
    assert (await apply(http, "apply", "-f", spec_file(tmp_path, prefix))).exit_code == 0
    wanted = applying.load([spec_file(tmp_path, prefix, concurrency=5, name="five.toml")])

    def plan_then_race() -> int:
        with AdminClient(str(http.base_url), "admin", "s3cret") as admin:
            changes = applying.plan(admin, wanted)
            assert [c.line() for c in changes] == [f"~ group {prefix}/billing: maxConcurrency 2 -> 5"]
            admin.patch_group(prefix, "billing", {"maxConcurrency": 3})  # someone else, meanwhile
            with pytest.raises(AdminError) as refused:
                applying.execute(admin, changes)
            return refused.value.status

    assert await trio.to_thread.run_sync(plan_then_race) == 412
    spec = (await http.get(f"/v1/admin/streams/{prefix}/groups/billing", auth=AUTH)).json()["spec"]
    assert spec["maxConcurrency"] == 3


async def test_dead_letters_are_listed_shown_and_replayed(
    http: httpx.AsyncClient, prefix: str, standalone_url: str
) -> None:
    """Dead letters as the poller writes them (`<shard key>:dlq`: rscSourceId, rscDeliveries,
    then the entry's own fields); replay puts them back on their shard, atomically, once."""
    await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)
    keys = [s["key"] for s in (await http.get(f"/v1/streams/{prefix}/routing")).json()["shards"]]
    checker = redis_py.Redis.from_url(standalone_url, decode_responses=True)
    dead = [
        checker.xadd(f"{k}:dlq", {"rscSourceId": "1-1", "rscDeliveries": "5", "order": str(n)})
        for n, k in enumerate(keys)
    ]
    listed = await rsc(http, "dlq", "list", prefix)
    assert listed.exit_code == 0, listed.output
    assert [line.split() for line in listed.output.splitlines()] == [
        ["SHARD", "STATE", "DEAD-LETTER", "KEY", "ENTRIES"],
        ["0", "ACTIVE", f"{keys[0]}:dlq", "1"],
        ["1", "ACTIVE", f"{keys[1]}:dlq", "1"],
    ]
    shown = json.loads((await rsc(http, "dlq", "show", prefix, "--shard", "1", "-o", "json")).output)
    assert shown["entries"] == [
        {"shard": 1, "id": dead[1], "originalId": "1-1", "deliveries": 5, "fields": {"order": "1"}}
    ]
    await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 1}, auth=AUTH)  # shard 1 drains
    replayed = await rsc(http, "dlq", "replay", prefix, "-o", "json")
    assert replayed.exit_code == 0, replayed.output
    result = json.loads(replayed.output)["result"]
    assert (result["replayed"], result["skippedShards"]) == (1, [1])  # nothing goes to a draining shard
    [(shard, old, new)] = result["entries"]
    assert (shard, old) == (0, dead[0])
    assert checker.xrange(keys[0]) == [(new, {"order": "0"})]  # back on its shard, fields as they were
    assert checker.xlen(f"{keys[0]}:dlq") == 0
    again = json.loads((await rsc(http, "dlq", "replay", prefix, "--shard", "0", "-o", "json")).output)
    assert again["result"]["replayed"] == 0  # replayed once
    assert checker.xlen(f"{keys[1]}:dlq") == 1
    checker.close()


def test_credentials_come_from_arguments_then_environment_then_a_netrc_file(tmp_path: Path) -> None:
    from rsc.client.admin_api import credentials

    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("machine rsc.example login ops password from-netrc\n")
    netrc_file.chmod(0o600)
    env = {"RSC_NETRC": str(netrc_file)}
    url = "https://rsc.example:8080"
    assert credentials(url, environ=env) == ("ops", "from-netrc")
    assert credentials(url, environ={**env, "RSC_ADMIN_PASSWORD": "from-env"}) == ("admin", "from-env")
    assert credentials(url, "me", "given", environ=env) == ("me", "given")
    assert credentials("http://elsewhere:8080", environ=env) is None
    with pytest.raises(AdminError, match="http:// or https://"):
        AdminClient("127.0.0.1:8080")


async def test_streams_create_refuses_an_existing_stream_and_changes_nothing(
    http: httpx.AsyncClient, prefix: str
) -> None:
    """`create` sends `If-None-Match: *`: a second create (or one racing another) is refused
    and never reshards what is there."""
    assert (await rsc(http, "streams", "create", prefix, "--shards", "2")).exit_code == 0
    again = await rsc(http, "streams", "create", prefix, "--shards", "5")
    assert again.exit_code == 1
    assert f"stream {prefix!r} exists: `rsc streams scale` changes it" in again.output
    assert (await http.get(f"/v1/streams/{prefix}")).json()["shardCount"] == 2


async def test_apply_creates_only_what_its_plan_saw_missing(
    http: httpx.AsyncClient, prefix: str, tmp_path: Path
) -> None:
    """A stream created by someone else between plan and apply is not overwritten (412)."""
    wanted = applying.load([spec_file(tmp_path, prefix, shards=3)])

    def plan_then_race() -> int:
        with AdminClient(str(http.base_url), "admin", "s3cret") as admin:
            changes = applying.plan(admin, wanted)
            assert changes[0].line().startswith(f"+ stream {prefix} ")
            admin.put_stream(prefix, {"shardCount": 1})  # someone else, meanwhile
            with pytest.raises(AdminError) as refused:
                applying.execute(admin, changes)
            return refused.value.status

    assert await trio.to_thread.run_sync(plan_then_race) == 412
    assert (await http.get(f"/v1/streams/{prefix}")).json()["shardCount"] == 1


async def test_apply_json_output_is_one_document_with_what_was_applied(
    http: httpx.AsyncClient, prefix: str, tmp_path: Path
) -> None:
    path = spec_file(tmp_path, prefix)
    dry = await apply(http, "apply", "-f", path, "--dry-run", "-o", "json")
    assert dry.exit_code == 2, dry.output
    planned = json.loads(dry.output)
    assert [(c["kind"], c["action"]) for c in planned] == [
        ("stream", "create"),
        ("group", "create"),
        ("group", "create"),
    ]
    assert all("applied" not in c for c in planned)
    done = await apply(http, "apply", "-f", path, "-o", "json")
    assert done.exit_code == 0, done.output
    applied = json.loads(done.output)
    assert [c["applied"] for c in applied] == [True, True, True]
    assert all(re.fullmatch(r"[0-9a-f]{32}", c["requestId"]) for c in applied), applied
    again = await apply(http, "apply", "-f", path, "-o", "json")
    assert (again.exit_code, json.loads(again.output)) == (0, [])


@pytest.mark.parametrize("command", ["diff", "apply"])
async def test_a_usage_error_of_diff_or_apply_exits_1_never_2(http: httpx.AsyncClient, command: str) -> None:
    """Exit 2 means "the plan has changes" (as `terraform plan -detailed-exitcode`): a typo in
    the command line must not read as one in a pipeline."""
    result = await rsc(http, command, "--prnue", "-f", "x.toml")
    assert result.exit_code == 1, result.output
    assert "No such option '--prnue'" in result.output


def test_a_broken_netrc_file_is_an_error_not_a_silent_skip(tmp_path: Path) -> None:
    from rsc.client.admin_api import credentials

    broken = tmp_path / "netrc"
    broken.write_text("machin rsc.example login ops password x\n")  # a misspelt keyword
    broken.chmod(0o600)
    with pytest.raises(AdminError, match=r"cannot read credentials from .*netrc"):
        credentials("https://rsc.example:8080", environ={"RSC_NETRC": str(broken)})
    result = CliRunner().invoke(
        rsc_main,
        ["streams", "list", "--url", "http://127.0.0.1:9"],
        env={"RSC_NETRC": str(broken), "RSC_ADMIN_PASSWORD": ""},
    )
    assert result.exit_code == 1
    assert "cannot read credentials from" in result.output


def test_the_terraform_entry_point_says_what_to_install_without_the_extra() -> None:
    """Without `tf` (the `terraform` extra), the provider's command is one line and exit 2."""
    code = "import sys; sys.modules['tf'] = None; from rsc.tools.terraform_entry import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert done.stderr == "terraform-provider-rsc needs the tf framework: pip install 'rsc[terraform]'\n"


async def test_scale_of_a_misspelt_stream_is_an_error_not_a_new_stream(
    http: httpx.AsyncClient, prefix: str
) -> None:
    typo = await rsc(http, "streams", "scale", f"{prefix}x", "4")
    assert (typo.exit_code, typo.output) == (
        1,
        f"Error: there is no stream '{prefix}x' (`rsc streams create` makes one)\n",
    )
    assert (await http.get(f"/v1/streams/{prefix}x")).status_code == 404
    await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)
    scaled = await rsc(http, "streams", "scale", prefix, "3")
    assert scaled.exit_code == 0, scaled.output
    assert (await http.get(f"/v1/streams/{prefix}")).json()["shardCount"] == 3


async def test_groups_describe_lists_every_shard_the_group_reads_owned_or_not(
    http: httpx.AsyncClient, prefix: str
) -> None:
    await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)
    await http.put(f"/v1/admin/streams/{prefix}/groups/billing", json={"maxConcurrency": 2}, auth=AUTH)
    empty = await rsc(http, "groups", "describe", prefix, "billing")
    assert empty.exit_code == 0, empty.output
    assert re.search(r"SHARD  OWNER\n\s+0  -\n\s+1  -\n", empty.output), empty.output
    a = await beat(http, hb(prefix, "a", 0))
    await beat(http, hb(prefix, "a", a["memberEpoch"], ownedShards=a["assignment"]["assigned"]))
    owned = await rsc(http, "groups", "describe", prefix, "billing")
    assert re.search(r"SHARD  OWNER\n\s+0  a\n\s+1  a\n", owned.output), owned.output
    assert re.search(r"\na\s+\d+  STABLE", owned.output), owned.output


async def test_groups_set_the_static_hold(http: httpx.AsyncClient, prefix: str) -> None:
    """`--static-hold-ms` sets how long a static member's shards wait for it; a change of
    another field keeps it; the group view's config carries it."""
    await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)
    made = await rsc(http, "groups", "create", prefix, "billing", "--static-hold-ms", "30000")
    assert made.exit_code == 0, made.output
    assert "staticHoldMs 30000" in made.output
    changed = await rsc(http, "groups", "set", prefix, "billing", "--max-concurrency", "2")
    assert "maxConcurrency 2, startFrom earliest, staticHoldMs 30000" in changed.output
    view = (await http.get(f"/v1/streams/{prefix}/groups/billing")).json()
    assert view["config"]["staticHoldMs"] == 30000
    assert (await rsc(http, "groups", "set", prefix, "billing", "--static-hold-ms", "-2")).exit_code == 2
    spec = (await http.get(f"/v1/admin/streams/{prefix}/groups/billing", auth=AUTH)).json()["spec"]
    assert spec == {"maxConcurrency": 2, "startFrom": "earliest", "staticHoldMs": 30000}
    back = await rsc(http, "groups", "set", prefix, "billing", "--static-hold-ms", "-1")  # the default again
    assert back.exit_code == 0, back.output
    assert (
        "staticHoldMs"
        not in (await http.get(f"/v1/admin/streams/{prefix}/groups/billing", auth=AUTH)).json()["spec"]
    )
    too_long = await http.patch(
        f"/v1/admin/streams/{prefix}/groups/billing", json={"staticHoldMs": 3_600_001}, auth=AUTH
    )
    assert too_long.status_code == 400


async def test_members_remove_fences_a_live_member_and_ends_a_static_hold(
    http: httpx.AsyncClient, prefix: str
) -> None:
    """`rsc members remove`: DELETE .../members/{memberId} fences a live member (REMOVED, audited)
    and ends a static member's hold; an unknown member is 404 UNKNOWN_MEMBER."""
    await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)
    await http.put(f"/v1/admin/streams/{prefix}/groups/billing", json={}, auth=AUTH)
    member = "10.9.9.9/worker/0"
    joined = await http.post("/v1/heartbeat", json=hb(prefix, member, 0))
    assert joined.status_code == 200, joined.text
    removed = await rsc(http, "members", "remove", prefix, "billing", member)
    assert removed.exit_code == 0, removed.output
    told = await http.post("/v1/heartbeat", json=hb(prefix, member, joined.json()["memberEpoch"]))
    assert (told.json()["status"], told.json()["fenceReason"]) == ("FENCED", "REMOVED")
    unknown = await rsc(http, "members", "remove", prefix, "billing", "nobody/0")
    assert unknown.exit_code == 1
    assert "404 UNKNOWN_MEMBER" in unknown.output
    # a static member that left: its hold ends by hand
    static = "w-static/worker/0"
    first = (await http.post("/v1/heartbeat", json=hb(prefix, static, 0, static=True))).json()
    assert first["static"] is True
    await http.post("/v1/heartbeat", json=hb(prefix, static, -1, static=True))
    view = (await http.get(f"/v1/streams/{prefix}/groups/billing")).json()
    assert [h["memberId"] for h in view["holds"] if h["static"]] == [static]
    listed = await rsc(http, "members", "list", prefix, "billing")
    assert f"{static} (static)" in listed.output  # a held member is listed, HELD
    assert "HELD" in listed.output
    described = await rsc(http, "groups", "describe", prefix, "billing")
    assert f"(held for {static})" in described.output
    gone = await rsc(http, "members", "remove", prefix, "billing", static)
    assert gone.exit_code == 0
    assert "(revision None)" not in gone.output
    view = (await http.get(f"/v1/streams/{prefix}/groups/billing")).json()
    assert not [h for h in view["holds"] if h["static"]]
    trail = await rsc(http, "audit", "--path-prefix", f"/v1/admin/streams/{prefix}/groups", "--limit", "5")
    assert "DELETE" in trail.output


async def test_a_wrong_or_useless_admin_password_is_said_the_same_way_on_every_path(
    http: httpx.AsyncClient, standalone_url: str
) -> None:
    """The CLI reads views with the admin's Basic credentials: a wrong password there is said as
    the Admin API says it (not 'the credential in Authorization is not valid'), and against a
    coordinator without an admin password the answer is ADMIN_DISABLED, not a 401."""
    for args in (("streams", "list"), ("audit",)):
        wrong = await rsc(http, *args, password="nope")
        assert wrong.exit_code == 1
        assert "401 UNAUTHENTICATED: wrong user name or password" in wrong.output, wrong.output
    without = attrs.evolve(FAST, redis_url=standalone_url, admin_password=None, key_prefix="noadmin:")
    async with serve_on(without) as plain:
        for args in (("streams", "list"), ("audit",)):
            refused = await rsc(plain, *args, password="anything")
            assert refused.exit_code == 1
            assert "403 ADMIN_DISABLED" in refused.output, refused.output


async def test_groups_reset_prints_a_plan_by_default_and_resets_with_execute(
    http: httpx.AsyncClient, prefix: str, standalone_url: str, tmp_path: Path
) -> None:
    await http.put(f"/v1/admin/streams/{prefix}", json={"shardCount": 2}, auth=AUTH)
    await http.put(f"/v1/admin/streams/{prefix}/groups/billing", json={"startFrom": "earliest"}, auth=AUTH)
    keys = [s["key"] for s in (await http.get(f"/v1/streams/{prefix}")).json()["shards"]]
    with redis_py.Redis.from_url(standalone_url, decode_responses=True) as r:
        for key in keys:
            for n in range(3):
                r.xadd(key, {"n": str(n)})
        neither = await rsc(http, "groups", "reset", prefix, "billing")
        assert neither.exit_code == 2
        assert "exactly one of" in neither.output
        plan = await rsc(http, "groups", "reset", prefix, "billing", "--to-latest")
        assert plan.exit_code == 0, plan.output
        lines = plan.output.splitlines()
        assert lines[0] == f"group billing of {prefix}: reset planned (nothing changed: --execute resets)"
        assert lines[1].split() == ["SHARD", "STATE", "CURRENT", "NEW", "AGAIN", "SKIPPED", "PENDING", "NOTE"]
        assert [line.split()[:2] + line.split()[4:6] for line in lines[2:]] == [
            ["0", "ACTIVE", "0", "3"],
            ["1", "ACTIVE", "0", "3"],
        ]
        assert all(g["last-delivered-id"] == "0-0" for k in keys for g in r.xinfo_groups(k))  # a plan only
        as_json = await rsc(http, "groups", "reset", prefix, "billing", "--to-latest", "-o", "json")
        saved = tmp_path / "plan.json"
        saved.write_text(as_json.output)
        done = await rsc(http, "groups", "reset", prefix, "billing", "--to-ids", str(saved), "--execute")
        assert done.exit_code == 0, done.output
        assert done.output.splitlines()[0] == f"group billing of {prefix}: reset done"
        ids = json.loads(as_json.output)["ids"]
        assert {k: r.xinfo_groups(k)[0]["last-delivered-id"] for k in keys} == {
            keys[int(i)]: v for i, v in ids.items()
        }
        back = await rsc(
            http, "groups", "reset", prefix, "billing", "--to-time", "1970-01-01T00:00:00Z", "--execute"
        )
        assert back.exit_code == 0, back.output
        assert all(r.xinfo_groups(k)[0]["last-delivered-id"] == "0-0" for k in keys)
        bad = await rsc(http, "groups", "reset", prefix, "billing", "--to-time", "yesterday")
        assert bad.exit_code == 2
