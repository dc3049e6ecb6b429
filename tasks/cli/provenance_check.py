"""`framefleet verify`'s provenance part: what made each file, and its source hash checked against the video."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.outputs import provenance
from tasks.records import lineage

SHOWN = 20  # files listed one a line; the rest are counted


def source_folder(out_dir: Path, video_id: str) -> Path | None:
    """The RAW_DIR a video of ``out_dir`` came from (its manifest entry's own folder, else the dataset's)."""
    manifest = lineage.read(out_dir)
    for entry in manifest.get("videos", []):
        if entry.get("video_id") == video_id:
            root = entry.get("root") or manifest.get("dataset_root")
            return Path(root) if root else None
    return Path(manifest["dataset_root"]) if manifest.get("dataset_root") else None


def describe(meta: dict[str, Any]) -> str:
    """One line: run, framefleet, each stage's backend and version, the settings hash."""
    short = provenance.summary(meta)
    made = short["framefleet"]
    commit = made.get("commit")
    version = made.get("version", "?") + (
        f" (commit {provenance.with_changes(commit, made.get('modified_files', 0))})" if commit else ""
    )
    stages = " ".join(
        f"{stage}={name}" + (f" ({short['versions'][stage]})" if short["versions"].get(stage) else "")
        for stage, name in short["backends"].items()
        if name != "builtin"
    )
    return (
        f"run {short['run_id']} at {meta.get('created', '?')}; framefleet {version}; {stages}; "
        f"settings sha256 {short['settings_sha256'][:16]}"
    )


def check(out_dir: Path, files: list[Path]) -> tuple[list[str], list[str]]:
    """Return (lines to print, problems): each file's provenance, and a source hash that differs from its video."""
    lines, problems = [f"provenance of {len(files)} file(s):"], []
    for i, path in enumerate(files):
        try:
            meta = provenance.read_attrs(path)
        except (OSError, ValueError) as exc:  # cut short or not HDF5: the contract checks name it too
            problems.append(f"{path.name}: unreadable, its provenance not read ({type(exc).__name__}: {exc})")
            continue
        if meta is None:
            line = f"  {path.name}: no provenance (written by a framefleet before provenance was recorded)"
        else:
            source = meta.get("source", {})
            folder = source_folder(out_dir, path.stem)
            video = folder / source["path"] if folder and source.get("path") else None
            if video is None or not video.is_file():
                state = "video not found here, not checked"
            elif provenance.hash_file(video) == source.get("sha256"):
                state = "matches the video"
            else:
                state = "DIFFERS from the video"
                problems.append(
                    f"{path.name}: made from {source['path']} with sha256 {source.get('sha256', '')[:16]}, but "
                    f"{video} now hashes otherwise: the video changed since; redo it with --force"
                )
            line = (
                f"  {path.name}: source {source.get('path')} ({source.get('bytes')} bytes, "
                f"sha256 {source.get('sha256', '')[:16]}: {state}); {describe(meta)}"
            )
        if i < SHOWN:
            lines.append(line)
    if len(files) > SHOWN:
        lines.append(f"  ... and {len(files) - SHOWN} more")
    return lines, problems
