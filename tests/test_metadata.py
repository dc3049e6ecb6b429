"""metadata.csv: each video's text and noun by its path or y2r's numeric id, and the errors users get."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tasks.run.dataset import build_jobs, write_manifest
from tasks.run.metadata import ClipText, MetadataError, texts_for
from tests.conftest import PIPELINE_ENV, ROOT, run_script


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    folder = tmp_path / "raw"
    for name in ("b.mp4", "a.mp4", "kitchen/take_2.mov"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"not decoded here")
    return folder


def videos(raw: Path) -> list[Path]:
    return sorted(p for p in raw.rglob("*") if p.suffix in (".mp4", ".mov"))


def write_csv(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_paths_and_y2r_numeric_ids_both_name_videos(raw: Path) -> None:
    # Sorted: a.mp4 (0), b.mp4 (1), kitchen/take_2.mov (2); "1" names no path, so it is y2r's index.
    write_csv(
        raw / "metadata.csv",
        'clip_id,noun,text\na,cup,lift the cup\n1,lid,open the lid\nkitchen/take_2,towel,"fold the towel, twice"\n',
    )
    found = texts_for(raw, videos(raw))
    assert found == {
        "a": ClipText("lift the cup", "cup"),
        "b": ClipText("open the lid", "lid"),
        "kitchen/take_2": ClipText("fold the towel, twice", "towel"),
    }


def test_the_manifest_and_the_job_carry_text_and_noun(raw: Path, tmp_path: Path) -> None:
    write_csv(raw / "metadata.csv", "clip_id,noun,text\n0,cup,lift the cup\n")
    out = tmp_path / "out"
    entries = write_manifest(raw, out, videos(raw), "run1", texts_for(raw, videos(raw)))
    assert [(e["path"], e["text"], e["noun"]) for e in entries] == [
        ("a.mp4", "lift the cup", "cup"),
        ("b.mp4", "", ""),
        ("kitchen/take_2.mov", "", ""),
    ]
    jobs, _ = build_jobs(entries[:1], raw, out, "run1")
    job = jobs[0]
    assert (job.text, job.noun) == ("lift the cup", "cup")


def test_a_video_without_a_row_warns_or_with_require_text_fails(raw: Path, caplog) -> None:
    write_csv(raw / "metadata.csv", "clip_id,noun,text\na,cup,lift the cup\nb,lid,\nzzz,x,y\n")
    with caplog.at_level(logging.WARNING, logger="framefleet.metadata"):
        found = texts_for(raw, videos(raw))
    assert found["a"].text == "lift the cup" and found["b"] == ClipText("", "lid")
    assert "2 of 3 videos have no text" in caplog.text and "'b', 'kitchen/take_2'" in caplog.text
    assert "1 rows name no video" in caplog.text and "'zzz'" in caplog.text
    with pytest.raises(MetadataError, match=r"2 of 3 videos have no text, e\.g\. 'b', 'kitchen/take_2'"):
        texts_for(raw, videos(raw), require_text=True)
    # Only this run's videos count: a --limit that leaves the undescribed ones out passes.
    assert texts_for(raw, videos(raw), require_text=True, selected=videos(raw)[:1])["a"].noun == "cup"


def test_errors_name_the_file_the_column_and_the_fix(raw: Path, tmp_path: Path) -> None:
    bad = write_csv(tmp_path / "bad.csv", "clip_id,text\na,lift the cup\n")
    with pytest.raises(MetadataError, match=r"bad\.csv: no column 'noun' in the header \['clip_id', 'text'\]"):
        texts_for(raw, videos(raw), bad)
    twice = write_csv(tmp_path / "twice.csv", "clip_id,noun,text\na,cup,one\n0,cup,two\n")
    with pytest.raises(MetadataError, match="lines 2 and 3 both describe 'a'; keep one row per video"):
        texts_for(raw, videos(raw), twice)
    with pytest.raises(MetadataError, match="no metadata file at .*missing.csv"):
        texts_for(raw, videos(raw), tmp_path / "missing.csv")
    assert texts_for(raw, videos(raw)) == {}  # no file, no flag: no text and no complaint
    with pytest.raises(MetadataError, match="no metadata file at .*metadata.csv"):
        texts_for(raw, videos(raw), require_text=True)


def test_run_local_refuses_a_bad_metadata_file_before_starting_anything(raw: Path, tmp_path: Path) -> None:
    bad = write_csv(tmp_path / "bad.csv", "video,text\na,lift the cup\n")
    env = {k: v for k, v in os.environ.items() if k not in PIPELINE_ENV}
    env["PYTHONPATH"] = str(ROOT)
    done = run_script("run_local.py", str(raw), "--out", str(tmp_path / "out"), "--metadata", str(bad), env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no column 'clip_id', 'noun'" in done.stderr and not (tmp_path / "out" / "logs").exists()


def test_text_with_a_nul_or_a_control_character_is_refused_at_enqueue_naming_the_row(raw: Path) -> None:
    for bad, column in (("open\x00 the lid", "text"), ('"two\nlines"', "text"), ("lid\x1b[2J", "noun")):
        text, noun = (bad, "lid") if column == "text" else ("open the lid", bad)
        write_csv(raw / "metadata.csv", f"clip_id,noun,text\na,cup,lift the cup\nb,{noun},{text}\n")
        with pytest.raises(MetadataError, match=rf"line 3 \('b'\): its {column} .* control character"):
            texts_for(raw, videos(raw))
    write_csv(raw / "metadata.csv", "clip_id,noun,text\nb,lid,open\tthe lid\n")  # a tab is text
    assert texts_for(raw, videos(raw))["b"].text == "open\tthe lid"
