"""Learned peak GPU memory of one worker, kept in Redis so that a later run starts at the right count.

Hash ``ff:profiles``, field "<gpu name>|<stage set>|<backend>|<resolution>" (e.g.
"NVIDIA H100 80GB HBM3|depth+tracks+hands|synthetic|512x384"), value JSON
{"peak_mib": float, "samples": int, "updated": unix time}. Until a field is learned, ``load_or_seed``
gives the peak measured for it beforehand (``worker_config.seed_profiles``, samples 0).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from tasks import keys
from worker_config.seed_profiles import SEED_PROFILES
from worker_config.settings import Settings

PROFILES_KEY = keys.PROFILES
OOM_RAISE_FACTOR = 1.25


@dataclass(frozen=True)
class Profile:
    """A learned peak (MiB) of one worker, how many samples it came from and when it last changed."""

    peak_mib: float
    samples: int
    updated: float


@dataclass(frozen=True)
class ProfileKey:
    """The field of a profile: GPU model, the stages one worker hosts ('+'-joined), their backends, resolution."""

    gpu_name: str
    stages: str
    backend: str
    resolution: str

    def __str__(self) -> str:
        return f"{self.gpu_name}|{self.stages}|{self.backend}|{self.resolution}"

    @classmethod
    def parse(cls, field: str) -> ProfileKey:
        """Read a field back; the GPU name may hold '|'. Raises ValueError for a field of fewer parts."""
        parts = field.rsplit("|", 3)
        if len(parts) != 4:
            raise ValueError(f"profile field {field!r} is not <gpu name>|<stages>|<backend>|<resolution>")
        return cls(*parts)


def profile_key(gpu_name: str, stages: Iterable[str], backend: str, resolution: str) -> str:
    return str(ProfileKey(gpu_name, "+".join(stages), backend, resolution))


def key_for(conf: Settings, gpu_name: str, stages: Iterable[str]) -> str:
    """The profile key of a worker hosting ``stages`` on a GPU named ``gpu_name`` under ``conf``."""
    stages = list(stages)
    backends = list(dict.fromkeys(conf.stages[s].backend for s in stages))
    from tasks.stages import source_stage

    params = conf.stages[source_stage().name].params
    resolution = f"{int(params.get('width', 512))}x{int(params.get('height', 384))}"
    return profile_key(gpu_name, stages, "+".join(backends), resolution)


def load(r: redis.Redis, key: str) -> Profile | None:
    """Return the profile under ``key``, or None when none is learned (or it is unreadable)."""
    return parse(r.hget(PROFILES_KEY, key))


def seeded(key: str) -> Profile | None:
    """The measured seed of ``key`` (samples 0), or None when no seed was measured for it."""
    peak = SEED_PROFILES.get(key)
    return None if peak is None else Profile(float(peak), 0, 0.0)


def load_or_seed(r: redis.Redis, key: str) -> Profile | None:
    """The learned profile under ``key``, else its measured seed, else None. A learned peak replaces the seed."""
    return load(r, key) or seeded(key)


def load_all(r: redis.Redis) -> dict[str, Profile | None]:
    """Every stored profile by field; None where the value is unreadable."""
    # get_redis decodes responses: the fields are str
    stored: dict[str, str] = r.hgetall(PROFILES_KEY)  # type: ignore[assignment]
    return {field: parse(raw) for field, raw in stored.items()}


def learn(r: redis.Redis, key: str, peak_mib: float) -> Profile:
    """Record one observed peak (MiB); the stored peak is the largest seen. Returns the stored profile."""
    return _update(r, key, lambda old: max(old, float(peak_mib)))


def raise_after_oom(r: redis.Redis, key: str, observed_mib: float) -> Profile:
    """After an OOM, set the peak to max(peak x 1.25, ``observed_mib``), the peak being the learned one
    or else the seed: it was too low."""
    seed = seeded(key)
    base = seed.peak_mib if seed else 0.0
    return _update(r, key, lambda old: max((old or base) * OOM_RAISE_FACTOR, float(observed_mib)))


def _update(r: redis.Redis, key: str, new_peak: Any) -> Profile:
    if not key:
        raise ValueError("a profile key must not be empty")
    result: list[Profile] = []

    def swap(pipe: Any) -> None:
        old = parse(pipe.hget(PROFILES_KEY, key))
        profile = Profile(
            peak_mib=round(float(new_peak(old.peak_mib if old else 0.0)), 1),
            samples=(old.samples if old else 0) + 1,
            updated=time.time(),
        )
        pipe.multi()
        pipe.hset(PROFILES_KEY, key, json.dumps(profile.__dict__))
        result[:] = [profile]

    # WATCH makes read-modify-write safe against the autoscaler of another host.
    r.transaction(swap, PROFILES_KEY)
    return result[0]


def parse(raw: str | bytes | None) -> Profile | None:
    """A stored value as a Profile; None when missing or unreadable (no numeric peak_mib)."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return Profile(float(data["peak_mib"]), int(data.get("samples", 0)), float(data.get("updated", 0)))
    except (ValueError, KeyError, TypeError):
        return None
