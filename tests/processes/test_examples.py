"""The deployment and monitoring examples hold together: the Dockerfile's stages and commands,
compose's services and files, the Kubernetes manifests' selectors, probes and settings, and the
metric names of the alert rules and the Grafana dashboard against what a coordinator exports,
and the alert rules themselves under `promtool` (their unit tests, `alerts_test.yml`).
The Dockerfile is read as text; the image itself is built only where a container builder
answers (`docker info`), else that test is skipped and says so. No cluster is reached here:
`kubectl apply` is the next step."""

from __future__ import annotations

import importlib.util
import json
import py_compile
import re
import shlex
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from click.testing import CliRunner

from rsc.cli import main
from rsc.cli.serve_command import _bind_address
from rsc.client.worker import App
from rsc.config import Settings
from tests.httpkit import FAST, serve_on

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CONFIG_ENV = {f"RSC_{a.name.upper()}" for a in attrs.fields(Settings)}
CLIENT_ENV = {"RSC_COORDINATOR_URL", "RSC_REDIS_URL", "RSC_TOKEN", "RSC_CA_BUNDLE", "RSC_INSTANCE_ID"}


def test_the_license_is_the_one_pyproject_names() -> None:
    assert (ROOT / "LICENSE").read_text().split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()


def dockerfile_stages() -> dict[str, list[str]]:
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            current = []
            stages[line.split()[-1]] = current
        elif line and not line.startswith("#"):
            current.append(line)
    return stages


def test_the_dockerfile_builds_a_coordinator_and_a_worker_from_what_the_repository_has() -> None:
    stages = dockerfile_stages()
    assert {"base", "coordinator", "worker"} <= set(stages)
    for line in stages["base"]:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    command = next(line for line in stages["coordinator"] if line.startswith("CMD "))
    argv = json.loads(command[4:])
    assert argv[:2] == ["rsc", "serve"]
    assert _bind_address(argv[argv.index("--bind") + 1]) == "0.0.0.0:8080"
    assert "EXPOSE 8080" in stages["coordinator"]
    assert any("/healthz" in line for line in stages["coordinator"] if line.startswith("HEALTHCHECK"))


def test_the_image_builds_where_a_builder_runs() -> None:
    """Build the coordinator and worker stages where a Docker daemon answers; elsewhere say that
    the Dockerfile was only read as text (the test above), not built."""
    docker = shutil.which("docker")
    answers = docker is not None and (
        subprocess.run([docker, "info"], capture_output=True, timeout=30, check=False).returncode == 0
    )
    if not answers:
        pytest.skip("no container builder answers (docker info): the Dockerfile is only read as text")
    assert docker is not None
    for target in ("coordinator", "worker"):
        built = subprocess.run(
            [docker, "build", "--target", target, "-t", f"rsc-test-{target}", str(ROOT)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert built.returncode == 0, built.stderr[-3000:]


def test_compose_runs_redis_a_coordinator_a_worker_and_a_producer() -> None:
    compose = yaml.safe_load((EXAMPLES / "compose" / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"redis", "coordinator", "worker", "producer"}
    targets = set(dockerfile_stages())
    for name in ("coordinator", "worker", "producer"):
        service = services[name]
        assert service["build"]["target"] in targets
        assert (EXAMPLES / "compose" / service["build"]["context"] / "Dockerfile").exists()
        allowed = CONFIG_ENV if name == "coordinator" else CLIENT_ENV
        assert set(service["environment"]) <= allowed, name
    app_dir = EXAMPLES / "compose" / "app"
    spec = importlib.util.spec_from_file_location("compose_app", app_dir / "app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert isinstance(module.app, App)
    assert services["worker"]["command"] == ["rsc", "worker", "app:app"]
    py_compile.compile(str(app_dir / "produce.py"), doraise=True)


def manifests() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / "kubernetes" / "rsc.yaml").read_text()) if d]


def test_the_kubernetes_manifests_hold_together() -> None:
    docs = manifests()
    kinds = {(d["apiVersion"], d["kind"]) for d in docs}
    assert kinds <= {("apps/v1", "Deployment"), ("v1", "Service"), ("policy/v1", "PodDisruptionBudget")}
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    labels = {}
    for name, deployment in deployments.items():
        spec = deployment["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items(), name
        labels[name] = spec["template"]["metadata"]["labels"]
        [container] = spec["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        argv = container["args"]
        if argv[1] == "serve":
            assert set(env) - {"POD_IP"} <= CONFIG_ENV
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert _bind_address(argv[argv.index("--bind") + 1])
        else:
            assert argv[:2] == ["rsc", "worker"]
            assert set(env) - {"POD_IP"} <= CLIENT_ENV
            grace = spec["template"]["spec"]["terminationGracePeriodSeconds"]
            assert grace > 30  # longer than the worker's default --stop-timeout
    for doc in docs:  # every Service and PodDisruptionBudget selects a Deployment's pods
        if doc["kind"] == "Service":
            selector = doc["spec"]["selector"]
        elif doc["kind"] == "PodDisruptionBudget":
            selector = doc["spec"]["selector"]["matchLabels"]
        else:
            continue
        assert any(selector.items() <= found.items() for found in labels.values()), doc["metadata"]["name"]


@pytest.fixture
async def exported(standalone_url: str, prefix: str) -> AsyncIterator[set[str]]:
    """Every sample name a coordinator's /metrics can carry (families with no sample yet too)."""
    async with serve_on(attrs.evolve(FAST, redis_url=standalone_url)) as http:
        await http.post(
            "/v1/heartbeat",
            json={
                "protocolVersion": 2,
                "streamPrefix": prefix,
                "consumerGroup": "billing",
                "memberId": "a",
                "incarnation": "i",
                "memberEpoch": 0,
            },
        )
        yield _names((await http.get("/metrics")).text)


def _names(text: str) -> set[str]:
    names = set()
    for kind, name in re.findall(r"^# TYPE (\S+) (\w+)", text, re.M):
        names.add(kind)
        if name == "counter":
            names.add(f"{kind}_total")
        if name == "histogram":
            names.update(f"{kind}_{suffix}" for suffix in ("bucket", "count", "sum"))
    return names


def _referenced(expr: str) -> set[str]:
    return set(re.findall(r"\brsc_[a-z_]+", expr))


async def test_alert_rules_use_metrics_the_coordinator_exports(exported: set[str]) -> None:
    rules = yaml.safe_load((EXAMPLES / "prometheus" / "alerts.yml").read_text())
    [group] = rules["groups"]
    alerts = {rule["alert"]: rule for rule in group["rules"]}
    assert {"RscLagGrowing", "RscDeadLetters", "RscMembersFlapping", "RscMigrationStuck"} <= set(alerts)
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert _referenced(rule["expr"]) <= exported, (name, _referenced(rule["expr"]) - exported)
        assert rule["expr"].count("(") == rule["expr"].count(")"), name


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not on the PATH: apt-get install prometheus (.ci/run does)"
)
def test_the_alert_rules_are_valid_and_fire_as_their_unit_tests_say() -> None:
    """`promtool check rules` and `promtool test rules`: each alert fires on the series that
    should fire it (with its labels and summary) and stays silent on the near misses."""
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        done = subprocess.run(
            [str(PROMTOOL), *args],
            cwd=EXAMPLES / "prometheus",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout


async def test_the_grafana_dashboard_queries_metrics_the_coordinator_exports(exported: set[str]) -> None:
    dashboard = json.loads((EXAMPLES / "grafana" / "rsc.json").read_text())
    assert dashboard["uid"] == "rsc"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            missing = _referenced(target["expr"]) - exported
            assert not missing, (panel["title"], missing)


def test_the_examples_name_commands_that_exist() -> None:
    """Every `rsc ...` command line in the examples parses against the CLI."""
    lines = re.findall(r"\brsc (worker|serve) ([^\n\"\]]*)", (ROOT / "Dockerfile").read_text())
    for command, rest in lines:
        args = [a for a in shlex.split(rest) if not a.startswith("$")]
        result = CliRunner().invoke(main, [command, "--help"])
        assert result.exit_code == 0
        for option in (a for a in args if a.startswith("--")):
            assert option in result.output, (command, option)
