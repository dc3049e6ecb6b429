"""Typed settings, loaded and validated once: defaults, then a YAML file, then the environment."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from worker_config.settings_match import SETTINGS_QUEUE_SEP

CONFIG_ENV = "FRAMEFLEET_CONFIG"


class ConfigError(ValueError):
    """A setting is missing or wrong; the message names it, the value seen and the fix."""


class StageSettings(BaseModel):
    """One stage: whether it runs, which backend runs it, its parameters, its interpreter, how long a task may take.

    ``python``: the interpreter of the stage's own environment (a GPU stage whose model pins
    packages the others cannot share); its tasks then go to the queues ``gpu{N}.{stage}``,
    consumed by workers started from that interpreter.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    backend: str = "builtin"
    params: dict[str, Any] = Field(default_factory=dict)
    python: str | None = None
    deadline_s: float = Field(default=3600.0, gt=0)
    max_retries: int = Field(default=3, ge=0)


# Named sets of quality gates (``quality: y2r`` in the settings); a mapping may name one as ``preset`` and
# override some of its thresholds. "default" keeps out what no training set wants (docs/operations-defaults.md
# gives the measurements on the real clips they come from); "y2r" is y2r's own rule alone, flat depth.
QUALITY_PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "y2r": {"min_track_visible_fraction": 0.0, "min_median_track_length": 0.0, "min_track_windows": 0},
}


class QualityGates(BaseModel):
    """Per-video quality thresholds (the stages' ``gates``); a video below one is quarantined as ``low_quality``.

    A ``min_`` gate of 0 is off, as is a ``max_`` gate of None. Each is checked against what its stage measured,
    when the stage runs and again when a later run finds its output (so a changed threshold
    and ``--continue`` or ``--retry-quarantined`` bring a quarantined video back). The defaults reject a
    video with no track window, or whose tracks are lost at once (a featureless or blank picture);
    ``quality: y2r`` (QUALITY_PRESETS) keeps y2r's flat-depth rule alone.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # y2r's rule: depth flat (std < stages.depth.params.flat_std_threshold m) on more than this % of frames.
    max_flat_frame_pct: float = Field(default=10.0, ge=0, le=100)
    allow_camera_fallback: bool = True  # false: a video whose camera could not be solved is quarantined
    max_reprojection_error_px: float | None = Field(default=None, ge=0)  # None: off
    # Median over windows of the fraction of a window's query points still tracked at its last step.
    # Real clips (CPU backends): sheep 0.84, pstudio 0.69, dog 0.21; a featureless still wall 0.0.
    min_track_visible_fraction: float = Field(default=0.05, ge=0, le=1)
    # Frames a query point is followed, median. Real clips: sheep 10, pstudio 10, dog 2; the wall 1 (lost at once).
    min_median_track_length: float = Field(default=1.5, ge=0)
    # Track windows with at least one query point (a frame with usable depth to put one on).
    min_track_windows: int = Field(default=1, ge=0)
    min_hand_frame_fraction: float = Field(default=0.0, ge=0, le=1)  # frames with at least one hand
    min_hand_confidence: float = Field(default=0.0, ge=0, le=1)  # mean detection score over detected frames

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if isinstance(data, str):
            data = {"preset": data}
        if not isinstance(data, dict) or "preset" not in data:
            return data
        name = data["preset"]
        if name not in QUALITY_PRESETS:
            raise ValueError(
                f"unknown quality preset {name!r}; the presets are {', '.join(QUALITY_PRESETS)} "
                "(or give the thresholds as a mapping, e.g. quality: {min_track_visible_fraction: 0.1})"
            )
        return {**QUALITY_PRESETS[name], **{k: v for k, v in data.items() if k != "preset"}}


def _default_stages(mode: str = "auto") -> dict[str, StageSettings]:
    """Every stage's settings when none are given; ``mode``: the ``default_backends`` setting."""
    from tasks.backends.defaults import default_stage
    from tasks.stages import ALL

    return {cls.name: StageSettings(**default_stage(cls, mode)) for cls in ALL}


def _runs_here(python: str) -> bool:
    """Whether ``python`` is the interpreter of this process's environment."""
    return os.path.realpath(os.path.dirname(python)) == os.path.realpath(os.path.dirname(sys.executable))


def _check_stages(stages: dict[str, Any]) -> None:
    """Refuse unknown backends, interpreters for CPU stages and chains with a missing stage."""
    from tasks.backends import available
    from tasks.stages import chain_order, stage_class

    for name, stage in stages.items():
        cls = stage_class(name)
        choices = available(name) if cls.device == "gpu" else ["builtin"]
        elsewhere = bool(stage.get("python")) and not _runs_here(stage["python"])
        # A stage with its own environment may use a backend only that environment has: its
        # worker checks the name when it starts (and exits naming the choices).
        if stage["backend"] not in choices and not elsewhere:
            raise ValueError(
                f"stage {name!r} has unknown backend {stage['backend']!r} (stages.{name}.backend, "
                f"${'FRAMEFLEET_STAGES__' + name.upper() + '__BACKEND'}); available: {', '.join(choices)}"
            )
        if stage.get("python") and cls.device != "gpu":
            raise ValueError(
                f"stages.{name}.python: {name} runs on the cpu queue, in the main environment; "
                "only GPU stages can have an interpreter of their own"
            )
        if stage.get("python") and not Path(stage["python"]).is_absolute():
            raise ValueError(
                f"stages.{name}.python must be an absolute path to an interpreter, "
                f"got {stage['python']!r} (e.g. /opt/envs/{name}/bin/python)"
            )
    chain_order({name: bool(stage["enabled"]) for name, stage in stages.items()})


class Settings(BaseSettings):
    """Everything a framefleet program needs; environment variables are FRAMEFLEET_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="FRAMEFLEET_", env_nested_delimiter="__", frozen=True, extra="forbid")

    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("redis_url", "FRAMEFLEET_REDIS_URL", "REDIS_URL"),
    )
    broker_url: str | None = None
    result_backend: str | None = None
    # The roots a worker serves (tasks.workers.confinement); without them, the roots allowed on its host
    # (allowed_roots_file, default $XDG_STATE_HOME/framefleet/allowed-roots.jsonl, written by enqueue there).
    dataset_root: Path | None = None
    output_root: Path | None = None
    allowed_roots_file: Path | None = None
    # A worker that reads and writes wherever a message says (--unconfined): an explicit choice, said loudly.
    unconfined: bool = False
    # Serve jobs of an output folder holding no record of their run (tasks.pipeline.admission): for tests and
    # tools that send jobs by hand; a run with a record is checked whatever this says.
    unrecorded_runs: bool = False
    cpu_queue: str = "cpu"
    gpu_queue_prefix: str = "gpu"
    visibility_timeout_s: int = Field(default=12 * 3600, ge=1)
    lease_ttl_s: float = Field(default=30.0, gt=0)
    heartbeat_interval_s: float = Field(default=2.0, gt=0)
    registry_ttl_s: float = Field(default=10.0, gt=0)
    stall_after_s: float = Field(default=60.0, gt=0)
    result_expires_s: int = Field(default=30 * 24 * 3600, ge=3600)
    # How long a finished run's per-video copies (outcomes, stage log, partials) stay in Redis once its
    # files in OUT hold them (docs/redis-keys.md); a redelivered callback within it still finds them.
    finished_run_keep_s: int = Field(default=600, ge=0)
    # Videos of a run in flight at once (tasks.run.completion); 0: 4 per live worker at enqueue, at least 32.
    enqueue_window: int = Field(default=0, ge=0)
    max_tasks_per_worker: int = Field(default=0, ge=0)
    max_rss_mib: float = Field(default=0, ge=0)
    # Later stages of a video first on every queue (tasks.delivery.queues.stage_priority); false: first in, first out.
    stage_priorities: bool = True
    # torch's CPU threads in each worker process; 0 keeps torch's default (one per core). Several
    # model workers on one host each with every core oversubscribe it: run_local sets cores // workers.
    torch_threads: int = Field(default=0, ge=0)
    # The backend of a model stage whose settings name none (tasks.backends.defaults): auto = y2r's model
    # where its environment is installed (configs/real-gpu.yaml's layout), else the real CPU backend;
    # cpu = always the CPU backends; synthetic = made-up stand-ins, for tests and demos only.
    default_backends: Literal["auto", "cpu", "synthetic"] = "auto"
    stages: dict[str, StageSettings] = Field(default_factory=_default_stages)
    # Per-video quality thresholds (the stages declare their gates): below one, a video is quarantined.
    quality: QualityGates = Field(default_factory=lambda: QualityGates())
    # The autoscaler's policy (tasks.autoscaler.policy.AutoscalePolicy fields); its flags override it.
    autoscale: dict[str, float] = Field(default_factory=dict)
    # framefleet's own log lines (stage start and end, model loaded, pinned GPU) in every program, and a
    # worker's Celery lines unless -l says otherwise.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # A GPU queue's worker may run another pool than solo, more than one process (each loads the models
    # onto the GPU again) or several queues of one GPU; without it such a worker refuses to start
    # (tasks.workers.launch). Two GPUs' queues in one worker stay refused: one process pins one GPU.
    allow_any_gpu_worker: bool = False
    # A worker that consumes only the settings queues beside its queues (worker_config.settings_match), not the
    # queues themselves: it takes only tasks that must run under its settings. The autoscaler's families for a
    # run's other settings are started so, and take no task of the runs of its own settings.
    settings_queues_only: bool = False

    @field_validator("redis_url", "broker_url", "result_backend")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        from tasks import redis_urls

        return None if value is None else redis_urls.check(value)

    @model_validator(mode="before")
    @classmethod
    def _always_fill_stages(cls, data: Any) -> Any:
        # The stages' defaults depend on default_backends: _fill_stages must run when no stage is given too.
        if isinstance(data, dict) and "stages" not in data:
            data = {**data, "stages": {}}
        return data

    @field_validator("stages", mode="before")
    @classmethod
    def _fill_stages(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, dict):
            return value
        mode = info.data.get("default_backends", "auto")
        merged: dict[str, Any] = {name: s.model_dump() for name, s in _default_stages(mode).items()}
        for name, override in value.items():
            if name not in merged:
                raise ValueError(f"unknown stage {name!r}; the stages are {', '.join(merged)}")
            if isinstance(override, StageSettings):
                override = override.model_dump()
            if not isinstance(override, dict):
                raise ValueError(f"stages.{name} must be a mapping of setting: value, got {override!r}")
            merged[name] = {**merged[name], **override}
        _check_stages(merged)
        return merged

    @field_validator("autoscale")
    @classmethod
    def _autoscale_policy(cls, value: dict[str, float]) -> dict[str, float]:
        from tasks.autoscaler.policy import AutoscalePolicy

        try:
            AutoscalePolicy(**value)  # type: ignore[arg-type]
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
        """Return N for a queue named ``{gpu_queue_prefix}N`` or ``{gpu_queue_prefix}N.{stage}``, else None."""
        if SETTINGS_QUEUE_SEP in queue:  # a settings queue beside a GPU queue (settings_match.settings_queue)
            return None
        suffix = queue[len(self.gpu_queue_prefix) :].split(".", 1)[0]
        if queue.startswith(self.gpu_queue_prefix) and suffix.isdigit():
            return int(suffix)
        return None

    def stage_queue(self, stage: str, gpu: int) -> str:
        """The queue of ``stage`` on GPU ``gpu``: ``gpu{N}``, or ``gpu{N}.{stage}`` for a stage with its own python."""
        return f"{self.gpu_queue(gpu)}.{stage}" if self.stages[stage].python else self.gpu_queue(gpu)

    def hosted_stages(self, own: str | None = None) -> tuple[str, ...]:
        """The enabled GPU stages a worker of ``gpuN`` hosts (``own`` None), or of ``gpuN.<own>`` (just ``own``)."""
        from tasks.stages import GPU_STAGES

        if own is not None:
            return (own,)
        return tuple(s for s in self.enabled_stages() if s in GPU_STAGES and not self.stages[s].python)

    def own_env_stages(self) -> tuple[str, ...]:
        """The enabled GPU stages with an interpreter of their own (queues ``gpuN.<stage>``)."""
        from tasks.stages import GPU_STAGES

        return tuple(s for s in self.enabled_stages() if s in GPU_STAGES and self.stages[s].python)

    def enabled_stages(self) -> tuple[str, ...]:
        """The stages a video runs, in order (tasks.stages.chain_order of the enabled ones)."""
        from tasks.stages import chain_order

        return chain_order(self.stages)


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
        lines.append(f"  {loc} = {_shown_input(err.get('input'))}: {err['msg']}. Fix it in {where} or with ${env}.")
    return "\n".join(lines)


def _shown_input(value: Any) -> str:
    """A refused setting's value as its message shows it: a URL's passwords as *** (the message reaches logs)."""
    if isinstance(value, str) and "://" in value:
        return repr(redact_url(value))
    return repr(value)


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ***, for logs and summaries."""
    from tasks import redis_urls

    return redis_urls.redact(url)


def resolved_dict(settings: Settings) -> dict[str, Any]:
    """Return the settings as plain data with secrets redacted, for writing beside outputs."""
    data = settings.model_dump(mode="json")
    for key in ("redis_url", "broker_url", "result_backend"):
        if data.get(key):
            data[key] = redact_url(data[key])
    return data


# What decides a stage's output: not its deadline, retries or interpreter path (those differ between hosts).
OUTPUT_FIELDS = ("enabled", "backend", "params")


def _defaults_of(cls: type) -> dict[str, Any]:
    import inspect

    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {
        p.name: p.default
        for p in params
        if p.name not in ("self", "backend")
        and p.default is not p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def resolved_stage(conf: Settings, stage: str) -> tuple[dict[str, Any], str]:
    """Return the settings that decide ``stage``'s output, every default filled in, and their sha256.

    The same settings give the same hash in every process of the same framefleet version: the
    params are the stage class's and its built-in backend's constructor defaults, then those
    the settings give; the hash is of their canonical JSON (sorted keys).
    """
    import hashlib
    import json

    from tasks.backends import BUILTIN, backend_class
    from tasks.stages import stage_class

    own = conf.stages[stage]
    params = _defaults_of(stage_class(stage))
    if (stage, own.backend) in BUILTIN:
        with contextlib.suppress(Exception):  # a backend module that cannot be imported here: its worker checks it
            params = {**_defaults_of(backend_class(stage, own.backend)), **params}
    params.update(own.params)
    resolved = {**own.model_dump(mode="json", include=set(OUTPUT_FIELDS)), "params": params}
    text = json.dumps(resolved, sort_keys=True, default=str)
    return json.loads(text), hashlib.sha256(text.encode()).hexdigest()


def resolved_stages(conf: Settings) -> dict[str, Any]:
    """Every enabled stage's resolved settings and hash (``resolved_stage``), and one hash over them all."""
    import hashlib
    import json

    stages = {}
    for name in conf.enabled_stages():
        settings, digest = resolved_stage(conf, name)
        stages[name] = {"backend": settings["backend"], "settings": settings, "sha256": digest}
    whole = hashlib.sha256(json.dumps({n: s["sha256"] for n, s in stages.items()}, sort_keys=True).encode())
    return {"stages": stages, "sha256": whole.hexdigest()}


# Parameters that never change what a stage writes, by name, whoever declares them: the built-in backends'
# ``local_params`` (paths on a host, batch sizes, the stand-ins' pacing). By name, so that an enqueuer that
# cannot import a backend (a plugin installed only in its stage's own environment) hashes like its worker.
LOCAL_PARAM_NAMES = (
    "weights_dir",
    "repo_dir",
    "batch_size",
    "detection_batch",
    "hold_mib",
    "activation_mib",
    "matmuls_per_frame",
    "matmul_size",
    "seconds_per_frame",
)

# Files a stage's loader opens (checkpoints, a model folder or config, a tokenizer's vocabulary): they change what
# the stage writes, so they are hashed, but a worker opens only its own host's. A run's record names them for its
# hash alone: an autoscaler writes its own host's value, and the record must agree (upstream loaders unpickle
# checkpoints: a path from Redis would be code; docs/models.md).
HOST_FILE_PARAMS = ("checkpoint", "sam2_checkpoint", "sam2_config", "detector", "bpe_path")


def local_params(stage: str, backend: str) -> tuple[str, ...]:
    """The parameters of ``backend`` that do not change what ``stage`` writes: LOCAL_PARAM_NAMES and the
    backend's own ``local_params`` where it can be imported here."""
    from tasks.backends import backend_class

    try:
        declared = tuple(getattr(backend_class(stage, backend), "local_params", ()))
    except Exception:  # a backend that cannot be imported here: the names alone decide
        declared = ()
    return tuple(sorted({*LOCAL_PARAM_NAMES, *declared}))


def _same_numbers(value: Any) -> Any:
    """``value`` with every int a float, so that ``10`` in one settings file and ``10.0`` in another hash alike."""
    if isinstance(value, dict):
        return {k: _same_numbers(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_same_numbers(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def stage_entry(conf: Settings, stage: str) -> dict[str, Any]:
    """``stage``'s settings as a run records them and a worker advertises them, with the hash the two must share.

    ``settings``: ``resolved_stage`` less the backend's local parameters (paths on a host, batch sizes,
    the stand-ins' pacing), which go to ``local``; ``sha256``: of ``settings``' canonical JSON (numbers
    as floats);
    ``python``: the stage's interpreter (neither is hashed: both may differ between hosts).
    """
    import hashlib
    import json

    resolved, _ = resolved_stage(conf, stage)
    skip = set(local_params(stage, resolved["backend"]))
    params = resolved["params"]
    matching = {**resolved, "params": {k: v for k, v in params.items() if k not in skip}}
    text = json.dumps(_same_numbers(matching), sort_keys=True, default=str)
    return {
        "backend": resolved["backend"],
        "settings": matching,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "local": {k: v for k, v in params.items() if k in skip},
        "python": conf.stages[stage].python,
    }


def run_stage_settings(conf: Settings) -> dict[str, Any]:
    """Every enabled stage's ``stage_entry``, and one hash over theirs."""
    import hashlib
    import json

    stages = {name: stage_entry(conf, name) for name in conf.enabled_stages()}
    whole = hashlib.sha256(json.dumps({n: s["sha256"] for n, s in stages.items()}, sort_keys=True).encode())
    return {"stages": stages, "sha256": whole.hexdigest()}
