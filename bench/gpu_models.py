"""Profile the real upstream models through framefleet's backends, with random weights, at y2r's settings.

    python bench/gpu_models.py --upstream DIR --clip CLIP.mp4 --out OUT [--models cotracker,grounded_sam,sam3]

DIR holds the upstream checkouts (``facebookresearch+co-tracker``, ``facebookresearch+sam2``,
``facebookresearch+sam3``) at deploy/envs/pins.sh's commits, as bench/gpu_lib.sh's ``upstream`` lays them out.
Each model runs in two fresh processes: one writes random weights in the upstream checkpoint format (same code, shapes
and compute as the trained model), the other loads the backend and runs it, so that its peaks are its own: GPU memory by
NVML for this process (sampled every 20 ms) and by torch (max allocated and reserved), host RSS,
load time and seconds per window or frame. Frames are CLIP's first ``--frames`` frames resized
to 512x384 (y2r's size; 10 fps clips). Writes OUT/<model>.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
import unittest.mock
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
WIDTH, HEIGHT = 512, 384
WINDOW = 10  # configs/real-gpu.yaml: tracks/tracks2d window_length 10, stride 1
GRID = 64  # configs/real-gpu.yaml: tracks2d grid_size 64 (a 64x64 grid of queries)
PROMPT = "red t-shaped block"


class NvmlPeak:
    """Samples this process's GPU memory (NVML, MiB) and the device's used memory in a thread; keeps the peaks."""

    def __init__(self, index: int = 0, period_s: float = 0.02) -> None:
        """``index``: CUDA's device index; under ``CUDA_VISIBLE_DEVICES`` its entry names the GPU NVML reads
        (an NVML index, in PCI bus order: CUDA's on a host of identical GPUs, or a whole "GPU-…" UUID)."""
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        visible = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
        entry = visible[index] if index < len(visible) else str(index)
        if entry.startswith("GPU-"):
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(entry)
        else:
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(int(entry))
        self.gpu_name = pynvml.nvmlDeviceGetName(self.handle)
        self.baseline_mib = pynvml.nvmlDeviceGetMemoryInfo(self.handle).used / 2**20
        self.process_mib = 0.0
        self.device_mib = 0.0
        self.seen = False
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pid = os.getpid()
        while not self._stop.is_set():
            self.sample(pid)
            self._stop.wait(self.period_s)

    def sample(self, pid: int) -> None:
        nv = self.nvml
        used = nv.nvmlDeviceGetMemoryInfo(self.handle).used / 2**20 - self.baseline_mib
        self.device_mib = max(self.device_mib, used)
        for proc in nv.nvmlDeviceGetComputeRunningProcesses(self.handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                self.seen = True
                self.process_mib = max(self.process_mib, proc.usedGpuMemory / 2**20)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample(os.getpid())


def clip_frames(clip: Path, count: int) -> np.ndarray:
    """The first ``count`` frames of ``clip`` as (T, 384, 512, 3) uint8 RGB (looped if the clip is shorter)."""
    import cv2

    cap = cv2.VideoCapture(str(clip))
    frames = []
    while len(frames) < count:
        ok, bgr = cap.read()
        if not ok:
            if not frames:
                raise SystemExit(f"cannot read frames from {clip}: is it a video OpenCV can decode?")
            frames += frames[: count - len(frames)]
            continue
        frames.append(cv2.resize(bgr, (WIDTH, HEIGHT), interpolation=cv2.INTER_AREA)[..., ::-1])
    return np.ascontiguousarray(np.stack(frames[:count]))


def prepare(model: str, upstream: Path, weights: Path) -> None:
    """Write random weights of ``model`` into ``weights`` in the format its backend loads."""
    import torch

    torch.manual_seed(0)
    weights.mkdir(parents=True, exist_ok=True)
    if model == "cotracker":
        sys.path.insert(0, str(upstream / "facebookresearch+co-tracker"))
        from cotracker.models.build_cotracker import build_cotracker

        # hubconf.py:40-47: cotracker3_offline is build_cotracker(offline=True, window_len=60, v2=False).
        net = build_cotracker(checkpoint=None, offline=True, window_len=60, v2=False)
        torch.save(net.state_dict(), weights / "scaled_offline.pth")
    elif model == "grounded_sam":
        sys.path.insert(0, str(upstream / "facebookresearch+sam2"))
        from sam2.build_sam import build_sam2

        sam = build_sam2("configs/sam2.1/sam2.1_hiera_l.yaml", None, device="cpu")
        torch.save({"model": sam.state_dict()}, weights / "sam2.1_hiera_large.pt")
        grounding_dino_base(weights / "grounding-dino-base")
    elif model == "wilor":
        wilor_files(upstream / "rolpotamias+WiLoR", weights)
    elif model == "sam3":
        sam3_files(upstream / "facebookresearch+sam3", weights)
    else:
        raise SystemExit(f"unknown model {model!r}: choose cotracker, grounded_sam, sam3 or wilor")


SAM3_BPE = "bpe_simple_vocab_16e6.txt.gz"


def sam3_files(repo: Path, weights: Path) -> None:
    """SAM 3 from its own builder with random weights, saved as ``sam3.pt`` ({"model": state dict}, as
    model_builder.py:777-784 loads it) twice: ``found/``, whose scoring makes every query a detection
    (so the tracker follows objects), and ``none/``, whose scoring finds nothing. The tokenizer's
    vocabulary (package data, not in the source snapshot) is replaced by a few merges in its format:
    the text encoder's cost is set by its fixed context of 32 tokens, not by the vocabulary."""
    import gzip

    import torch

    sys.path.insert(0, str(repo))
    from sam3.model_builder import build_sam3_video_model

    bpe = weights / SAM3_BPE
    bpe.write_bytes(gzip.compress(b"#version: 0.2\nr e\nre d</w>\nb l\nbl o\nblo c\nbloc k</w>\n", mtime=0))
    model = build_sam3_video_model(checkpoint_path=None, load_from_HF=False, bpe_path=str(bpe), device="cpu")
    scoring = model.detector.dot_prod_scoring  # model_misc.py:68-93: (hs_proj . prompt_proj) / 16, clamped to 12
    presence = model.detector.transformer.decoder.presence_token_head.layers[-1]  # decoder.py:295-298
    for name, sign in (("found", 1.0), ("none", -1.0)):
        with torch.no_grad():
            for layer in (scoring.hs_proj, scoring.prompt_proj):
                layer.weight.zero_()
                layer.bias.fill_(1.0)
            scoring.prompt_proj.bias.mul_(sign)  # every query scores +12 (found) or -12 (none)
            presence.weight.zero_()
            presence.bias.fill_(10.0)  # the object is present: the joint score is the query's
        (weights / name).mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict()}, weights / name / "sam3.pt")


def sam3_logged(backend: Any, requests: list[dict[str, Any]], images: list[Any]) -> None:
    """Record each request ``backend``'s SAM 3 predictor gets (and the first session's images) as it answers it."""
    predictor = backend._predictor
    handle = predictor.handle_request

    def logged(request: dict[str, Any]) -> Any:
        response = handle(request)
        entry = {k: v for k, v in request.items() if k in ("type", "frame_index", "text")}
        if request["type"] == "add_prompt":
            entry["objects"] = len(response["outputs"]["out_obj_ids"])
        if request["type"] == "start_session" and not images:
            images.append(predictor._ALL_INFERENCE_STATES[response["session_id"]]["state"]["input_batch"].img_batch)
        requests.append(entry)
        return response

    predictor.handle_request = logged


def sam3_run(weights: Path, frames: np.ndarray, device: str, result: dict[str, Any]) -> list[float]:
    """Time the ``sam3`` backend on ``frames`` (the ``found`` checkpoint) and check what SAM 3 was given and did;
    then, with that model freed (the peaks stay its own), check that the ``none`` checkpoint gives no mask."""
    import gc

    import torch
    from torchvision.transforms import functional as TF

    from tasks.backends.sam3 import Sam3Masks

    def load(name: str) -> Sam3Masks:
        t0 = time.perf_counter()
        backend = Sam3Masks(weights_dir=str(weights / name), bpe_path=str(weights / SAM3_BPE))
        backend.load(device)
        result[f"load_{name}_s"] = round(time.perf_counter() - t0, 2)
        return backend

    found = load("found")
    requests: list[dict[str, Any]] = []
    images: list[Any] = []
    sam3_logged(found, requests, images)
    result["unit"] = f"frame of a {len(frames)}-frame video (SAM 3: detection on the key frame, propagation both ways)"
    times, masks = [], None
    for _ in range(2):
        t = time.perf_counter()
        masks = found.segment(frames, PROMPT)
        times.append((time.perf_counter() - t) / len(frames))
    result["found_requests"] = requests[: len(requests) // 2]
    result["masks"] = (
        None
        if masks is None
        else {
            "shape": list(masks.shape),
            "dtype": str(masks.dtype),
            "fraction": round(float(masks.mean()), 4),
            "frames_with_mask": int(masks.any(axis=(1, 2)).sum()),
        }
    )
    # io_utils.py:157-211 and 333-339: the PNG frames, resized by torchvision to 1008 square, in float16 around 0.5.
    expected = torch.stack([TF.to_tensor(TF.resize(Image.fromarray(f), size=(1008, 1008))) for f in frames]).half()
    result["images_equal"] = bool(torch.equal(images[0].cpu(), (expected - 0.5) / 0.5))
    result["load_s"] = result["load_found_s"]
    del found, images[:]
    gc.collect()
    torch.cuda.empty_cache()
    none = load("none")
    requests.clear()
    sam3_logged(none, requests, images)
    result["none_masks"] = "None" if none.segment(frames, PROMPT) is None else "a mask"
    result["none_requests"] = list(requests)
    return times


def wilor_files(repo: Path, weights: Path) -> None:
    """Random MANO files in MANO's shapes (the real ones are licensed) in ``repo``/mano_data, and a random
    WiLoR checkpoint in Lightning's format in ``weights``, built from the checkout's model_config.yaml."""
    import pickle
    import shutil

    import scipy.sparse
    import torch

    rng = np.random.default_rng(0)
    mano = repo / "mano_data"
    mano.mkdir(exist_ok=True)
    parents = np.array([2**32 - 1, 0, 1, 2, 0, 4, 5, 0, 7, 8, 0, 10, 11, 0, 13, 14], np.int64)
    weights_lbs = rng.random((778, 16))
    mano_right = {  # MANO_RIGHT.pkl's arrays (778 vertices, 1538 faces, 16 joints, 10 betas)
        "v_template": rng.normal(0, 0.05, (778, 3)),
        "shapedirs": rng.normal(0, 1e-3, (778, 3, 10)),
        "posedirs": rng.normal(0, 1e-3, (778, 3, 135)),
        "J_regressor": scipy.sparse.csc_matrix(rng.random((16, 778)) / 778),
        "kintree_table": np.stack([parents, np.arange(16)]),
        "weights": weights_lbs / weights_lbs.sum(1, keepdims=True),
        "f": rng.integers(0, 778, (1538, 3)).astype(np.uint32),
        "hands_components": rng.normal(0, 1, (45, 45)),
        "hands_mean": np.zeros(45),
    }
    with open(mano / "MANO_RIGHT.pkl", "wb") as f:
        pickle.dump(mano_right, f)
    identity6d = np.tile(np.array([1, 0, 0, 1, 0, 0], np.float32), 16)  # 16 rotations in 6D
    np.savez(mano / "mano_mean_params.npz", pose=identity6d, shape=np.zeros(10, np.float32), cam=np.array([0.9, 0, 0]))
    sys.path.insert(0, str(repo))
    os.chdir(repo)  # WiLoR reads ./mano_data (wilor/models/__init__.py:28-33)
    # pyrender: WiLoR's renderers (built at load) use it; nothing renders here, and it needs EGL.
    sys.modules.setdefault("pyrender", unittest.mock.MagicMock())
    import pytorch_lightning as pl
    from wilor.configs import get_config
    from wilor.models import WiLoR

    weights.mkdir(parents=True, exist_ok=True)
    shutil.copy(repo / "pretrained_models" / "model_config.yaml", weights / "model_config.yaml")
    cfg = get_config(str(weights / "model_config.yaml"), update_cachedir=True)
    cfg.defrost()
    cfg.MODEL.BACKBONE.pop("PRETRAINED_WEIGHTS", None)
    cfg.MANO.DATA_DIR = cfg.MANO.MODEL_PATH = "./mano_data/"
    cfg.MANO.MEAN_PARAMS = "./mano_data/mano_mean_params.npz"
    cfg.freeze()
    net = WiLoR(cfg, init_renderer=False)
    torch.save(
        {"state_dict": net.state_dict(), "pytorch-lightning_version": pl.__version__},
        weights / "wilor_final.ckpt",
    )


def wilor_run(repo: Path, weights: Path, frames: np.ndarray, device: str, result: dict[str, Any]) -> list[float]:
    """Load WiLoR as the backend does (``load_wilor``) and time it on y2r's batches of hand crops."""
    import torch

    sys.path.insert(0, str(repo))
    os.chdir(repo)
    sys.modules.setdefault("pyrender", unittest.mock.MagicMock())
    from wilor.models import load_wilor

    t0 = time.perf_counter()
    model, cfg = load_wilor(
        checkpoint_path=str(weights / "wilor_final.ckpt"), cfg_path=str(weights / "model_config.yaml")
    )
    model = model.to(device).eval()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    result["load_s"] = round(time.perf_counter() - t0, 2)
    result["after_load_torch_mib"] = round(torch.cuda.memory_allocated() / 2**20, 1) if device != "cpu" else None
    # Two hands per frame, cropped to 256x256 as ViTDetDataset does, in batches of 256 (real-gpu.yaml).
    crops = len(frames) * 2
    batch = min(256, crops)
    result["unit"] = f"frame (2 hand crops; batches of {batch}, {crops} crops)"
    mean = torch.tensor(cfg.MODEL.IMAGE_MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(cfg.MODEL.IMAGE_STD).view(1, 3, 1, 1) * 255
    src = torch.from_numpy(frames[:, :256, :256]).permute(0, 3, 1, 2).float()
    imgs = ((src.repeat_interleave(2, 0) - mean) / std).to(device)
    times = []
    for _ in range(3):
        t = time.perf_counter()
        with torch.no_grad():
            for i in range(0, crops, batch):
                out = model({"img": imgs[i : i + batch]})
                out["pred_cam"].cpu()
        times.append((time.perf_counter() - t) / len(frames))
    result["detector"] = "not run: the YOLO detector's size is not in the checkout"
    return times


def grounding_dino_base(folder: Path) -> None:
    """Save a random GroundingDINO with IDEA-Research/grounding-dino-base's architecture, and a processor."""
    import transformers as tf

    # IDEA-Research/grounding-dino-base config.json: Swin-B (384, window 12), 6+6 layers, 900 queries.
    swin = tf.SwinConfig(
        embed_dim=128,
        depths=[2, 2, 18, 2],
        num_heads=[4, 8, 16, 32],
        window_size=12,
        image_size=384,
        out_features=["stage2", "stage3", "stage4"],
        out_indices=[2, 3, 4],
    )
    config = tf.GroundingDinoConfig(backbone_config=swin, text_config=tf.BertConfig())
    tf.GroundingDinoForObjectDetection(config).save_pretrained(folder)
    # bert-base-uncased's vocabulary cannot be fetched here; the prompt's words are enough: the text
    # encoder's cost depends on the token count, not on the vocabulary.
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "-", *PROMPT.split(), "t", "shaped"]
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(dict.fromkeys(words)) + "\n")
    tokenizer = tf.BertTokenizerFast(vocab_file=str(vocab))
    tf.GroundingDinoProcessor(image_processor=tf.GroundingDinoImageProcessor(), tokenizer=tokenizer).save_pretrained(
        folder
    )


def run(
    model: str, upstream: Path, weights: Path, frames: np.ndarray, windows: int, device: str, grid: int = GRID
) -> dict[str, Any]:
    """Load ``model``'s backend on ``device`` and run it at y2r's settings; return the measurements."""
    import torch

    sys.path.insert(0, str(ROOT))
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    peak = NvmlPeak() if cuda else None
    result: dict[str, Any] = {"model": model, "frames": len(frames), "size": f"{WIDTH}x{HEIGHT}"}
    t0 = time.perf_counter()
    if model in ("wilor", "sam3"):
        backend = None
    elif model == "cotracker":
        sys.path.insert(0, str(upstream / "facebookresearch+co-tracker"))
        from tasks.backends.cotracker import CoTrackerTracks2D

        backend: Any = CoTrackerTracks2D(weights_dir=str(weights), visibility_threshold=0.95)
        backend.load(device)
    else:
        sys.path.insert(0, str(upstream / "facebookresearch+sam2"))
        from tasks.backends.grounded_sam import GroundedSamMasks

        backend = GroundedSamMasks(weights_dir=str(weights), box_threshold=0.3, key_frame_idx=0)
        backend.load(device)
    sync()
    result["load_s"] = round(time.perf_counter() - t0, 2)
    result["after_load_torch_mib"] = round(torch.cuda.memory_allocated() / 2**20, 1) if cuda else None
    times: list[float] = []
    if model == "wilor":
        times = wilor_run(upstream / "rolpotamias+WiLoR", weights, frames, device, result)
    elif model == "sam3":
        sys.path.insert(0, str(upstream / "facebookresearch+sam3"))
        times = sam3_run(weights, frames, device, result)
    elif model == "cotracker":
        u, v = np.meshgrid(np.linspace(0, WIDTH - 1, grid), np.linspace(0, HEIGHT - 1, grid))
        queries = np.stack([u.ravel(), v.ravel()], axis=1).astype(np.float32)
        result["unit"] = f"window of {WINDOW} frames, {len(queries)} queries"
        for s in range(min(windows + 1, len(frames) - WINDOW + 1)):
            t = time.perf_counter()
            backend.track2d(frames[s : s + WINDOW], queries)
            times.append(time.perf_counter() - t)
    else:
        # Random weights detect nothing above box_threshold, and segment() would then skip SAM 2: time
        # the detector on the key frame and SAM 2's propagation of a box through every frame apart.
        det = []
        for _ in range(6):
            t = time.perf_counter()
            backend._boxes(frames[0], PROMPT + ".")
            det.append(time.perf_counter() - t)
        result["detect_first_s"] = round(det[0], 3)
        result["detect_s"] = round(statistics.median(det[1:]), 3)
        box = np.array([WIDTH * 0.3, HEIGHT * 0.3, WIDTH * 0.7, HEIGHT * 0.7], np.float32)
        result["unit"] = f"frame of a {len(frames)}-frame video (SAM 2.1-L propagation, one box)"
        for _ in range(2):
            t = time.perf_counter()
            backend._propagate(frames, box[None], 0)
            times.append((time.perf_counter() - t) / len(frames))
    sync()
    if peak is not None:
        peak.stop()
    result["first_unit_s"] = round(times[0], 4)
    result["unit_s"] = round(statistics.median(times[1:]) if len(times) > 1 else times[0], 4)
    result["units"] = len(times)
    mib = 2**20
    result["torch_peak_allocated_mib"] = round(torch.cuda.max_memory_allocated() / mib, 1) if cuda else None
    result["torch_peak_reserved_mib"] = round(torch.cuda.max_memory_reserved() / mib, 1) if cuda else None
    result["nvml_process_peak_mib"] = round(peak.process_mib, 1) if peak and peak.seen else None
    result["nvml_device_peak_mib"] = round(peak.device_mib, 1) if peak else None
    result["host_rss_peak_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    result["gpu"] = peak.gpu_name if peak else "none (CPU)"
    result["torch"] = torch.__version__
    result["cuda"] = torch.version.cuda
    return result


def table(rows: list[dict[str, Any]]) -> str:
    head = "| model | load s | s per unit (first) | unit | torch peak MiB | NVML process peak MiB | host RSS MiB |"
    lines = [head, "|" + "---|" * 7]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | failed: {r['error'][-200:]} ||||||")
            continue
        unit_s = f"{r['unit_s']} ({r['first_unit_s']})"
        if "detect_s" in r:
            unit_s += f"; detection {r['detect_s']} s per key frame ({r['detect_first_s']})"
        lines.append(
            f"| {r['model']} | {r['load_s']} | {unit_s} | {r['unit']} | {r['torch_peak_allocated_mib']} "
            f"(reserved {r['torch_peak_reserved_mib']}) | {r['nvml_process_peak_mib']} | {r['host_rss_peak_mib']} |"
        )
    return "\n".join(lines)


def pack(model: str, count: int, common: list[str], out: Path) -> dict[str, Any]:
    """Run ``count`` processes of ``model`` at once on GPU 0; their peaks, pace and the device's peak."""
    device = NvmlPeak()
    procs = []
    for i in range(count):
        folder = out / f"pack-{model}-{count}-{i}"
        folder.mkdir(parents=True, exist_ok=True)
        argv = [*common, "--step", "run", "--out", str(folder)]  # the later --out wins
        with open(folder / "run.log", "w") as log:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait() for p in procs]
    device.stop()
    found = [json.loads(f.read_text()) for f in sorted(out.glob(f"pack-{model}-{count}-*/{model}.json"))]
    row: dict[str, Any] = {"model": model, "processes": count, "failed": sum(c != 0 for c in codes)}
    if found:
        row["unit_s_median"] = round(statistics.median(r["unit_s"] for r in found), 4)
        row["units_per_s"] = round(sum(1 / r["unit_s"] for r in found), 2)
        row["nvml_process_peak_mib_max"] = max(r["nvml_process_peak_mib"] or 0 for r in found)
        row["nvml_device_peak_mib"] = round(device.device_mib, 1)
        row["host_rss_peak_mib_sum"] = round(sum(r["host_rss_peak_mib"] for r in found), 1)
    return row


def pack_table(packs: list[dict[str, Any]]) -> str:
    head = "| model | processes at once | failed | s per unit (median) | units/s, all | NVML peak per process, max MiB"
    lines = [head + " | GPU used peak MiB | host RSS, sum MiB |", "|" + "---|" * 8]
    for p in packs:
        lines.append(
            f"| {p['model']} | {p['processes']} | {p['failed']} | {p.get('unit_s_median')} | {p.get('units_per_s')} "
            f"| {p.get('nvml_process_peak_mib_max')} | {p.get('nvml_device_peak_mib')} "
            f"| {p.get('host_rss_peak_mib_sum')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", type=Path, required=True)
    parser.add_argument("--clip", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="cotracker,grounded_sam")
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--step", choices=["all", "prepare", "run"], default="all")
    parser.add_argument("--weights", type=Path, default=Path("/tmp/ff-random-weights"))
    parser.add_argument("--grid", type=int, default=GRID, help="CoTracker's queries: a grid x grid grid")
    parser.add_argument("--device", default="cuda:0", help="cpu only to try the script out: no GPU numbers")
    parser.add_argument("--pack", default="", help="e.g. 1,2,4: also run that many processes of a model at once")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step == "prepare":
        prepare(args.models, args.upstream, args.weights / args.models)
        return
    if args.step == "run":
        frames = clip_frames(args.clip, args.frames)
        result = run(
            args.models, args.upstream, args.weights / args.models, frames, args.windows, args.device, args.grid
        )
        (args.out / f"{args.models}.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result))
        return
    rows: list[dict[str, Any]] = []
    packs: list[dict[str, Any]] = []
    for model in args.models.split(","):
        common = [sys.executable, __file__, "--upstream", str(args.upstream), "--clip", str(args.clip)]
        common += ["--out", str(args.out), "--models", model, "--weights", str(args.weights)]
        common += ["--frames", str(args.frames), "--windows", str(args.windows), "--device", args.device]
        common += ["--grid", str(args.grid)]
        for step in ("prepare", "run"):
            done = subprocess.run([*common, "--step", step], capture_output=True, text=True)
            (args.out / f"{model}-{step}.log").write_text(done.stdout + done.stderr)
            if done.returncode != 0:
                rows.append({"model": model, "error": f"{step} exit {done.returncode}: {done.stderr[-400:]}"})
                break
        else:
            rows.append(json.loads((args.out / f"{model}.json").read_text()))
            packs += [pack(model, int(k), common, args.out) for k in args.pack.split(",") if k]
    text = table(rows) + ("\n\n" + pack_table(packs) if packs else "")
    (args.out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
