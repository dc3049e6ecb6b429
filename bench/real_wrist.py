"""Compare the two wrist placements of the mediapipe hands backend (PnP vs depth + 0.02 m) on one real clip.

Usage: python bench/real_wrist.py VIDEO [--depth classical]; prints, over the frames with a hand, the
joints' reprojection error (px) and the frame-to-frame wrist step (m) of each placement.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tasks.backends import get_backend
from tasks.backends.hand_geometry import hand_in_camera
from tasks.stages.preprocess import PreprocessStage


def reprojection_px(joints: np.ndarray, image_px: np.ndarray, K: np.ndarray) -> float:
    """Return the RMS pixel distance between ``joints`` (21, 3) projected with K and MediaPipe's pixels."""
    h = joints @ K.T
    return float(np.sqrt(np.mean(np.sum((h[:, :2] / h[:, 2:3] - image_px) ** 2, axis=1))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("video")
    ap.add_argument("--depth", default="classical")
    args = ap.parse_args()
    pre = PreprocessStage()
    pre.load("cpu")
    frames = pre.run({"video_path": args.video})["frames"]
    depth = get_backend("depth", args.depth)
    depth.load("cpu")
    d = depth.infer(frames)
    K = np.array([[d["intrinsics"][0], 0, d["intrinsics"][2]], [0, d["intrinsics"][1], d["intrinsics"][3]], [0, 0, 1]])
    hands = get_backend("hands", "mediapipe")
    hands.load("cpu")
    rows: dict[str, list] = {"pnp": [], "depth": []}
    last: dict[tuple[str, str], tuple[int, np.ndarray]] = {}
    steps: dict[str, list] = {"pnp": [], "depth": []}
    found = 0
    t0 = time.perf_counter()
    for t, frame in enumerate(frames):
        detected = hands.landmarks(frame)
        found += bool(detected)
        for hand in detected:
            for mode in rows:
                placed = hand_in_camera(hand["world"], hand["image_px"], K, hand["side"], d["depths"][t], mode)
                if placed is None:
                    continue
                pose, joints = placed
                rows[mode].append((reprojection_px(joints, hand["image_px"], K), pose[2, 3]))
                key = (mode, hand["side"])
                if key in last and last[key][0] == t - 1:
                    steps[mode].append(float(np.linalg.norm(pose[:3, 3] - last[key][1])))
                last[key] = (t, pose[:3, 3])
    dt = time.perf_counter() - t0
    print(
        f"{args.video}: {len(frames)} frames, hands on {found}; "
        f"{1000 * dt / len(frames):.0f} ms/frame (both placements)"
    )
    print(f"depth backend notes: {d.get('notes', {})}")
    for mode, r in rows.items():
        a = np.array(r)
        print(
            f"{mode:5s}: hands placed {len(a)}, joint reprojection RMS median {np.median(a[:, 0]):.1f} px, "
            f"wrist z median {np.median(a[:, 1]):.2f} m, frame-to-frame wrist step median "
            f"{np.median(steps[mode]):.3f} m (n={len(steps[mode])})"
        )


if __name__ == "__main__":
    main()
