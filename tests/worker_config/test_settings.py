"""Settings: YAML then environment, validated once, errors that name the setting and the fix."""

from __future__ import annotations

import pytest

from worker_config.settings import ConfigError, load_settings, redact_url, resolved_dict


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REDIS_URL", "FRAMEFLEET_CONFIG", "FRAMEFLEET_REDIS_URL", "FRAMEFLEET_LEASE_TTL_S"):
        monkeypatch.delenv(name, raising=False)


def test_yaml_then_environment(tmp_path, monkeypatch):
    config = tmp_path / "ff.yaml"
    config.write_text("lease_ttl_s: 7\nstages:\n  depth:\n    params: {hold_mib: 64}\n")
    assert load_settings(config).lease_ttl_s == 7
    monkeypatch.setenv("FRAMEFLEET_LEASE_TTL_S", "9")
    conf = load_settings(config)
    assert conf.lease_ttl_s == 9
    assert conf.stages["depth"].params == {"hold_mib": 64}
    assert conf.stages["h5"].backend == "builtin"  # stages not named keep their defaults


def test_redis_url_from_the_one_environment_variable(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://10.0.0.5:6380/3")
    conf = load_settings()
    assert conf.broker == conf.results == "redis://10.0.0.5:6380/3"


@pytest.mark.parametrize(
    ("yaml_text", "named"),
    [
        ("lease_ttl_s: -1\n", "lease_ttl_s = -1"),
        ("redis_url: http://x\n", "redis_url = 'http://x'"),
        ("stages:\n  depth:\n    backend: vipe3\n", "unknown backend 'vipe3'"),
        ("stages:\n  colour:\n    backend: x\n", "unknown stage 'colour'"),
        ("no_such_setting: 1\n", "no_such_setting"),
    ],
)
def test_bad_values_name_the_setting_and_the_fix(tmp_path, yaml_text, named):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text)
    with pytest.raises(ConfigError) as err:
        load_settings(config)
    assert named in str(err.value)
    assert "Fix it in" in str(err.value)


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the settings file"):
        load_settings(tmp_path / "absent.yaml")
    (tmp_path / "b.yaml").write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(tmp_path / "b.yaml")


def test_passwords_never_leave_in_resolved_settings(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "rediss://user:s3cret@redis.example:6380/0")
    data = resolved_dict(load_settings())
    assert "s3cret" not in str(data)
    assert data["redis_url"] == "rediss://user:***@redis.example:6380/0"
    assert redact_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert redact_url("redis://h:1/0") == "redis://h:1/0"


def test_the_autoscaler_policy_lives_in_the_settings_file_and_flags_override_it(tmp_path):
    from tasks.autoscaler.cli import parse_args, policy_from

    config = tmp_path / "ff.yaml"
    config.write_text("autoscale: {headroom_mib: 3000, max_workers_per_gpu: 6}\n")
    conf = load_settings(config)
    policy = policy_from(parse_args(["--config", str(config), "--max-workers-per-gpu", "3"]), conf)
    assert (policy.headroom_mib, policy.max_workers_per_gpu, policy.cooldown_s) == (3000, 3, 30.0)
    (tmp_path / "bad.yaml").write_text("autoscale: {headroom_gib: 3}\n")
    with pytest.raises(ConfigError, match="unknown autoscale setting.*headroom_mib"):
        load_settings(tmp_path / "bad.yaml")
    (tmp_path / "neg.yaml").write_text("autoscale: {cooldown_s: -1}\n")
    with pytest.raises(ConfigError, match="cooldown_s = -1"):
        load_settings(tmp_path / "neg.yaml")


def test_every_builtin_backends_local_params_are_local_by_name_too():
    """An enqueuer that cannot import a backend (a plugin in its stage's own environment) hashes a stage's
    settings like its worker only if every local parameter is also local by name."""
    from tasks.backends import BUILTIN, backend_class
    from worker_config.settings import LOCAL_PARAM_NAMES, local_params

    for stage, backend in BUILTIN:
        try:
            declared = getattr(backend_class(stage, backend), "local_params", ())
        except Exception:
            continue  # an adapter whose upstream package is absent here
        assert set(declared) <= set(LOCAL_PARAM_NAMES), (stage, backend, declared)
    assert set(local_params("hands", "no-such-backend")) == set(LOCAL_PARAM_NAMES)
