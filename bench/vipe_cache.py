"""Write ViPE's model cache with random weights: every file a pipeline opens, in the format and place upstream loads it.

    python bench/vipe_cache.py --vipe SRC/hgupt3+vipe --moge SRC/microsoft+MoGe --cache DIR [--pipeline lyra]

The files are those ``tasks.backends.vipe_files.needed_files`` lists for the composed pipeline
(y2r's ``lyra``: DroidNet, MoGe, GeoCalib, Video-Depth-Anything, PriorDA and TrackAnything's SAM,
DeAOT, GroundingDINO and BERT). Each network is built by the upstream classes themselves
(hgupt3/vipe, microsoft/MoGe) with their random initial weights and saved as the downloaded
checkpoint is laid out: a bare state dict, ``{"model": ...}``, ``{"state_dict": ...}``,
``{"model_config", "model"}``, or a Hugging Face model folder, under ``DIR/torch/hub`` (torch
hub's cache) and ``DIR/huggingface/hub`` (the HF hub's cache: ``models--<org>--<name>/
snapshots/<commit>/`` and ``refs/main``). Same code, shapes, memory and compute as the trained
weights; only the values differ (and a few last layers, set so that random weights give what the
pipeline can go on with: GroundingDINO's class score detects nothing, see ``grounding_dino``; MoGe
sees a tilted plane, see ``plane_point_map``; the Depth Anything heads give positive disparity,
see ``positive_disparity``). BERT's vocabulary is made here: bert-base-uncased's size
(30,522) with [CLS], [SEP] and "." at the ids GroundingDINO's code names (101, 102, 1012).
Prints one JSON line: each file, its size and the seconds it took.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import string
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Any 40-hex commit: the HF hub's offline lookup reads refs/main and opens snapshots/<it>/<file>.
SNAPSHOT = hashlib.sha1(b"framefleet random weights").hexdigest()
BERT_VOCAB = 30522  # bert-base-uncased


def compose(vipe_src: Path, pipeline: str) -> Any:
    """ViPE's hydra config for ``pipeline`` composed as y2r composes it (only the pipeline group matters here)."""
    import hydra
    from omegaconf import OmegaConf

    for name, fn in (("eq", lambda a, b: a == b), ("neq", lambda a, b: a != b)):  # vipe/__init__.py registers them
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    with hydra.initialize_config_dir(config_dir=str(vipe_src / "configs"), version_base=None):
        return hydra.compose("default", overrides=[f"pipeline={pipeline}"])


def hf_snapshot(cache: Path, repo: str) -> Path:
    """The snapshot folder of ``repo`` in the HF hub cache under ``cache``, with refs/main pointing at it."""
    folder = cache / "huggingface" / "hub" / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(SNAPSHOT)
    snap = folder / "snapshots" / SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    return snap


def droid(path: Path) -> None:
    """vipe/slam/networks/droid_net.py:503-540: DroidNet's state dict, loaded with weights_only=True."""
    import torch
    from vipe.slam.networks.droid_net import DroidNet

    load_weights = DroidNet.load_weights
    DroidNet.load_weights = lambda self: None  # type: ignore[method-assign]  # the constructor loads droid.pth
    try:
        net = DroidNet()
    finally:
        DroidNet.load_weights = load_weights  # type: ignore[method-assign]
    torch.save(net.state_dict(), path)


def moge(path: Path, moge_src: Path) -> None:
    """MoGe v1 (moge/model/v1.py:214-242): ``{"model_config", "model"}``; the config is MoGe's own v1 training one."""
    import torch
    from moge.model.v1 import MoGeModel

    config = json.loads((moge_src / "configs" / "train" / "v1.json").read_text())["model"]
    model = MoGeModel(**config)
    plane_point_map(model)
    torch.save({"model_config": config, "model": model.state_dict()}, path)


def plane_point_map(model: Any, depth_m: float = 2.0, tilt: float = 0.5, focal: float = 1.0) -> None:
    """Make a random MoGe v1 see a tilted plane: every pixel valid, depth 1.5-2.7 m, nearer at the bottom.

    Random weights give no usable depth: ViPE's MoGe wrapper (vipe/priors/depth/moge.py:70-78) keeps
    depth only where MoGe's mask logit passes 0.5 and clamps the rest to 0, and the random mask
    passes nowhere, so the depth alignment had no valid target (alignment.py:39-51). The head's
    output blocks (moge/model/v1.py:103-109: conv 3x3, ReLU, conv 1x1) see the view-plane uv as
    their last two input channels (v1.py:133-136); here two hidden channels carry u + 1 and v + 1
    and the last conv makes points ``(u / f, v / f, log z)`` with ``z = depth_m * exp(-tilt * v)``,
    which the 'exp' remap (v1.py:258-261) turns into a pinhole point map of focal ``f`` (relative
    to the half diagonal, as MoGe's). ``infer`` then finds its z shift as for a trained map
    (v1.py:356-373); the mask's logit is 1 everywhere. The backbone and the rest stay random.
    """
    import math

    import torch

    points, mask = model.head.output_block  # dim_out=[3, 1] (v1.py:189)
    hidden, last = points[0], points[-1]
    u, v = hidden.in_channels - 2, hidden.in_channels - 1
    with torch.no_grad():
        for channel, source in ((0, u), (1, v)):
            hidden.weight[channel].zero_()
            hidden.weight[channel, source, 1, 1] = 1.0  # the 3x3 kernel's centre
            hidden.bias[channel] = 1.0  # |u|, |v| < 1, so the ReLU passes u + 1 and v + 1
        last.weight.zero_()
        last.weight[0, 0], last.bias[0] = 1 / focal, -1 / focal
        last.weight[1, 1], last.bias[1] = 1 / focal, -1 / focal
        last.weight[2, 1], last.bias[2] = -tilt, math.log(depth_m) + tilt
        mask[-1].weight.zero_()
        mask[-1].bias.fill_(1.0)


def geocalib(path: Path) -> None:
    """vipe/priors/geocalib/extractor.py:31-45: ``{"model": GeoCalib's state dict}``."""
    import torch
    from vipe.priors.geocalib.geocalib import GeoCalib

    torch.save({"model": GeoCalib().state_dict()}, path)


def video_depth_anything(path: Path, variant: str) -> None:
    """vipe/priors/depth/videodepthanything/__init__.py:30-62: a bare state dict, loaded strictly.

    Upstream's wrapper is constructed up to its download, so the network has its own config table.
    """
    import torch
    from vipe.priors.depth.videodepthanything import VideoDepthAnythingDepthModel

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise _Stop

    wrapper = VideoDepthAnythingDepthModel.__new__(VideoDepthAnythingDepthModel)
    original = torch.hub.load_state_dict_from_url
    torch.hub.load_state_dict_from_url = stop  # type: ignore[assignment]
    try:
        wrapper.__init__(model=variant)  # type: ignore[misc]
    except _Stop:
        pass
    finally:
        torch.hub.load_state_dict_from_url = original  # type: ignore[assignment]
    positive_disparity(wrapper.model.head.scratch.output_conv2[2])
    torch.save(wrapper.model.state_dict(), path)


def positive_disparity(last: Any, floor: float = 0.01) -> None:
    """Make a Depth Anything head's last conv (1x1, 32 -> 1, after a ReLU) give at least ``floor`` everywhere.

    Random, it gives 0 on most pixels (its ReLU output, dav2/dpt.py:137-148): on the clip,
    Video-Depth-Anything's inverse depth passed ViPE's 1e-3 alignment threshold
    (processors.py:337) on 1 % of a frame, at most 0.006. Its weights made non-negative on the
    non-negative features, and its bias ``floor``, the output is ``floor`` plus a random,
    image-dependent sum: positive, finite and varying, as the alignment's quantiles need.
    """
    import torch

    with torch.no_grad():
        last.weight.abs_()
        last.bias.fill_(floor)


class _Stop(Exception):
    pass


def prior_da(frozen: Path, conditioned: Path) -> None:
    """vipe/priors/depth/priorda/priorda.py:54-100 and dav2/: Depth Anything V2 ViT-B, twice.

    ``depth_anything_v2_vitb.pth`` is a bare state dict loaded strictly by both the frozen model and,
    before its conditioning layers are added, the conditioned one; ``prior_depth_anything_vitb.pth``
    is ``{"model": ...}`` of the conditioned model after ``init_state_dict`` (alpha conv added,
    resConfUnit1 and mask_token removed).
    """
    import torch
    from vipe.priors.depth.priorda.dav2 import model_configs
    from vipe.priors.depth.priorda.dav2.dpt import DepthAnythingV2

    frozen_model = DepthAnythingV2(**model_configs["vitb"], encoder_cond_dim=-1)
    positive_disparity(frozen_model.depth_head.scratch.output_conv2[2])  # the conditioned one starts from it
    base = frozen_model.state_dict()
    torch.save(base, frozen)
    cond = DepthAnythingV2(**model_configs["vitb"], encoder_cond_dim=3)
    cond.init_state_dict(state_dict=base)
    torch.save({"model": cond.state_dict()}, conditioned)


def sam_vit_b(path: Path) -> None:
    """vipe/priors/track_anything/sam/build_sam.py:43-113: SAM ViT-B's bare state dict (weights_only=True)."""
    import torch
    from vipe.priors.track_anything.sam.build_sam import build_sam_vit_b

    torch.save(build_sam_vit_b(checkpoint=None).state_dict(), path)


def deaot(path: Path) -> None:
    """vipe/priors/track_anything/aot_tracker.py:17-24,183-190 and aot/utils/checkpoint.py:76-102: DeAOT-L R50,
    built from the PRE_YTB_DAV engine config as ``get_aot`` builds it, saved as ``{"state_dict": ...}``."""
    import torch
    from vipe.priors.track_anything.aot import config as engine_config
    from vipe.priors.track_anything.aot.networks.models import build_vos_model

    cfg = engine_config.EngineConfig("PRE_YTB_DAV")
    torch.save({"state_dict": build_vos_model(cfg.MODEL_VOS, cfg).state_dict()}, path)


def bert(cache: Path) -> None:
    """bert-base-uncased as GroundingDINO's text encoder loads it (groundingdino/util/get_tokenlizer.py):
    a random BertModel of the default (base) config and a tokenizer over a made-up vocabulary of its size."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    snap = hf_snapshot(cache, "bert-base-uncased")
    BertModel(BertConfig()).save_pretrained(snap)
    vocab = bert_vocab()
    (snap / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(snap / "vocab.txt"), do_lower_case=True).save_pretrained(snap)


def bert_vocab() -> list[str]:
    """A WordPiece vocabulary of bert-base-uncased's size with its special tokens and punctuation at their ids."""
    vocab = [f"[unused{i}]" for i in range(BERT_VOCAB)]
    vocab[0], vocab[100], vocab[101], vocab[102], vocab[103] = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
    # bert-base-uncased's single characters start at 999 in ASCII order without capitals ("." at 1012).
    chars = [c for c in map(chr, range(33, 127)) if not c.isupper()]
    for i, c in enumerate(chars):
        vocab[999 + i] = c
    pieces = [f"##{c}" for c in string.ascii_lowercase + string.digits]
    for i, p in enumerate(pieces):
        vocab[2000 + i] = p
    return vocab


def grounding_dino(path: Path) -> None:
    """vipe/priors/track_anything/detector.py:17-28: GroundingDINO Swin-T (OGC) as ``{"model": ...}``.

    Built from ViPE's own config; its BERT comes from the HF cache (``bert`` must run first).
    """
    import torch
    from vipe.priors.track_anything.groundingdino.config import config
    from vipe.priors.track_anything.groundingdino.models import build_model

    args = config.copy()
    args.device = "cpu"
    model = build_model(args)
    with torch.no_grad():
        # Random weights score all 900 queries alike, so every one passes TrackAnything's box threshold
        # (0.35) and its uint8 instance mask overflows at the 256th object (seg_tracker.py:138). The class
        # score is decoder-state . text-state (groundingdino/models/main/utils.py:232-253); both end in a
        # LayerNorm (decoder.norm; the last text layer's norm2), set here to constants whose product is
        # -4, so no query scores above sigmoid(-4) = 0.018: no detection, as on a video without the phrases.
        text = torch.randn(256, generator=torch.Generator().manual_seed(0))
        text /= text.norm()
        for norm, bias in (
            (model.transformer.encoder.text_layers[-1].norm2, text),
            (model.transformer.decoder.norm, -4 * text),
        ):
            norm.weight.zero_()
            norm.bias.copy_(bias)
    torch.save({"model": model.state_dict()}, path)


def classes_without_cuda_ops() -> None:
    """Let ViPE's modules import where ``vipe_ext`` (its CUDA ops) is not built: weights need only the classes.

    vipe/ext/__init__.py would otherwise compile the ops just in time (minutes, and nvcc); nothing
    here calls them, so a module of empty attributes stands in for them in this process only.
    """
    try:
        import vipe_ext  # noqa: F401  # type: ignore[import-not-found]
    except ImportError:

        class NoOps(types.ModuleType):
            def __getattr__(self, name: str) -> Any:
                if name.startswith("__"):
                    raise AttributeError(name)
                return NoOps(name)

        sys.modules["vipe_ext"] = NoOps("vipe_ext")


def write_cache(vipe_src: Path, moge_src: Path, cache: Path, pipeline: str, only: set[str] | None = None) -> list[dict]:
    """Write every file ViPE's ``pipeline`` opens into ``cache``; return each model's files, bytes and seconds."""
    import os

    import torch

    from tasks.backends.vipe_files import needed_files

    os.environ["HF_HOME"] = str(cache / "huggingface")  # BERT for GroundingDINO is read back from there
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TORCH_HOME"] = str(cache / "torch")
    torch.manual_seed(0)
    builders: dict[str, Any] = {
        "torch/hub/droid_slam/droid.pth": droid,
        "torch/hub/geocalib/pinhole.tar": geocalib,
        "torch/hub/checkpoints/video_depth_anything_vitl.pth": lambda p: video_depth_anything(p, "vitl"),
        "torch/hub/checkpoints/video_depth_anything_vits.pth": lambda p: video_depth_anything(p, "vits"),
        "torch/hub/sam/sam_vit_b_01ec64.pth": sam_vit_b,
        "torch/hub/aot/R50_DeAOTL_PRE_YTB_DAV.pth": deaot,
        "torch/hub/checkpoints/groundingdino_swint_ogc.pth": grounding_dino,
    }
    done: list[dict] = []
    files = needed_files(compose(vipe_src, pipeline).pipeline)
    # BERT before GroundingDINO, which loads it from the cache at construction.
    files.sort(key=lambda f: "groundingdino" in f.path)
    handled: set[str] = set()
    for f in files:
        if f.path in handled or (only and not any(key in f.path for key in only)):
            continue
        t0 = time.monotonic()
        written: list[Path] = []
        if f.path in builders:
            target = cache / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            builders[f.path](target)
            written = [target]
        elif "models--Ruicheng--moge-vitl" in f.path:
            target = hf_snapshot(cache, "Ruicheng/moge-vitl") / "model.pt"
            moge(target, moge_src)
            written = [target]
        elif "models--Rain729--Prior-Depth-Anything" in f.path:
            snap = hf_snapshot(cache, "Rain729/Prior-Depth-Anything")
            written = [snap / "depth_anything_v2_vitb.pth", snap / "prior_depth_anything_vitb.pth"]
            prior_da(*written)
            handled |= {g.path for g in files if "Prior-Depth-Anything" in g.path}
        elif "models--bert-base-uncased" in f.path:
            bert(cache)
            written = sorted(hf_snapshot(cache, "bert-base-uncased").iterdir())
            handled |= {g.path for g in files if "bert-base-uncased" in g.path}
        else:
            raise SystemExit(f"no random-weights builder for {f.path} ({f.what}); add one to {__file__}")
        handled.add(f.path)
        done.append(
            {
                "what": f.what,
                "files": [str(p.relative_to(cache)) for p in written],
                "bytes": sum(p.stat().st_size for p in written),
                "seconds": round(time.monotonic() - t0, 2),
            }
        )
        print(f"wrote {f.what}: {[str(p.relative_to(cache)) for p in written]}", file=sys.stderr, flush=True)
    return done


def check_loads(cache: Path) -> dict[str, str]:
    """Load every file of ``cache`` back through upstream's own loader on the CPU, network off; return what loaded.

    The loaders that move to CUDA inside their constructor run with ``Module.cuda`` as a no-op;
    DeAOT's loader maps to CUDA, so only its key set is compared here (the GPU run loads it).
    """
    import os

    import torch

    os.environ.update(HF_HOME=str(cache / "huggingface"), HF_HUB_OFFLINE="1", TORCH_HOME=str(cache / "torch"))
    from tasks.backends.upstream import no_downloads

    loaded: dict[str, str] = {}
    cuda = torch.nn.Module.cuda
    torch.nn.Module.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        with no_downloads():
            from moge.model.v1 import MoGeModel
            from vipe.priors.depth.priorda.priorda import PriorDepthAnything
            from vipe.priors.depth.videodepthanything import VideoDepthAnythingDepthModel
            from vipe.priors.geocalib import GeoCalib
            from vipe.priors.track_anything.aot import config as engine_config
            from vipe.priors.track_anything.aot.networks.models import build_vos_model
            from vipe.priors.track_anything.detector import Detector
            from vipe.priors.track_anything.sam.build_sam import build_sam_vit_b
            from vipe.slam.networks.droid_net import DroidNet

            steps = {
                "droid": lambda: DroidNet(),
                "moge": lambda: MoGeModel.from_pretrained("Ruicheng/moge-vitl"),  # vipe/priors/depth/moge.py:46
                "geocalib": lambda: GeoCalib(weights="pinhole"),
                "video_depth_anything": lambda: VideoDepthAnythingDepthModel(model="vitl"),
                "prior_da": lambda: PriorDepthAnything(device="cpu"),
                "sam": lambda: build_sam_vit_b(checkpoint=str(cache / "torch/hub/sam/sam_vit_b_01ec64.pth")),
                "grounding_dino+bert": lambda: Detector("cpu"),
            }
            for name, step in steps.items():
                t0 = time.monotonic()
                step()
                loaded[name] = f"{time.monotonic() - t0:.1f} s"
                print(f"loaded {name}", file=sys.stderr, flush=True)
            cfg = engine_config.EngineConfig("PRE_YTB_DAV")
            net = build_vos_model(cfg.MODEL_VOS, cfg)
            saved = torch.load(cache / "torch/hub/aot/R50_DeAOTL_PRE_YTB_DAV.pth", weights_only=False)["state_dict"]
            if set(saved) != set(net.state_dict()):
                raise SystemExit("DeAOT's saved keys differ from the model's")
            loaded["deaot (keys)"] = "same keys"
    finally:
        torch.nn.Module.cuda = cuda  # type: ignore[method-assign]
    return loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vipe", type=Path, required=True, help="hgupt3/vipe's checkout")
    parser.add_argument("--moge", type=Path, required=True, help="microsoft/MoGe's checkout")
    parser.add_argument("--cache", type=Path, required=True, help="the model cache to write (weights_dir)")
    parser.add_argument("--pipeline", default="lyra")
    parser.add_argument("--check", action="store_true", help="load the cache back through upstream on the CPU")
    parser.add_argument("--only", default="", help="comma-separated parts of file paths to write (default all)")
    args = parser.parse_args()
    for src in (args.vipe, args.moge, ROOT):
        if str(src) not in sys.path:
            sys.path.insert(0, str(src))
    if args.check:
        classes_without_cuda_ops()
        print(json.dumps({"cache": str(args.cache), "loaded": check_loads(args.cache)}))
        return
    classes_without_cuda_ops()
    only = {s for s in args.only.split(",") if s} or None
    files = write_cache(args.vipe, args.moge, args.cache, args.pipeline, only)
    print(json.dumps({"cache": str(args.cache), "snapshot": SNAPSHOT, "files": files}))


if __name__ == "__main__":
    main()
