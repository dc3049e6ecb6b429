"""A dataset's lineage in its manifest: the backend and settings sets it was made with, each video's
provenance and quality, and the refusal to continue it with other backends or settings.

The manifest's ``provenance`` is a list of sets, one per distinct resolved-settings hash
(``worker_config.settings.resolved_stages``) that runs wrote into the folder; a folder made
with one set has one. Entries of ``videos`` gain ``status`` ("done" or "low_quality"),
``provenance`` (tasks.outputs.provenance.summary) and ``quality`` when their run ends.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tasks.errors import DatasetError
from tasks.outputs.storage import write_text_atomic
from tasks.records import manifest as manifests
from tasks.records.manifest import MANIFEST as MANIFEST  # the lineage is kept in the manifest
from tasks.records.manifest import read as read
from worker_config.settings import Settings, resolved_stages


class SettingsChanged(DatasetError):
    """A run would add to a dataset made with other backends or settings; the message names the difference."""


def current_set(conf: Settings, run_id: str) -> dict[str, Any]:
    """The set of backends and resolved settings a run with ``conf`` makes, as the manifest records it."""
    from tasks.outputs.provenance import framefleet_version

    resolved = resolved_stages(conf)
    return {**resolved, "framefleet": framefleet_version(), "first_run": run_id, "since": time.time()}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Each stage backend or setting that differs between two sets, as ``stage.key: old -> new``."""
    found = []
    before, after = old.get("stages", {}), new.get("stages", {})
    for stage in sorted(set(before) | set(after)):
        a, b = before.get(stage), after.get(stage)
        if a is None or b is None:
            found.append(f"{stage}: {'absent' if a is None else 'on'} -> {'absent' if b is None else 'on'}")
            continue
        sa, sb = a.get("settings", {}), b.get("settings", {})
        if sa.get("backend") != sb.get("backend"):  # another backend has other parameters: the backend says it
            found.append(f"{stage}.backend: {sa.get('backend')} -> {sb.get('backend')}")
            continue
        pa, pb = sa.get("params", {}), sb.get("params", {})
        found += [
            f"{stage}.params.{k}: {pa.get(k, '(unset)')} -> {pb.get(k, '(unset)')}"
            for k in sorted(set(pa) | set(pb))
            if pa.get(k) != pb.get(k)
        ]
        if not found and a.get("sha256") != b.get("sha256"):
            found.append(f"{stage}: settings hash {a.get('sha256', '')[:12]} -> {b.get('sha256', '')[:12]}")
    return found


def check_same(out_dir: Path, conf: Settings, mixed: bool) -> list[str]:
    """Refuse (SettingsChanged) to add to ``out_dir`` with backends or settings other than those it was made
    with, unless ``mixed``; return warnings (a folder from a version that recorded no provenance)."""
    manifest = manifests.head(out_dir)  # its first line: not a million videos' entries
    if not manifest:
        return []
    sets = manifest.get("provenance") or []
    if not sets:
        return [f"{out_dir} was made by a framefleet that recorded no backends or settings; adding to it as asked"]
    now = resolved_stages(conf)
    if mixed or any(s.get("sha256") == now["sha256"] for s in sets):
        return []
    diff = "; ".join(differences(sets[-1], now)) or "the settings hash differs"
    raise SettingsChanged(
        f"{out_dir} was made with other backends or settings than these ({diff}). "
        "Use the settings it was made with (its settings.resolved.yaml), or pass --force to redo its videos "
        "with these, or --mixed to add videos made with these on purpose (the manifest and "
        "normalization_stats.yaml then list both sets)"
    )


def with_set(manifest_head: dict[str, Any], new: dict[str, Any], replace: bool) -> list[dict[str, Any]]:
    """The manifest's provenance sets after a run with set ``new`` (``replace``: it redoes every video)."""
    sets = [] if replace else list(manifest_head.get("provenance") or [])
    if not any(s.get("sha256") == new["sha256"] for s in sets):
        sets.append(new)
    return sets


def write(out_dir: Path, head: dict[str, Any], videos: list[dict[str, Any]]) -> None:
    """Write OUT/manifest.json: ``head``'s keys, then ``videos`` one a line (fast for 50,000 videos)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    top = json.dumps({k: v for k, v in head.items() if k != "videos"})[:-1]
    # One video a line: json.dumps with indent runs the pure-Python encoder (9 s for 50,000 videos).
    lines = ",\n".join(json.dumps(v) for v in videos)
    write_text_atomic(out_dir / MANIFEST, f'{top}, "videos": [\n{lines}\n]}}\n')


_PROVENANCE, _SOURCE, _DONE = '"provenance": {', ', "source_sha256"', '"status": "done"'


def _done_set(line: str, fields: str | None) -> str | None:
    """The text that names a done video's (backends, settings hash, framefleet), found as json.dumps writes
    it in its line or its recorded fields (the newer); None when the video is not done."""
    if fields is not None and '"status": ' in fields:
        if _DONE not in fields:
            return None
        if _PROVENANCE in fields:
            line = fields
    elif _DONE not in line:
        return None
    at, end = line.find(_PROVENANCE), line.find(_SOURCE)
    if at < 0 or end < at:
        entry = json.loads(manifests.merged(line, fields))
        return json.dumps(entry.get("provenance") or {}, sort_keys=True)[:-1]
    return line[at + len(_PROVENANCE) - 1 : end]


def backend_sets(out_dir: Path) -> list[dict[str, Any]]:
    """The distinct (backends, settings hash, framefleet version) of the manifest's done videos, with
    counts: one pass over its lines, each looked into without parsing it (a million videos: 861 MB)."""
    return [entry for _key, entry in backend_sets_over(out_dir)[0]]


def backend_sets_over(out_dir: Path) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """``backend_sets`` with each set's ``set_key``, and the ids of the done videos they count."""
    found: Counter[str] = Counter()
    done: list[str] = []
    for line, fields in manifests.pairs(out_dir):
        named = _done_set(line, fields)
        if named is not None:
            found[named] += 1
            vid = manifests.video_id_of(line)
            done.append(vid if vid is not None else json.loads(line).get("video_id", ""))
    return grouped_sets((json.loads(named + "}"), videos) for named, videos in found.items()), done


def set_key(prov: dict[str, Any]) -> str:
    """What makes a video's (backends, settings hash, framefleet version) one set, whatever the order of its keys."""
    return json.dumps([prov.get("backends"), prov.get("settings_sha256"), prov.get("framefleet")], sort_keys=True)


def grouped_sets(found: Iterable[tuple[dict[str, Any], int]]) -> list[tuple[str, dict[str, Any]]]:
    """(``set_key``, the set with its count) of each distinct set of ``found`` (a video's short provenance as its
    line records it, how many videos), the most videos first; the first provenance of a set names its backends."""
    counts: dict[str, dict[str, Any]] = {}
    for prov, videos in found:
        entry = counts.setdefault(
            set_key(prov),
            {
                "backends": prov.get("backends") or "unrecorded",
                "settings_sha256": prov.get("settings_sha256"),
                "framefleet": prov.get("framefleet"),
                "videos": 0,
            },
        )
        entry["videos"] += videos
    return sorted(counts.items(), key=lambda s: -s[1]["videos"])


def added_sets(earlier: list[dict[str, Any]], run: dict[str, int]) -> list[tuple[str, dict[str, Any]]] | None:
    """The backend sets of the videos of ``earlier`` (``tasks.statistics.sums.load_sets``' sets) and of a run's
    done videos (``run``: the JSON of each video's [backends, settings hash, framefleet] → how many, tasks.run.tally's
    ``p:`` counters) as ``backend_sets`` lists them when the manifest's done videos are those two disjoint
    groups; None when the pass alone can say it: two sets of as many videos (the pass lists them in
    manifest order), or one set named with its backends in two orders."""
    grouped = {entry["key"]: {k: v for k, v in entry.items() if k != "key"} for entry in earlier}
    names = {key: json.dumps(entry["backends"]) for key, entry in grouped.items()}
    for text, videos in run.items():
        backends, sha, version = json.loads(text)
        prov = {"backends": backends, "settings_sha256": sha, "framefleet": version}
        key = set_key(prov)
        entry = grouped.setdefault(
            key,
            {"backends": backends or "unrecorded", "settings_sha256": sha, "framefleet": version, "videos": 0},
        )
        if names.setdefault(key, json.dumps(backends or "unrecorded")) != json.dumps(backends or "unrecorded"):
            return None
        entry["videos"] += videos
    counts = [entry["videos"] for entry in grouped.values() if entry["videos"]]
    if len(set(counts)) != len(counts):
        return None
    return sorted(grouped.items(), key=lambda s: -s[1]["videos"])
