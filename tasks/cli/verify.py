"""Check every OUT/*.hdf5 against docs/contracts.md and recompute normalization_stats.yaml in one NumPy pass.

Independent of tasks/statistics/stats.py on purpose: the statistics are recomputed by concatenating
every pooled row of every file and calling np.mean / np.std in float64. A value matches
when |a - b| <= 1e-9 * max(|a|, |b|) or |a - b| <= 1e-12 (the absolute floor covers values
that are 0 up to rounding, e.g. a mean displacement of a static scene); counts must be equal.

The statistics file must have the mode of the HDF5 files (what a plain write gives under the
writer's umask): a trainer that can read the files must be able to read it. ``--y2r-strict``
adds the rules by which y2r's own writer is stricter than a loose reading of the contract
(see tasks/cli/y2r_strict.py).

It also prints what made each file (its provenance attributes) and checks the source video's
hash recorded there against the video, when the video is still in its folder; and checks each file
against the sha256 its completion marker recorded, and the manifest's done videos against the
files, both ways (tasks/cli/verify_files.py). A file cut short or unreadable is a problem line.

Usage: framefleet verify OUT [--stats FILE] [--y2r-strict]; exit status 0 when everything holds,
1 otherwise.
"""

from __future__ import annotations

import argparse
import re
import stat
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import yaml

from tasks.outputs import buckets

RTOL, ATOL = 1e-9, 1e-12
IMAGENET = {"imagenet_mean": [0.485, 0.456, 0.406], "imagenet_std": [0.229, 0.224, 0.225]}
HAND_KEYS = {
    "wrist_query_uvd": (3,),
    "wrist_uvd_displacements": (None, 3),
    "wrist_query_rot_6d": (6,),
    "wrist_rot_displacements": (None, 6),
}
ROT_IDENTITY_6D = np.array([1, 0, 0, 0, 1, 0], dtype=np.float64)
GROUP_NAME = re.compile(r"frame_(\d{4,})$")


def close(a: float, b: float) -> bool:
    """The comparison rule of this script (see the module docstring)."""
    d = abs(a - b)
    return d <= RTOL * max(abs(a), abs(b)) or d <= ATOL


class _Checker:
    def __init__(self, depth_min: float, depth_max: float) -> None:
        self.depth_min, self.depth_max = depth_min, depth_max
        self.problems: list[str] = []
        self.pools: dict[str, list[np.ndarray]] = {k: [] for k in ("disp", "depth", "pose", "hand_uvd", "hand_rot")}
        self.track_types: set[str] = set()
        self.files = self.windows = 0

    def bad(self, where: str, what: str) -> None:
        self.problems.append(f"{where}: {what}")

    def array(self, g: h5py.Group, name: str, where: str, shape: tuple, dtype: str) -> np.ndarray | None:
        """Return dataset ``name`` of ``g`` if it has ``shape`` (None = any) and ``dtype``, else record why not."""
        obj = g.get(name)
        if not isinstance(obj, h5py.Dataset):
            self.bad(where, f"dataset {name!r} is missing")
            return None
        if (
            obj.dtype != np.dtype(dtype)
            or len(obj.shape) != len(shape)
            or any(w is not None and w != n for w, n in zip(shape, obj.shape, strict=True))
        ):
            self.bad(where, f"{name} is {obj.dtype} {obj.shape}, want {dtype} {shape}")
            return None
        value = obj[()]
        if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
            self.bad(where, f"{name} has {int((~np.isfinite(value)).sum())} non-finite values")
        return value

    def string(self, g: h5py.Group, name: str, where: str) -> str | None:
        obj = g.get(name)
        info = h5py.check_string_dtype(obj.dtype) if isinstance(obj, h5py.Dataset) else None
        if info is None or info.length is not None or obj.shape != ():
            self.bad(where, f"{name} must be a scalar variable-length str dataset")
            return None
        value = obj[()]
        return value.decode(info.encoding) if isinstance(value, bytes) else str(value)

    def file(self, path: Path) -> None:
        where = path.name
        with h5py.File(path, "r") as f:
            if not isinstance(f.get("root"), h5py.Group) or set(f.keys()) != {"root"}:
                return self.bad(where, f"top level must be exactly one group 'root', found {sorted(f.keys())}")
            root = f["root"]
            tt = self.string(root, "track_type", where)
            if tt not in ("3d", "2d"):
                if tt is not None:
                    self.bad(where, f"track_type is {tt!r}, want '3d' or '2d'")
                tt = "3d" if "depth" in root else "2d"  # go on checking the layout it looks like
            self.track_types.add(tt)
            allowed = {"video", "tracks", "num_frames", "num_track_ts", "track_type", "text"}
            allowed |= {"depth", "intrinsics"} if tt == "3d" else set()
            if set(root.keys()) - allowed:
                self.bad(where, f"unexpected names under root: {sorted(set(root.keys()) - allowed)}")
            video = self.array(root, "video", where, (None, 3, None, None), "uint8")
            num_frames = self.array(root, "num_frames", where, (), "int64")
            n = self.array(root, "num_track_ts", where, (), "int64")
            if "text" in root and not self.string(root, "text", where):
                self.bad(where, "text, when present, must be a non-empty str")
            if video is None or num_frames is None or n is None:
                return None
            T, size = video.shape[0], video.shape[2]
            if video.shape[3] != size or int(num_frames) != T:
                self.bad(where, f"video is {video.shape}; num_frames is {int(num_frames)}")
            if tt == "3d":
                K = self.array(root, "intrinsics", where, (3, 3), "float32")
                if K is not None and (not np.array_equal(K[2], [0, 0, 1]) or K[0, 0] <= 0 or K[1, 1] <= 0):
                    self.bad(where, f"intrinsics is not a camera matrix: {K.tolist()}")
                depth = self.array(root, "depth", where, (None, size, size), "float32")
                if depth is not None:
                    # <= 0 is invalid; y2r's writer keeps a negative depth as it is, and so does framefleet
                    ok = (depth <= 0) | ((depth >= self.depth_min) & (depth <= self.depth_max))
                    if not 1 <= len(depth) <= T or not ok.all():
                        self.bad(
                            where,
                            f"depth has {len(depth)} frames for {T}; {int((~ok).sum())} values "
                            f"neither <= 0 nor in [{self.depth_min}, {self.depth_max}]",
                        )
                    self.pools["depth"].append(depth[depth > 0])
            tracks = root.get("tracks")
            if not isinstance(tracks, h5py.Group):
                return self.bad(where, "group 'tracks' is missing")
            for name in tracks:
                self.window(tracks, name, f"{where}:tracks/{name}", tt, int(n), T)
            self.files += 1
        return None

    def window(self, tracks: h5py.Group, name: str, where: str, tt: str, n: int, T: int) -> None:
        m = GROUP_NAME.match(name)
        g = tracks[name]
        if not m or not isinstance(g, h5py.Group) or int(m.group(1)) + n > T or name != f"frame_{int(m.group(1)):04d}":
            return self.bad(where, f"not a window group of a start frame in [0, {T - n}]")
        self.windows += 1
        D = 3 if tt == "3d" else 2
        expected = {"query_coords", "displacements"} | ({"poses"} if tt == "3d" else set())
        hands = {f"{side}_{k}" for side in ("left", "right") for k in HAND_KEYS} if tt == "3d" else set()
        if set(g) - expected - hands:
            self.bad(where, f"unexpected names {sorted(set(g) - expected - hands)}")
        q = self.array(g, "query_coords", where, (None, D), "float32")
        disp = self.array(g, "displacements", where, (n, None, D), "float32")
        if q is not None and disp is not None and disp.shape[1] == q.shape[0]:
            if disp.size and np.any(disp[0] != 0):
                self.bad(where, "displacements[0] must be all zeros")
            uv = q[None, :, :2] + disp[:, :, :2]
            if np.any(q[:, :2] < 0) or np.any(q[:, :2] > 1) or np.any(uv < -1e-6) or np.any(uv > 1 + 1e-6):
                self.bad(where, "a point leaves [0, 1] in u or v on some step")
            if tt == "3d" and (np.any(q[:, 2] < self.depth_min) or np.any(q[:, 2] > self.depth_max)):
                self.bad(where, f"a query depth is outside [{self.depth_min}, {self.depth_max}]")
            if len(q):
                self.pools["disp"].append(disp.reshape(-1, D))
                if tt == "3d":
                    self.pools["depth"].append(q[:, 2][q[:, 2] > 0])
        elif q is not None and disp is not None:
            self.bad(where, f"query_coords has {q.shape[0]} points, displacements {disp.shape[1]}")
        if tt == "3d":
            poses = self.array(g, "poses", where, (n, 9), "float32")
            if poses is not None:
                if not np.allclose(poses[0], np.r_[ROT_IDENTITY_6D, 0, 0, 0], atol=1e-5):
                    self.bad(where, f"poses[0] is not the identity: {poses[0].tolist()}")
                self.rotations(poses[:, :6], where, "poses")
                self.pools["pose"].append(poses)
            for side in ("left", "right"):
                self.hand(g, side, where, n)
        return None

    def hand(self, g: h5py.Group, side: str, where: str, n: int) -> None:
        present = [k for k in HAND_KEYS if f"{side}_{k}" in g]
        if not present:
            return
        if len(present) != len(HAND_KEYS):
            return self.bad(where, f"{side} hand has {present}, want all of {list(HAND_KEYS)}")
        arrays: dict[str, Any] = {}
        for key, shape in HAND_KEYS.items():
            arrays[key] = self.array(g, f"{side}_{key}", where, tuple(n if s is None else s for s in shape), "float32")
        if any(a is None for a in arrays.values()):
            return None
        if np.any(arrays["wrist_uvd_displacements"][0] != 0):
            self.bad(where, f"{side}_wrist_uvd_displacements[0] must be zeros")
        if not np.allclose(arrays["wrist_rot_displacements"][0], ROT_IDENTITY_6D, atol=1e-5):
            self.bad(where, f"{side}_wrist_rot_displacements[0] must be the identity's 6D")
        self.rotations(arrays["wrist_query_rot_6d"][None], where, f"{side}_wrist_query_rot_6d")
        self.rotations(arrays["wrist_rot_displacements"], where, f"{side}_wrist_rot_displacements")
        self.pools["hand_uvd"].append(arrays["wrist_uvd_displacements"])
        self.pools["hand_rot"].append(arrays["wrist_rot_displacements"])
        return None

    def rotations(self, six: np.ndarray, where: str, name: str) -> None:
        a, b = six[:, :3].astype(np.float64), six[:, 3:6].astype(np.float64)
        ok = (np.abs(np.linalg.norm(a, axis=1) - 1) < 1e-4) & (np.abs(np.linalg.norm(b, axis=1) - 1) < 1e-4)
        if not (ok & (np.abs((a * b).sum(axis=1)) < 1e-4)).all():
            self.bad(where, f"{name}: the two columns are not orthonormal")


def _pooled(parts: list[np.ndarray], dim: int) -> tuple[list[float], list[float], int]:
    if not parts:
        return [0.0] * dim, [1.0] * dim, 0
    x = np.concatenate([p.reshape(-1, dim) for p in parts]).astype(np.float64)
    if len(x) == 0:
        return [0.0] * dim, [1.0] * dim, 0
    return np.mean(x, axis=0).tolist(), np.std(x, axis=0).tolist(), len(x)


def _put(out: dict[str, Any], prefix: str, parts: list[np.ndarray], dim: int, count_key: str | None) -> None:
    mean, std, count = _pooled(parts, dim)
    out[f"{prefix}_mean"], out[f"{prefix}_std"] = (mean[0], std[0]) if prefix == "depth" else (mean, std)
    if count_key:
        out[count_key] = count


def expected_stats(c: _Checker, tt: str) -> dict[str, Any]:
    """The normalization_stats.yaml that the checked files imply, per docs/contracts.md."""
    dim = 3 if tt == "3d" else 2
    out: dict[str, Any] = {**IMAGENET, "track_type": tt, "track_dim": dim}
    _put(out, "displacement", c.pools["disp"], dim, "displacement_num_samples")
    if tt == "3d":
        _put(out, "depth", c.pools["depth"], 1, "depth_num_samples")
        _put(out, "pose", c.pools["pose"], 9, "pose_num_samples")
        if c.pools["hand_uvd"]:
            _put(out, "hand_uvd_disp", c.pools["hand_uvd"], 3, "hand_pose_num_samples")
            _put(out, "hand_rot_disp", c.pools["hand_rot"], 6, None)
    return out


def compare(found: dict[str, Any], want: dict[str, Any], where: str) -> list[str]:
    """Return the differences between the stats file's mapping and the recomputed one."""
    problems = [f"{where}: missing key {k}" for k in sorted(set(want) - set(found))]
    problems += [f"{where}: unexpected key {k}" for k in sorted(set(found) - set(want))]
    for key in sorted(set(want) & set(found)):
        a, b = found[key], want[key]
        if isinstance(b, str) or (isinstance(b, int) and not isinstance(b, bool)):
            if type(a) is not type(b) or a != b:
                problems.append(f"{where}: {key} is {a!r}, recomputed {b!r}")
            continue
        a_list, b_list = (a if isinstance(a, list) else [a]), (b if isinstance(b, list) else [b])
        if isinstance(a, list) != isinstance(b, list) or len(a_list) != len(b_list):
            problems.append(f"{where}: {key} is {a!r}, want the shape of {b!r}")
            continue
        for i, (x, y) in enumerate(zip(a_list, b_list, strict=True)):
            if not isinstance(x, float) or not close(x, y):
                problems.append(f"{where}: {key}[{i}] is {x!r}, recomputed {y!r} (diff {abs(float(x) - y):.3g})")
    return problems


def check_mode(stats_path: Path, files: list[Path]) -> list[str]:
    """Return a problem when the statistics file's mode differs from the HDF5 files' (e.g. mkstemp's 0600)."""
    modes = {stat.S_IMODE(p.stat().st_mode) for p in files}
    mode = stat.S_IMODE(stats_path.stat().st_mode)
    if len(modes) != 1 or mode in modes:
        return []
    want = modes.pop()
    return [
        f"{stats_path.name}: mode {mode:04o}, but the HDF5 files are {want:04o}: whoever can read the files "
        f"must be able to read their statistics; `chmod {want:04o} {stats_path}`"
    ]


def verify(
    out_dir: str | Path,
    stats_path: str | Path | None = None,
    depth_min: float = 0.1,
    depth_max: float = 2.5,
    summary: list[str] | None = None,
    y2r_strict: bool = False,
) -> list[str]:
    """Return every contract violation and statistics difference found under ``out_dir`` (empty when all holds)."""
    out_dir = Path(out_dir)
    stats_path = Path(stats_path) if stats_path else out_dir / "normalization_stats.yaml"
    files = sorted(out_dir.glob("*.hdf5"))
    if not files:
        return [f"{out_dir}: no .hdf5 files"]
    c = _Checker(depth_min, depth_max)
    for path in files:
        try:
            c.file(path)
        except (OSError, KeyError, ValueError, TypeError) as exc:
            c.bad(path.name, f"unreadable ({type(exc).__name__}: {exc})")
    if len(c.track_types) != 1:
        return c.problems + [f"{out_dir}: files must share one track_type, found {sorted(c.track_types)}"]
    if y2r_strict and not c.problems:
        from tasks.cli.y2r_strict import check_file

        tt = next(iter(c.track_types))
        for path in files:
            c.problems += check_file(path, tt, out_dir / "work" / path.stem)
    if not stats_path.exists():
        return c.problems + [f"{stats_path}: missing"]
    c.problems += check_mode(stats_path, files)
    with open(stats_path) as f:
        found = yaml.safe_load(f)
    if not isinstance(found, dict):
        return c.problems + [f"{stats_path}: not a YAML mapping"]
    want = expected_stats(c, c.track_types.pop())
    if summary is not None:
        summary.append(f"{c.files} files, {c.windows} windows, {want['displacement_num_samples']} displacement rows")
    return c.problems + compare(found, want, stats_path.name)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument(
        "out", type=buckets.data_root_arg, help="the output folder holding *.hdf5 and normalization_stats.yaml"
    )
    parser.add_argument("--stats", help="statistics file (default OUT/normalization_stats.yaml)")
    parser.add_argument("--depth-min", type=float, default=0.1, help="metres (default 0.1)")
    parser.add_argument("--depth-max", type=float, default=2.5, help="metres (default 2.5)")
    parser.add_argument(
        "--y2r-strict",
        action="store_true",
        help="also check y2r's writer's rules (2D windows, float32 K, OpenCV pixels, point counts)",
    )
    args = parser.parse_args(argv)
    summary: list[str] = []
    problems = verify(str(args.out), args.stats, args.depth_min, args.depth_max, summary, args.y2r_strict)
    from tasks.cli import verify_files
    from tasks.cli.provenance_check import check

    files = sorted(Path(args.out).glob("*.hdf5"))
    lines, differ = check(Path(args.out), files)
    problems += differ
    file_lines, altered = verify_files.check(Path(args.out), files)
    problems += altered
    lines = file_lines + lines
    for p in problems:
        print(p)
    if problems:
        print(f"FAILED: {len(problems)} problem(s)")
    else:
        print(
            f"OK: {summary[0]}; statistics match a one-pass float64 recomputation "
            f"(|a-b| <= {RTOL:g}*max(|a|,|b|) or <= {ATOL:g})"
        )
    print("\n".join(lines))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
