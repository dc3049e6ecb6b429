"""H5: write one video's y2r HDF5 file (docs/contracts.md, to the letter) and its partial statistics."""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.errors import BadInput
from tasks.job import Job
from tasks.outputs import provenance_file as provenance
from tasks.outputs.geometry import crop_intrinsics, pose_9d, square_crop
from tasks.outputs.windows import clip_depth, frame_pixels, hand_window, track_window, track_window_2d
from tasks.stages.base import Outputs, Progress, Stage, report, require
from tasks.statistics.stats import Moments, VideoStats

SIDES = ("left", "right")


def _concat(parts: list[np.ndarray], dim: int) -> np.ndarray:
    return np.concatenate(parts).reshape(-1, dim) if parts else np.zeros((0, dim))


class H5Stage(Stage):
    """Turn ``{"frames", "depths", "tracks", "hands", "text", "out_path"[, "tracks2d", "provenance"]}`` into the
    HDF5 file; ``provenance`` (tasks.outputs.provenance) and its quality go to the file's attributes.

    For ``track_type: 2d`` the pixel tracks are the tracks2d stage's when it ran, else the 3D
    tracks seen by the frame's camera (``frame_pixels``). Returns ``{"stats":
    VideoStats.to_dict(), "num_frames", "num_windows"}``.
    """

    name = "h5"
    reads = ("preprocess", "depth", "tracks", "hands")
    uses = ("tracks2d",)
    writes = "hdf5"
    default_deadline_s = 1800.0

    def __init__(
        self,
        num_track_ts: int = 10,
        depth_min: float = 0.1,
        depth_max: float = 2.5,
        image_size: int = 256,
        track_type: str = "3d",
    ) -> None:
        if track_type not in ("3d", "2d"):
            raise ValueError(f"track_type must be '3d' or '2d', got {track_type!r}")
        if not 0 < depth_min < depth_max:
            raise ValueError(f"need 0 < depth_min < depth_max, got {depth_min} and {depth_max}")
        self.num_track_ts = int(num_track_ts)
        self.depth_min = float(depth_min)
        self.depth_max = float(depth_max)
        self.image_size = int(image_size)
        self.track_type = track_type
        self.dims = 3 if track_type == "3d" else 2

    @classmethod
    def select_inputs(cls, outputs: Outputs, job: Job) -> dict[str, Any]:
        inputs = {
            "frames": outputs["preprocess"]["frames"],
            "depths": outputs["depth"]["depths"],
            "tracks": dict(outputs["tracks"]),
            "hands": dict(outputs["hands"]),
            "text": job.text,
        }
        if "tracks2d" in outputs:
            inputs["tracks2d"] = dict(outputs["tracks2d"])
        return inputs

    def run(self, inputs: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
        import h5py

        frames = require(inputs, "frames", self.name, (None, None, None, 3), "u")
        T, H, W = frames.shape[:3]
        tracks = inputs.get("tracks")
        if not isinstance(tracks, dict):
            raise BadInput("h5: input 'tracks' must be the tracks stage's output dict")
        if int(np.asarray(tracks["num_frames"])) != T or tuple(np.asarray(tracks["resolution"])) != (H, W):
            raise BadInput(
                f"h5: tracks were made for {int(np.asarray(tracks['num_frames']))} frames of "
                f"{tuple(np.asarray(tracks['resolution']))}, but the video has {T} frames of {(H, W)}"
            )
        hands = inputs.get("hands") or {}
        for side in SIDES:
            if f"{side}_valid" in hands and np.asarray(hands[f"{side}_valid"]).shape != (T,):
                raise BadInput(
                    f"h5: hands '{side}_valid' has shape {np.asarray(hands[f'{side}_valid']).shape}, want ({T},)"
                )
        crop_x, crop_y, side_px = square_crop(H, W)
        S = self.image_size
        # y2r projects with the K it computed (ViPE's float32) and stores it as float32.
        K = crop_intrinsics(np.asarray(tracks["intrinsics"]), crop_x, crop_y, side_px, S)
        crop = (crop_x, crop_y, side_px)

        if self.track_type == "2d":
            groups, acc = self._windows_2d(tracks, inputs.get("tracks2d"), crop, (T, H, W), progress)
        else:
            groups, acc = self._windows(tracks, hands, K, T, progress)
        root: dict[str, Any] = {"video": self._video(frames, crop)}
        if self.track_type == "3d":
            depths = require(inputs, "depths", self.name, (None, H, W), "f")
            depth = self._depth(depths[: min(T, len(depths))], crop)
            root["depth"] = depth
            root["intrinsics"] = K.astype(np.float32)
            acc["depth"].insert(0, depth[depth > 0])

        with h5py.File(inputs["out_path"], "w") as f:
            g_root = f.create_group("root")
            for key, value in root.items():
                g_root.create_dataset(key, data=value)
            g_tracks = g_root.create_group("tracks")
            for start, datasets in groups:
                g = g_tracks.create_group(f"frame_{start:04d}")
                for key, value in datasets.items():
                    g.create_dataset(key, data=value)
            g_root.create_dataset("num_frames", data=np.int64(T))
            g_root.create_dataset("num_track_ts", data=np.int64(self.num_track_ts))
            g_root.create_dataset("track_type", data=self.track_type, dtype=h5py.string_dtype())
            text = str(inputs.get("text") or "")
            if text:
                g_root.create_dataset("text", data=text, dtype=h5py.string_dtype())
            if inputs.get("provenance"):  # attributes of the file, outside root/: y2r's loader never sees them
                provenance.write_attrs(f, inputs["provenance"])

        stats = VideoStats(
            self.track_type,
            Moments.from_samples(_concat(acc["displacement"], self.dims)),
            Moments.from_samples(_concat(acc["depth"], 1)),
            Moments.from_samples(_concat(acc["pose"], 9)),
            Moments.from_samples(_concat(acc["hand_uvd"], 3)),
            Moments.from_samples(_concat(acc["hand_rot"], 6)),
        )
        return {"stats": stats.to_dict(), "num_frames": T, "num_windows": len(groups)}

    def _windows(
        self, tracks: dict[str, Any], hands: dict[str, Any], K: np.ndarray, T: int, progress: Progress | None
    ) -> tuple[list[tuple[int, dict[str, np.ndarray]]], dict[str, list[np.ndarray]]]:
        n = self.num_track_ts
        acc: dict[str, list[np.ndarray]] = {k: [] for k in ("displacement", "depth", "pose", "hand_uvd", "hand_rot")}
        groups: list[tuple[int, dict[str, np.ndarray]]] = []
        starts = np.asarray(tracks["window_starts"])
        all_points = np.asarray(tracks["tracks"])
        if all_points.ndim != 4 or all_points.shape[1] < n:
            return groups, acc  # windows shorter than num_track_ts are not training samples
        for w, start in enumerate(starts.tolist()):
            points = all_points[w, :n, : int(np.asarray(tracks["num_points"])[w])]
            query, disp = track_window(points, K, self.image_size, self.depth_min, self.depth_max)
            poses = pose_9d(np.asarray(tracks["window_poses"])[w, :n]).astype(np.float32)
            datasets = {"query_coords": query, "displacements": disp, "poses": poses}
            if len(query):
                acc["displacement"].append(disp.reshape(-1, 3))
            acc["pose"].append(poses)
            acc["depth"].append(query[:, 2][query[:, 2] > 0])
            for side in SIDES:
                hand = self._hand(hands, side, start, n, K)
                if hand is not None:
                    datasets.update({f"{side}_{k}": v for k, v in hand.items()})
                    acc["hand_uvd"].append(hand["wrist_uvd_displacements"])
                    acc["hand_rot"].append(hand["wrist_rot_displacements"])
            groups.append((int(start), datasets))
            if w % 16 == 15:
                report(progress, start + 1, T)
        report(progress, T, T)
        return groups, acc

    def _windows_2d(
        self,
        tracks: dict[str, Any],
        tracks2d: dict[str, Any] | None,
        crop: tuple[int, int, int],
        shape: tuple[int, int, int],
        progress: Progress | None,
    ) -> tuple[list[tuple[int, dict[str, np.ndarray]]], dict[str, list[np.ndarray]]]:
        n, T = self.num_track_ts, shape[0]
        acc: dict[str, list[np.ndarray]] = {k: [] for k in ("displacement", "depth", "pose", "hand_uvd", "hand_rot")}
        groups: list[tuple[int, dict[str, np.ndarray]]] = []
        source = tracks if tracks2d is None else tracks2d
        if tracks2d is not None and (
            int(np.asarray(tracks2d["num_frames"])) != T or tuple(np.asarray(tracks2d["resolution"])) != shape[1:]
        ):
            raise BadInput(
                f"h5: tracks2d were made for {int(np.asarray(tracks2d['num_frames']))} frames of "
                f"{tuple(np.asarray(tracks2d['resolution']))}, but the video has {T} frames of {shape[1:]}"
            )
        all_points = np.asarray(source["tracks"])
        if all_points.ndim != 4 or all_points.shape[1] < n:
            return groups, acc
        for w, start in enumerate(np.asarray(source["window_starts"]).tolist()):
            points = all_points[w, :n, : int(np.asarray(source["num_points"])[w])]
            # y2r's writer reads CoTracker's positions and ignores its visibility; so does this.
            pixels = points if tracks2d is not None else frame_pixels(points, tracks["intrinsics"])
            window = track_window_2d(pixels, *crop, self.image_size)
            if window is not None:
                groups.append((int(start), {"query_coords": window[0], "displacements": window[1]}))
                acc["displacement"].append(window[1].reshape(-1, 2))
            if w % 16 == 15:
                report(progress, start + 1, T)
        report(progress, T, T)
        return groups, acc

    def _hand(self, hands: dict[str, Any], side: str, start: int, n: int, K: np.ndarray) -> dict | None:
        if f"{side}_valid" not in hands:
            return None
        valid = np.asarray(hands[f"{side}_valid"], dtype=bool)[start : start + n]
        poses = np.asarray(hands[f"{side}_wrist_pose"])[start : start + n]
        if len(valid) < n or not valid.all() or not np.isfinite(poses).all():
            return None
        return hand_window(poses, K, self.image_size)

    def _video(self, frames: np.ndarray, crop: tuple[int, int, int]) -> np.ndarray:
        """Return (T, 3, S, S) uint8: the square crop, then y2r's ``cv2.resize(..., INTER_LANCZOS4)`` (L286-291)."""
        import cv2

        x, y, side = crop
        S = self.image_size
        out = np.empty((len(frames), 3, S, S), dtype=np.uint8)
        for t, frame in enumerate(frames):
            resized = cv2.resize(frame[y : y + side, x : x + side], (S, S), interpolation=cv2.INTER_LANCZOS4)
            out[t] = resized.transpose(2, 0, 1)
        return out

    def _depth(self, depths: np.ndarray, crop: tuple[int, int, int]) -> np.ndarray:
        """Return (T', S, S) float32: float16 -> float32, the crop, ``cv2.INTER_NEAREST`` (L646-656), then clipped."""
        import cv2

        x, y, side = crop
        S = self.image_size
        out = np.empty((len(depths), S, S), dtype=np.float32)
        for t, d in enumerate(np.asarray(depths, dtype=np.float32)):
            resized = cv2.resize(d[y : y + side, x : x + side], (S, S), interpolation=cv2.INTER_NEAREST)
            out[t] = clip_depth(resized, self.depth_min, self.depth_max)
        return out
