"""Coordinator configuration: file, environment overrides, refusal of nonsense."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from click.testing import CliRunner

from rsc import coordinator_process as serving
from rsc.cli import main
from rsc.config import ConfigError, Settings, load


def test_defaults_without_file_or_environment() -> None:
    settings = load(None, environ={})
    assert settings == Settings()
    assert settings.redis_url == "redis://127.0.0.1:6379"
    assert not settings.redis_url_configured


def test_file_then_environment_overrides(tmp_path: Path) -> None:
    path = tmp_path / "rsc.toml"
    path.write_text(
        'redis_url = "redis://10.9.9.9:7000"\nheartbeat_interval_ms = 1000\nauto_create_streams = false\n'
    )
    settings = load(path, environ={"RSC_HEARTBEAT_INTERVAL_MS": "2000", "RSC_DEFAULT_SHARD_COUNT": "8"})
    assert settings.redis_url == "redis://10.9.9.9:7000"
    assert settings.heartbeat_interval_ms == 2000
    assert settings.default_shard_count == 8
    assert settings.auto_create_streams is False


def test_empty_environment_variables_count_as_unset() -> None:
    assert load(None, environ={"RSC_REDIS_URL": ""}).redis_url == "redis://127.0.0.1:6379"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"RSC_HEARTBEAT_INTERVAL_MS": "5000"}, "at least 3 x"),
        ({"RSC_REVOKE_TIMEOUT_MS": "-1"}, "must be positive"),
        ({"RSC_TICK_INTERVAL_MS": "abc"}, "tick_interval_ms"),
        ({"RSC_AUTO_CREATE_STREAMS": "maybe"}, "true or false"),
        ({"RSC_DEFAULT_SHARD_COUNT": "0"}, "default_shard_count"),
        ({"RSC_COORDINATOR_LEASE_TTL_MS": "6000"}, "at most half of member_lease_ttl_ms"),
        ({"RSC_COORDINATOR_LEASE_TTL_MS": "50"}, "coordinator_lease_ttl_ms must be at least 100"),
        ({"RSC_ADVERTISE_URL": "10.0.0.5:8080"}, "advertise_url"),
    ],
)
def test_nonsense_is_refused_with_a_clear_message(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(None, environ=environ)


def test_unknown_keys_and_unreadable_files(tmp_path: Path) -> None:
    path = tmp_path / "rsc.toml"
    path.write_text("streams = 3\n")
    with pytest.raises(ConfigError, match="unknown config keys: streams"):
        load(path, environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.toml", environ={})


def test_serve_refuses_bad_config_at_start() -> None:
    result = CliRunner().invoke(main, ["serve"], env={"RSC_MEMBER_LEASE_TTL_MS": "100"})
    assert result.exit_code == 2
    assert "configuration refused" in result.output


def test_the_service_process_freezes_start_up_objects_and_collects_in_larger_steps() -> None:
    before = gc.get_threshold()
    try:
        serving.tune_gc()
        assert gc.get_threshold() == serving.GC_THRESHOLDS
        assert gc.get_freeze_count() > 10_000  # the modules and objects of start-up
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_connection_limits_from_the_environment_and_refused_when_not_positive() -> None:
    names = ("keep_alive_timeout_ms", "body_timeout_ms", "max_connections")
    assert [getattr(Settings(), name) for name in names] == [5_000, 60_000, 1_000]
    settings = load(None, environ={f"RSC_{name.upper()}": "250" for name in names})
    assert [getattr(settings, name) for name in names] == [250, 250, 250]
    for name in names:
        with pytest.raises(ConfigError, match=f"{name} must be positive"):
            load(None, environ={f"RSC_{name.upper()}": "0"})


def test_the_coordinator_lease_fits_a_short_member_lease_unless_given() -> None:
    short = {"RSC_MEMBER_LEASE_TTL_MS": "6000", "RSC_HEARTBEAT_INTERVAL_MS": "2000"}
    assert load(environ=short).coordinator_lease_ttl_ms == 3_000
    assert load(environ={}).coordinator_lease_ttl_ms == 4_000
    with pytest.raises(ConfigError, match="half"):
        load(environ={**short, "RSC_COORDINATOR_LEASE_TTL_MS": "4000"})
