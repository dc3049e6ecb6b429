"""Measured peak GPU memory (MiB) of one worker, by profile field: the autoscaler's profile until it learns its own.

Fields are ``tasks.autoscaler.profiles`` keys, "<GPU name>|<stages>|<backend>|<resolution>". Each
value is the NVML peak of one process running the real upstream model (random weights: same code,
shapes and compute) through framefleet's backend at y2r's settings (configs/real-gpu.yaml):
``bench/gpu_models.sh``, ``bench/gpu_vipe.sh`` and ``bench/gpu_conformance.sh`` at commit b08a959, tables and
commands in docs/archive/notebook.md ("The real models on an H100", "ViPE's `lyra` pipeline through the depth
stage", "TAPIP3D and WiLoR through their upstream code on a GPU").
NVML's figure is what the autoscaler learns (CUDA context and allocator cache included).
"""

from __future__ import annotations

SEED_PROFILES: dict[str, float] = {
    # CoTracker3 offline, one 10-frame window, 64x64 = 4096 queries (tracks2d grid_size 64).
    "NVIDIA H100 80GB HBM3|tracks2d|cotracker|512x384": 5644.0,
    # GroundingDINO-base on the key frame + SAM 2.1 hiera-large through a 120-frame video.
    "NVIDIA H100 80GB HBM3|masks|grounded_sam|512x384": 4640.0,
    # ViPE's lyra pipeline (bench/gpu_vipe.sh, docs/archive/notebook.md "ViPE's `lyra` pipeline through the depth
    # stage"):
    # both SLAM passes, MoGe's keyframes, the alignment and Video-Depth-Anything over 60-90 frames.
    "NVIDIA H100 80GB HBM3|depth|vipe|512x384": 13378.0,
    # SAM 3 (bench/gpu_models.sh MODELS=sam3, docs/archive/notebook.md "SAM 3 on a GPU"): a 40-frame video, detection on
    # the key frame with every query scored as a detection, propagation both ways.
    "NVIDIA H100 80GB HBM3|masks|sam3|512x384": 33910.0,
    # bench/gpu_conformance.sh on an H100, in one call with two other benches (docs/archive/notebook.md, "Three GPU
    # benches in one call"):
    # TAPIP3D as on the H200 below; WiLoR with the detector on 32 frames a call (detection_batch) and
    # WiLoR's network in batches of 256 on a 150-frame video.
    "NVIDIA H100 80GB HBM3|tracks|tapip3d|512x384": 3010.0,
    "NVIDIA H100 80GB HBM3|hands|wilor|512x384": 6210.0,
    # bench/gpu_conformance.sh (docs/archive/notebook.md, "TAPIP3D and WiLoR through their upstream code on a GPU"):
    # TAPIP3D, one 10-frame window of 4096 queries (grid_size 64, no mask), pointops2 built there.
    "NVIDIA H200|tracks|tapip3d|512x384": 3010.0,
    # WiLoR as on the H100 above (the same code and chunks: the detector on 32 frames a call). Measured on the
    # H200 before detection_batch, the detector taking a 150-frame video in one call as y2r's does, it was
    # 16,390 MiB, and that seed kept 16 GB from the chain's other models until WiLoR's first task ended
    # (docs/archive/notebook.md, "The whole chain on four H200s": 3,734 MiB learned there, with the detector stand-in).
    "NVIDIA H200|hands|wilor|512x384": 6210.0,
}
