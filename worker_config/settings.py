"""Typed settings, loaded and validated once: defaults, then a YAML file, then the environment."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

CONFIG_ENV = "FRAMEFLEET_CONFIG"
BACKENDS = {
    "preprocess": ("builtin",),
    "depth": ("synthetic", "classical"),
    "tracks": ("synthetic", "opencv"),
    "hands": ("synthetic", "mediapipe"),
    "h5": ("builtin",),
}


class ConfigError(ValueError):
    """A setting is missing or wrong; the message names it, the value seen and the fix."""


class StageSettings(BaseModel):
    """One stage: which backend runs it, its parameters, and how long one task may take."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str = "synthetic"
    params: dict[str, Any] = Field(default_factory=dict)
    deadline_s: float = Field(default=3600.0, gt=0)
    max_retries: int = Field(default=3, ge=0)


def _default_stages() -> dict[str, StageSettings]:
    return {
        "preprocess": StageSettings(backend="builtin", params={"target_fps": 10.0}, deadline_s=1800),
        "depth": StageSettings(),
        "tracks": StageSettings(),
        "hands": StageSettings(),
        "h5": StageSettings(backend="builtin", deadline_s=1800),
    }


class Settings(BaseSettings):
    """Everything a framefleet program needs; environment variables are FRAMEFLEET_<NAME>."""

    model_config = SettingsConfigDict(
        env_prefix="FRAMEFLEET_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("redis_url", "FRAMEFLEET_REDIS_URL", "REDIS_URL"),
    )
    broker_url: str | None = None
    result_backend: str | None = None
    dataset_root: Path | None = None
    output_root: Path | None = None
    cpu_queue: str = "cpu"
    gpu_queue_prefix: str = "gpu"
    visibility_timeout_s: int = Field(default=12 * 3600, ge=1)
    lease_ttl_s: float = Field(default=30.0, gt=0)
    heartbeat_interval_s: float = Field(default=2.0, gt=0)
    registry_ttl_s: float = Field(default=10.0, gt=0)
    stall_after_s: float = Field(default=300.0, gt=0)
    result_expires_s: int = Field(default=30 * 24 * 3600, ge=3600)
    max_tasks_per_worker: int = Field(default=0, ge=0)
    max_rss_mib: float = Field(default=0, ge=0)
    stages: dict[str, StageSettings] = Field(default_factory=_default_stages)
    # The autoscaler's policy (worker_config.autoscale.AutoscalePolicy fields); its flags override it.
    autoscale: dict[str, float] = Field(default_factory=dict)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("redis_url", "broker_url", "result_backend")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a Redis URL such as redis://127.0.0.1:6379/0 or rediss://…")
        return value

    @field_validator("stages", mode="before")
    @classmethod
    def _fill_stages(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        merged: dict[str, Any] = {name: s.model_dump() for name, s in _default_stages().items()}
        for name, override in value.items():
            if name not in merged:
                raise ValueError(f"unknown stage {name!r}; the stages are {', '.join(merged)}")
            if isinstance(override, StageSettings):
                override = override.model_dump()
            merged[name] = {**merged[name], **override}
        for name, stage in merged.items():
            if stage["backend"] not in BACKENDS[name]:
                raise ValueError(
                    f"stage {name!r} has unknown backend {stage['backend']!r} (stages.{name}.backend, "
                    f"${'FRAMEFLEET_STAGES__' + name.upper() + '__BACKEND'}); "
                    f"available: {', '.join(BACKENDS[name])}"
                )
        return merged

    @field_validator("autoscale")
    @classmethod
    def _autoscale_policy(cls, value: dict[str, float]) -> dict[str, float]:
        from worker_config.autoscale import AutoscalePolicy

        try:
            AutoscalePolicy(**value)
        except TypeError:
            known = ", ".join(AutoscalePolicy.__dataclass_fields__)
            raise ValueError(f"unknown autoscale setting among {sorted(value)}; the settings are {known}") from None
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML file arrives as init kwargs; the environment must override it.
        return env_settings, init_settings

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def results(self) -> str:
        return self.result_backend or self.redis_url

    def gpu_queue(self, index: int) -> str:
        return f"{self.gpu_queue_prefix}{index}"

    def gpu_index(self, queue: str) -> int | None:
        """Return N for a queue named ``{gpu_queue_prefix}N``, else None."""
        suffix = queue[len(self.gpu_queue_prefix) :]
        if queue.startswith(self.gpu_queue_prefix) and suffix.isdigit():
            return int(suffix)
        return None


def exit_on_config_error(exc: ConfigError) -> NoReturn:
    """End a program whose settings are bad: the reason on stderr, exit status 2."""
    print(f"framefleet: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def load_settings(config_file: str | os.PathLike[str] | None = None) -> Settings:
    """Load settings from ``config_file`` (or $FRAMEFLEET_CONFIG) and the environment.

    Raises ConfigError naming the setting, the value and the fix.
    """
    path = config_file or os.environ.get(CONFIG_ENV)
    data: dict[str, Any] = {}
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ConfigError(
                f"cannot read the settings file {path}: {exc.strerror}; "
                f"pass an existing YAML file with --config or ${CONFIG_ENV}"
            ) from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"the settings file {path} is not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"the settings file {path} must hold a mapping of setting: value")
        data = loaded
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, path)) from None


def _explain(exc: ValidationError, path: str | os.PathLike[str] | None) -> str:
    lines = ["invalid settings:"]
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"])
        env = "FRAMEFLEET_" + "__".join(str(part).upper() for part in err["loc"])
        where = f"`{loc}:` in {path}" if path else "the settings file (--config)"
        lines.append(
            f"  {loc} = {err.get('input')!r}: {err['msg']}. Fix it in {where} or with ${env}."
        )
    return "\n".join(lines)


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ***, for logs and summaries."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else f"{scheme}://***@{host}"


def resolved_dict(settings: Settings) -> dict[str, Any]:
    """Return the settings as plain data with secrets redacted, for writing beside outputs."""
    data = settings.model_dump(mode="json")
    for key in ("redis_url", "broker_url", "result_backend"):
        if data.get(key):
            data[key] = redact_url(data[key])
    return data
