"""The measured seed profiles: keyed as the autoscaler keys the real models' families, used until learned."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import yaml

from tasks.autoscaler import profiles
from tasks.autoscaler.families import families
from tasks.autoscaler.policy import capacity
from worker_config.seed_profiles import SEED_PROFILES
from worker_config.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent.parent
H100 = "NVIDIA H100 80GB HBM3"
COTRACKER = f"{H100}|tracks2d|cotracker|512x384"
GROUNDED_SAM = f"{H100}|masks|grounded_sam|512x384"


@pytest.fixture
def r(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, decode_responses=True)


def test_every_seed_is_the_key_of_a_family_of_the_real_models_config(tmp_path: Path) -> None:
    keys = set()
    gpus = {key.split("|")[0] for key in SEED_PROFILES}  # each seed's GPU, as NVML names it
    # y2r's 2D-tracks variant, and its grounding-dino masks option (GroundingDINO + SAM 2) beside the default SAM 3.
    for masks in ("sam3", "grounded_sam"):
        config = yaml.safe_load((ROOT / "configs" / "real-gpu.yaml").read_text())
        config["stages"]["tracks2d"]["enabled"] = True
        config["stages"]["masks"]["backend"] = masks
        path = tmp_path / f"real-gpu-2d-{masks}.yaml"
        path.write_text(yaml.safe_dump(config))
        conf = load_settings(str(path))
        keys |= {profiles.key_for(conf, gpu, f.stages) for f in families(conf, 0) for gpu in gpus}
    assert set(SEED_PROFILES) <= keys, f"seeds no family would look up: {set(SEED_PROFILES) - keys}"


def test_a_seed_stands_until_a_peak_is_learned_and_an_oom_raises_it(r: redis.Redis) -> None:
    assert profiles.load(r, COTRACKER) is None
    seed = profiles.load_or_seed(r, COTRACKER)
    assert seed is not None and seed.peak_mib == SEED_PROFILES[COTRACKER] and seed.samples == 0
    assert profiles.load_or_seed(r, f"{H100}|tracks2d|cotracker|1024x768") is None
    learned = profiles.learn(r, COTRACKER, 3000.0)
    assert profiles.load_or_seed(r, COTRACKER) == learned and learned.peak_mib == 3000.0
    raised = profiles.raise_after_oom(r, GROUNDED_SAM, 100.0)
    assert raised.peak_mib == pytest.approx(SEED_PROFILES[GROUNDED_SAM] * profiles.OOM_RAISE_FACTOR, abs=0.1)


def test_an_h100_fits_the_measured_workers_with_the_default_headroom() -> None:
    total_mib = 81559  # nvidia-smi's memory.total of the H100 the seeds were measured on
    assert capacity(total_mib, 1024, SEED_PROFILES[COTRACKER]) == 14
    assert capacity(total_mib, 1024, SEED_PROFILES[GROUNDED_SAM]) == 17
