"""Every file y2r's ViPE opens at load for a pipeline config, where it goes in the model cache, and where it comes from.

ViPE fetches its checkpoints through torch hub (``TORCH_HOME/hub``) and the Hugging Face hub
(``HF_HOME/hub``) the first time they are needed; a worker has no network, so the depth
backend checks them all before it takes a task. References are to hgupt3/vipe at the
commit ``deploy/envs/build.sh`` pins (and microsoft/MoGe for MoGe's file name).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.errors import ModelLoadError

HF = "https://huggingface.co"


@dataclass(frozen=True)
class NeededFile:
    """One file ViPE opens: ``path`` relative to the model cache (``*`` = any snapshot), what it is, its source."""

    path: str
    what: str
    source: str

    def present(self, cache: Path) -> bool:
        """Return whether the file is in the model cache folder ``cache``."""
        return any(p.is_file() for p in cache.glob(self.path))


def _hf(repo: str, filename: str, what: str) -> NeededFile:
    folder = "models--" + repo.replace("/", "--")
    return NeededFile(f"huggingface/hub/{folder}/snapshots/*/{filename}", what, f"{HF}/{repo} ({filename})")


def _hub(relative: str, what: str, source: str) -> NeededFile:
    return NeededFile(f"torch/hub/{relative}", what, source)


def _depth_model(name: str) -> list[NeededFile]:
    """The files of ViPE's metric depth model ``name`` (vipe/priors/depth/__init__.py:19-41)."""
    if name == "moge":  # vipe/priors/depth/moge.py:46; MoGe moge/model/v1.py:230-233
        return [_hf("Ruicheng/moge-vitl", "model.pt", "MoGe (metric depth)")]
    if name.startswith("unidepth-"):  # vipe/priors/depth/unidepth/__init__.py:30
        repo = f"lpiccinelli/unidepth-v2-vit{name.split('-', 1)[1]}14"
        return [
            _hf(repo, "config.json", "UniDepth's config"),
            _hf(repo, "model.safetensors", "UniDepth (metric depth)"),
        ]
    raise ModelLoadError(
        f"ViPE's depth model {name!r} is not one whose files framefleet knows (moge, unidepth-l/b/s); "
        "choose a pipeline that uses one of them (stages.depth.params.pipeline: lyra)"
    )


def needed_files(pipeline: Any) -> list[NeededFile]:
    """Return the files ViPE's ``VipeModelCache.create`` opens for the composed ``pipeline`` config.

    vipe/model_cache.py:75-150: DroidNet always; the SLAM key-frame depth model; GeoCalib unless
    the field of view is fixed; for ``post.depth_align_model`` ("adaptive_<metric>[_<vda|svda>]")
    Video-Depth-Anything, the metric model and PriorDA; TrackAnything (SAM, DeAOT and its
    GroundingDINO with BERT) when ``init.instance`` is set.
    """
    files = [
        _hub(
            "droid_slam/droid.pth",
            "DroidNet (SLAM)",
            "gdown https://drive.google.com/file/d/1PpqVt1H4maBa_GbPJp4NwxRsd9jk-elh/view "
            "(vipe/slam/networks/droid_net.py:531-540)",
        )
    ]
    slam, init, post = pipeline.get("slam") or {}, pipeline.get("init") or {}, pipeline.get("post") or {}
    if slam.get("keyframe_depth"):
        files += _depth_model(str(slam["keyframe_depth"]))
    if init.get("fixed_fov_degrees") is None:
        camera = "pinhole" if init.get("camera_type", "pinhole") == "pinhole" else "distorted"
        files.append(
            _hub(
                f"geocalib/{camera}.tar",
                f"GeoCalib ({camera}, field of view)",
                f"https://github.com/cvg/GeoCalib/releases/download/v1.0/geocalib-{camera}.tar "
                "(vipe/priors/geocalib/extractor.py:34-40)",
            )
        )
    align = post.get("depth_align_model")
    if align:
        parts = str(align).split("_")
        if len(parts) == 3:  # vipe/priors/depth/videodepthanything/__init__.py:46-61
            variant = "vits" if parts[2] == "svda" else "vitl"
            repo = "Video-Depth-Anything-Small" if variant == "vits" else "Video-Depth-Anything-Large"
            files.append(
                _hub(
                    f"checkpoints/video_depth_anything_{variant}.pth",
                    f"Video-Depth-Anything ({variant})",
                    f"{HF}/depth-anything/{repo}/resolve/main/video_depth_anything_{variant}.pth",
                )
            )
        files += [f for f in _depth_model(parts[1]) if f not in files]
        # vipe/priors/depth/priorda/priorda.py:54-86, utils.py:15-27's defaults (vitb, Rain729/Prior-Depth-Anything).
        files += [
            _hf("Rain729/Prior-Depth-Anything", "depth_anything_v2_vitb.pth", "PriorDA's frozen depth model"),
            _hf("Rain729/Prior-Depth-Anything", "prior_depth_anything_vitb.pth", "PriorDA"),
        ]
    if init.get("instance") is not None:  # vipe/priors/track_anything/__init__.py:23-39, detector.py:25-28
        files += [
            _hub(
                "sam/sam_vit_b_01ec64.pth",
                "TrackAnything's SAM",
                "https://dl.fbaipublicfiles.com/segment_anything/sam_vit_b_01ec64.pth",
            ),
            _hub(
                "aot/R50_DeAOTL_PRE_YTB_DAV.pth",
                "TrackAnything's DeAOT",
                "gdown https://drive.google.com/file/d/1QoChMkTVxdYZ_eBlZhK2acq9KMQZccPJ/view",
            ),
            _hub(
                "checkpoints/groundingdino_swint_ogc.pth",
                "TrackAnything's GroundingDINO",
                f"{HF}/ShilongLiu/GroundingDINO/resolve/main/groundingdino_swint_ogc.pth",
            ),
            # groundingdino/util/get_tokenlizer.py:19-27: AutoTokenizer and BertModel.from_pretrained.
            _hf("bert-base-uncased", "config.json", "GroundingDINO's text encoder (BERT)"),
            _hf("bert-base-uncased", "vocab.txt", "BERT's vocabulary"),
            _hf("bert-base-uncased", "model.safetensors", "BERT's weights"),
        ]
    return files


def check_files(pipeline: Any, cache: Path, fix: str) -> None:
    """Raise ModelLoadError naming each file of ``needed_files`` missing from ``cache``: where it goes, its source."""
    missing = [f for f in needed_files(pipeline) if not f.present(cache)]
    if missing:
        lines = "\n".join(f"  - {f.what}: {cache / f.path} (from {f.source})" for f in missing)
        raise ModelLoadError(
            f"ViPE's model cache {cache} lacks {len(missing)} file(s) its pipeline opens:\n{lines}\n{fix}"
        )
