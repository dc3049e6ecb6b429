"""OUT/manifest.json and what runs recorded beside it, read and rewritten over real files: a folder added to
another's output, an enqueue refused mid-way, video ids json.dumps escapes, ids whose hashes clash, a manifest
of an earlier version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _videos(folder: Path, names: list[str]) -> list[Path]:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(name.encode())
    return sorted((folder / name for name in names), key=lambda p: p.parts)


def _listed(out: Path) -> list[tuple[str | None, str]]:
    from tasks.records import manifest

    return [(e.get("root"), e["path"]) for e in map(json.loads, manifest.lines(out))]


def test_videos_added_from_another_folder_follow_the_first_folders_and_an_enqueue_refused_changes_nothing(tmp_path):
    """``--add``: the added folder's videos carry their root and sort after the first folder's, through a
    ``--continue`` of the first folder that adds a video; a path of both folders is refused, leaving the
    manifest as it was and no part of the refused one."""
    from tasks.records import manifest
    from tasks.run.dataset import DatasetError, write_manifest

    first, added, out = tmp_path / "first", tmp_path / "added", tmp_path / "outs" / "out"  # made with its parent
    ours = _videos(first, ["a.mp4", "z.mp4"])
    write_manifest(first, out, ours, "run-1")
    write_manifest(added, out, _videos(added, ["b.mp4"]), "run-2")
    (out / "runs" / ".manifest.json.0badc0de.tmp").write_text("{")  # an enqueuer killed mid-way left its part
    write_manifest(first, out, ours + _videos(first, ["zz.mp4"]), "run-3")
    root = str(added.resolve())
    want = [(None, "a.mp4"), (None, "z.mp4"), (None, "zz.mp4"), (root, "b.mp4")]
    assert _listed(out) == want
    assert manifest.head(out)["roots"] == [str(first.resolve()), root] and manifest.head(out)["order"] == "parts"
    assert not list((out / "runs").glob(".manifest.json.*"))

    before = (out / "manifest.json").read_text()
    with pytest.raises(DatasetError, match="z.mp4 of .* has the same path as a video of"):
        write_manifest(added, out, _videos(added, ["b.mp4", "c.mp4", "z.mp4"]), "run-4")
    assert (out / "manifest.json").read_text() == before and _listed(out) == want
    assert not list((out / "runs").glob(".manifest.json.*"))


@pytest.mark.parametrize("clash", [False, True], ids=["own-hashes", "one-hash"])
def test_what_runs_recorded_is_read_for_each_video_whatever_its_id(tmp_path, monkeypatch, clash):
    """Ids json.dumps escapes (an earlier manifest's, or one edited by hand) are read through the parse; ids
    whose hashes clash (every id's here, with ``one-hash``) each get their own fields."""
    from tasks.records import lineage, manifest, outcome_files

    if clash:
        monkeypatch.setattr(manifest, "hash", lambda vid: 7, raising=False)
    out = tmp_path / "out"
    ids = ["v0", 'odd"id', "back\\slash", "v3", "v4"]
    lineage.write(out, {"order": manifest.ORDER}, [{"video_id": v, "path": f"{n}.mp4"} for n, v in enumerate(ids)])
    assert [e["video_id"] for e in map(json.loads, manifest.lines(out))] == ids  # nothing recorded: every line
    assert not manifest.outcomes(out)

    recorded = {ids[0]: "done", ids[1]: "failed", ids[2]: "low_quality", ids[3]: "done"}
    for vid, status in recorded.items():
        outcome_files.append(out, "run-1", vid, status, {"quality": {"q": vid}})
    ended, _ = outcome_files.close(out, "run-1", [])
    (ended / "0-empty.jsonl").touch()  # a segment with nothing in it, read first
    (ended / "zz-torn.jsonl").write_text(f'{ids[4]}\t{{"status": "do\n')  # a line cut short, read last
    found = manifest.outcomes(out)
    assert len(found) == 4 and found.get(ids[4]) is None and found.get("v9") is None and found.get(None) is None
    want = [(vid, recorded.get(vid), {"q": vid} if recorded.get(vid, "failed") != "failed" else None) for vid in ids]
    for entries in (manifest.read(out)["videos"], list(map(json.loads, manifest.lines(out)))):
        assert [(e["video_id"], e.get("status"), e.get("quality")) for e in entries] == want


def test_a_folder_with_recorded_outcomes_and_no_manifest_reads_as_none(tmp_path):
    from tasks.records import manifest, outcome_files

    out = tmp_path / "out"
    outcome_files.append(out, "run-1", "v0", "done", {})
    outcome_files.close(out, "run-1", [])
    assert manifest.read(out) == {} and list(manifest.lines(out)) == [] and manifest.head(out) == {}


def test_a_video_whose_entry_changed_keeps_what_runs_recorded_and_is_listed_once(tmp_path):
    from tasks.records import lineage, manifest
    from tasks.run.dataset import write_manifest

    raw, out = tmp_path / "raw", tmp_path / "out"
    videos = _videos(raw, ["a.mp4", "b.mp4", "c.mp4"])
    write_manifest(raw, out, videos, "run-1")
    entries = [json.loads(line) for line in manifest.lines(out)]
    entries[1].update(status="done", quality={"q": 1})
    lineage.write(out, manifest.head(out), entries)  # what a run's end recorded, in the file
    videos[1].write_bytes(b"replaced by a longer video")
    write_manifest(raw, out, videos, "run-2")
    after = [json.loads(line) for line in manifest.lines(out)]
    assert [e["path"] for e in after] == ["a.mp4", "b.mp4", "c.mp4"]
    assert (after[1]["bytes"], after[1]["status"], after[1]["quality"]) == (26, "done", {"q": 1})


def test_a_manifest_of_an_earlier_version_is_read_in_order_and_rewritten_in_this_versions_form(tmp_path):
    """An earlier version wrote indented JSON, its videos in another order: read whole once and sorted by
    (root, path parts); the next enqueue writes it one video a line, keeping what it recorded."""
    from tasks.records import lineage, manifest
    from tasks.run.dataset import write_manifest

    raw, out = tmp_path / "raw", tmp_path / "out"
    videos = _videos(raw, ["a-b/c.mp4", "a/z.mp4", "a.mp4"])
    write_manifest(raw, out, videos, "run-1")
    entries = [json.loads(line) for line in manifest.lines(out)]
    entries[0]["status"] = "done"
    top = {"dataset_root": str(raw.resolve()), "last_run": "run-1"}
    (out / "manifest.json").write_text(json.dumps({**top, "videos": entries[::-1]}, indent=2))
    assert manifest.head(out) == top
    assert list(manifest.lines(out)) == [json.dumps(e) for e in entries]
    assert [e["path"] for e in entries] == ["a/z.mp4", "a-b/c.mp4", "a.mp4"]  # by parts: "a" < "a-b" < "a.mp4"
    write_manifest(raw, out, videos, "run-2")
    assert manifest.head(out)["order"] == "parts" and list(manifest.lines(out)) == [json.dumps(e) for e in entries]

    lineage.write(out, {"order": manifest.ORDER}, [])  # a manifest of no videos
    assert list(manifest.lines(out)) == [] and manifest.read(out)["videos"] == []
