"""The Terraform provider end to end: the real `terraform` binary, `terraform-provider-rsc`
installed through a `dev_overrides` CLI config (as a user installs a local provider), and a
real coordinator: plan, apply, drift made through the API, apply again, a change of the
configuration, import, destroy. `examples/terraform/` is the configuration it starts from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import attrs
import pytest
import trio

from tests.httpkit import FAST, serve_on

TERRAFORM = shutil.which("terraform")
AUTH = ("admin", "s3cret")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "terraform" / "main.tf"
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
pytestmark = pytest.mark.skipif(
    TERRAFORM is None,
    reason="terraform is not on the PATH: install Terraform 1.x "
    "(https://developer.hashicorp.com/terraform/install) to run the provider's end-to-end test",
)


def cli_config(tmp_path: Path) -> Path:
    """A directory holding `terraform-provider-rsc`, and a CLI config pointing `rsc/rsc` at it."""
    providers = tmp_path / "providers"
    providers.mkdir()
    script = Path(sys.executable).parent / "terraform-provider-rsc"
    assert script.exists(), "install rsc with the terraform extra: pip install -e '.[terraform]'"
    (providers / "terraform-provider-rsc").symlink_to(script)
    config = tmp_path / "terraform.rc"
    config.write_text(
        "provider_installation {\n"
        f'  dev_overrides {{\n    "rsc/rsc" = "{providers}"\n  }}\n'
        "  direct {}\n}\n"
    )
    return config


@attrs.frozen
class Terraform:
    workdir: Path
    env: Mapping[str, str]

    async def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        options = [
            "-no-color",
            *(["-input=false"] if args[0] in ("plan", "apply", "destroy", "import") else []),
        ]
        command = [str(TERRAFORM), args[0], *options, *args[1:]]  # options before the arguments

        def run() -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                command,
                cwd=self.workdir,
                env=dict(self.env),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )

        return await trio.to_thread.run_sync(run)


def configuration(prefix: str, shards: int, extra: str = "") -> str:
    """The example's configuration for stream `prefix` (names made unique per test)."""
    text = EXAMPLE.read_text().replace('name         = "orders"', f'name         = "{prefix}"')
    return text.replace("shard_count  = 4", f"shard_count  = {shards}") + extra


@pytest.mark.timeout(300)
async def test_terraform_plans_applies_detects_drift_imports_and_destroys(  # noqa: PLR0915 (one story)
    standalone_url: str, prefix: str, tmp_path: Path
) -> None:
    settings = attrs.evolve(FAST, redis_url=standalone_url, admin_password="s3cret")
    async with serve_on(settings) as http:
        work = tmp_path / "work"
        work.mkdir()
        env = {
            **os.environ,
            "TF_CLI_CONFIG_FILE": str(cli_config(tmp_path)),
            "CHECKPOINT_DISABLE": "1",
            "TF_IN_AUTOMATION": "1",
            "RSC_COORDINATOR_URL": str(http.base_url),
            "RSC_ADMIN_PASSWORD": "s3cret",
            "RSC_NETRC": "/nonexistent",
        }
        tf = Terraform(work, env)
        (work / "main.tf").write_text(configuration(prefix, 4))

        plan = await tf("plan", "-detailed-exitcode")
        assert plan.returncode == 2, plan.stdout + plan.stderr
        assert "2 to add, 0 to change, 0 to destroy" in plan.stdout
        applied = await tf("apply", "-auto-approve")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        stream = await http.get(f"/v1/admin/streams/{prefix}", auth=AUTH)
        spec = stream.json()["spec"]
        assert (spec["shardCount"], spec["reshardMode"]) == (4, "online")
        assert spec["retention"]["keep"] == "acknowledged"  # unset: the stream's default, not managed
        group = await http.get(f"/v1/admin/streams/{prefix}/groups/billing", auth=AUTH)
        assert group.json()["spec"] == {"maxConcurrency": 4, "startFrom": "earliest"}
        keys = await tf("output", "-json", "shard_keys")
        routing = (await http.get(f"/v1/streams/{prefix}/routing")).json()
        assert [s["key"] for s in routing["shards"]] == json.loads(keys.stdout)
        assert (await tf("plan", "-detailed-exitcode")).returncode == 0

        # Drift: a change made through the API (or the CLI) shows in the plan; apply undoes it.
        await http.patch(f"/v1/admin/streams/{prefix}/groups/billing", json={"maxConcurrency": 9}, auth=AUTH)
        drift = await tf("plan", "-detailed-exitcode")
        assert drift.returncode == 2, drift.stdout + drift.stderr
        assert "max_concurrency = 9 -> 4" in drift.stdout
        # The page shows this plan: its lines are in what terraform printed.
        shown = OPERATIONS.read_text().split("# exit 2: drift\n", 1)[1].split("$ ", 1)[0]
        assert shown.strip()
        for line in shown.strip().splitlines():
            assert line.strip() in drift.stdout, line
        assert (await tf("apply", "-auto-approve")).returncode == 0
        group = await http.get(f"/v1/admin/streams/{prefix}/groups/billing", auth=AUTH)
        assert group.json()["spec"]["maxConcurrency"] == 4

        # A change of the configuration: a scale-in through Terraform.
        (work / "main.tf").write_text(configuration(prefix, 2))
        scaled = await tf("apply", "-auto-approve")
        assert scaled.returncode == 0, scaled.stdout + scaled.stderr
        assert "1 changed" in scaled.stdout
        assert (await http.get(f"/v1/streams/{prefix}")).json()["shardCount"] == 2

        # A change made between `plan -out` and applying that plan is not overwritten unseen.
        (work / "main.tf").write_text(
            configuration(prefix, 2).replace("max_concurrency = 4", "max_concurrency = 5")
        )
        planned = await tf("plan", "-out=tfplan")
        assert planned.returncode == 0, planned.stdout + planned.stderr
        await http.patch(f"/v1/admin/streams/{prefix}/groups/billing", json={"maxConcurrency": 7}, auth=AUTH)
        stale = await tf("apply", "tfplan")
        assert stale.returncode == 1, stale.stdout + stale.stderr
        assert f"group {prefix}/billing changed since the plan was made (max_concurrency)" in stale.stderr
        group = await http.get(f"/v1/admin/streams/{prefix}/groups/billing", auth=AUTH)
        assert group.json()["spec"]["maxConcurrency"] == 7
        assert (await tf("apply", "-auto-approve")).returncode == 0  # planned again: 7 -> 5
        group = await http.get(f"/v1/admin/streams/{prefix}/groups/billing", auth=AUTH)
        assert group.json()["spec"]["maxConcurrency"] == 5
        (work / "main.tf").write_text(configuration(prefix, 2))
        assert (await tf("apply", "-auto-approve")).returncode == 0

        # Import a group made outside Terraform.
        await http.put(f"/v1/admin/streams/{prefix}/groups/audit", json={"maxConcurrency": 2}, auth=AUTH)
        audit_block = (
            '\nresource "rsc_group" "audit" {\n  stream          = rsc_stream.orders.name\n'
            '  name            = "audit"\n  max_concurrency = 2\n  start_from      = "earliest"\n}\n'
        )
        (work / "main.tf").write_text(configuration(prefix, 2, audit_block))
        imported = await tf("import", "rsc_group.audit", f"{prefix}/audit")
        assert imported.returncode == 0, imported.stdout + imported.stderr
        assert (await tf("plan", "-detailed-exitcode")).returncode == 0
        bad = await tf("import", "rsc_group.nope", f"{prefix}/nope")
        assert bad.returncode == 1

        # Deleted outside Terraform: planned again.
        await http.delete(f"/v1/admin/streams/{prefix}/groups/audit", auth=AUTH)
        gone = await tf("plan", "-detailed-exitcode")
        assert gone.returncode == 2
        assert "rsc_group.audit will be created" in gone.stdout

        # A retention attribute set is managed (sent, read back, drift shown); the others are not.
        retained = configuration(prefix, 2, audit_block).replace(
            "shard_count  = 2", "shard_count  = 2\n  retention_max_age_ms = 60000"
        )
        assert "retention_max_age_ms" in retained
        (work / "main.tf").write_text(retained)
        assert (await tf("apply", "-auto-approve")).returncode == 0
        policy = (await http.get(f"/v1/admin/streams/{prefix}", auth=AUTH)).json()["spec"]["retention"]
        assert (policy["maxAgeMs"], policy["keep"]) == (60000, "acknowledged")
        assert (await tf("plan", "-detailed-exitcode")).returncode == 0
        await http.patch(f"/v1/admin/streams/{prefix}", json={"retention": {"maxAgeMs": 5}}, auth=AUTH)
        drift = await tf("plan", "-detailed-exitcode")
        assert drift.returncode == 2, drift.stdout + drift.stderr
        assert "retention_max_age_ms = 5 -> 60000" in drift.stdout
        assert (await tf("apply", "-auto-approve")).returncode == 0

        destroyed = await tf("destroy", "-auto-approve")
        assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
        assert (await http.get(f"/v1/admin/streams/{prefix}", auth=AUTH)).status_code == 404
        records = await http.get(
            "/v1/admin/audit",
            params={"pathPrefix": f"/v1/admin/streams/{prefix}", "method": "DELETE"},
            auth=AUTH,
        )
        assert {r["status"] for r in records.json()["records"]} == {204}  # audited as the admin


async def test_the_example_configuration_is_valid(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(EXAMPLE, work / "main.tf")
    env = {**os.environ, "TF_CLI_CONFIG_FILE": str(cli_config(tmp_path)), "CHECKPOINT_DISABLE": "1"}
    result = await Terraform(work, env)("validate")
    assert result.returncode == 0, result.stdout + result.stderr


def test_retention_attributes_are_checked_at_plan_time_naming_each() -> None:
    """What the coordinator would refuse is refused by `terraform plan` already (the provider's
    own check, without the binary): each retention attribute by its range or choices."""
    from tf.utils import Diagnostics

    from rsc.tools.terraform import _validate

    diagnostics = Diagnostics()
    config = {
        "shard_count": 2,
        "retention_max_age_ms": 0,
        "retention_keep": "x",
        "retention_when_full": "refuse",
    }
    _validate(diagnostics, config)
    assert sorted(d.summary for d in diagnostics.diagnostics) == [
        "retention_keep must be one of 'acknowledged', 'all'",
        "retention_max_age_ms must be an integer from 1 to 3153600000000",
    ]
