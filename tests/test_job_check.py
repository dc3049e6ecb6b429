"""The gate's schema (tasks.job_check) and the confinement of paths a stage writes or deletes (tasks.outputs)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from tasks.errors import BadJobMessage, PathOutsideRoot
from tasks.job import Job
from tasks.job_check import JobRefused, PathRefused, check_job, shown
from tasks.outputs import intermediates
from tasks.outputs.stage_io import dataset_file, work_dir
from tasks.outputs.storage import confine, sha256_file, write_marker, write_text_atomic
from tasks.stages import STAGE_NAMES

HOSTILE_IDS = ["..", ".", "", "a/../../b", "a/b", "/abs", "v\x00", "v\nforged\tline", ".hidden", "x" * 129, 7]


def _job(tmp_path: Path, **fields: object) -> Job:
    raw, out = tmp_path / "raw", tmp_path / "out"
    raw.mkdir(exist_ok=True)
    (raw / "clip.mp4").write_bytes(b"x")
    base = Job(run_id="20261127-101010-abcdef", video_id="clip-0123456789", video="clip.mp4")
    return dataclasses.replace(base, **{"dataset_root": str(raw), "output_root": str(out), **fields})


def test_a_job_of_enqueue_s_shape_passes_and_gives_its_video(tmp_path):
    job = _job(tmp_path, chain=STAGE_NAMES, settings={STAGE_NAMES[0]: "a" * 64}, text="a hand\topens it")
    assert check_job(job, STAGE_NAMES[0], STAGE_NAMES) == tmp_path / "raw" / "clip.mp4"


@pytest.mark.parametrize("field", ["video_id", "run_id"])
@pytest.mark.parametrize("value", HOSTILE_IDS)
def test_an_id_that_could_name_another_path_or_line_is_refused_naming_the_field(tmp_path, field, value):
    with pytest.raises(JobRefused) as refused:
        check_job(_job(tmp_path, **{field: value}), STAGE_NAMES[0], STAGE_NAMES)
    assert refused.value.field == field and f"job refused: {field} " in str(refused.value)
    assert "\n" not in str(refused.value) and "\x00" not in str(refused.value)


@pytest.mark.parametrize("field", ["dataset_root", "output_root"])
@pytest.mark.parametrize("value", ["/", "relative/out", "/a/../b", "/a/./b", "/a/b/", "//a", "/a\x00b", "/a\nb", ""])
def test_a_root_must_be_absolute_normalised_and_below_slash(tmp_path, field, value):
    with pytest.raises(JobRefused) as refused:
        check_job(_job(tmp_path, **{field: value}), STAGE_NAMES[0], STAGE_NAMES)
    assert refused.value.field == field


def test_the_video_must_lie_strictly_inside_its_root_after_links(tmp_path):
    job = _job(tmp_path)
    (tmp_path / "raw" / "escape.mp4").symlink_to("/etc/hostname")
    (tmp_path / "raw" / "up").symlink_to(tmp_path)
    for video in ("../x.mp4", "/etc/passwd", "escape.mp4", "up/raw/../x", ".", "", "a\x00.mp4", "a\n.mp4"):
        with pytest.raises((PathRefused, JobRefused)) as refused:
            check_job(dataclasses.replace(job, video=video), STAGE_NAMES[0], STAGE_NAMES)
        assert refused.value.field == "video", video


@pytest.mark.parametrize(
    "fields",
    [
        {"chain": ("preprocess", "rm -rf")},
        {"settings": {"preprocess": "not-a-hash"}},
        {"settings": {"nosuch": "a" * 64}},
        {"intermediates": "purge"},
        {"text": "a\x00b"},
        {"noun": "cup\nforged"},
        {"gpus": (0, -1)},
        {"chunk_scale": 0.0},
        {"claim_waits": -1},
        {"force": "yes"},
    ],
)
def test_every_other_field_has_its_rule(tmp_path, fields):
    with pytest.raises(JobRefused) as refused:
        check_job(_job(tmp_path, **fields), STAGE_NAMES[0], STAGE_NAMES)
    assert refused.value.field == next(iter(fields))


def test_an_unknown_stage_is_refused(tmp_path):
    with pytest.raises(JobRefused, match="stage"):
        check_job(_job(tmp_path), "nosuch", STAGE_NAMES)


def test_a_log_line_shows_a_hostile_id_escaped():
    assert shown("clip-01") == "clip-01" and shown("a\nb") == "'a\\nb'" and "\x00" not in shown("a\x00")


def test_confine_refuses_the_root_itself(tmp_path):
    (tmp_path / "root").mkdir()
    for same in (".", "", "a/..", "work/.."):
        with pytest.raises(PathOutsideRoot, match="is the root itself"):
            confine(tmp_path / "root", same)
    with pytest.raises(PathOutsideRoot, match="NUL"):
        confine(tmp_path / "root", "a\x00b")
    for bad_id in ("..", "."):
        with pytest.raises(PathOutsideRoot):
            work_dir(tmp_path / "root", bad_id)


def test_dropping_intermediates_deletes_only_the_video_s_own_folder(tmp_path):
    out = tmp_path / "out"
    keep = out / "keep.txt"
    write_text_atomic(keep, "an earlier file of OUT")
    for vid in ("..", "."):  # the ids that deleted OUT, or every video's intermediates, before
        final, marker = dataset_file(out, vid)  # "...hdf5" and "..hdf5": names of OUT, as a forged h5 made them
        write_text_atomic(final, "dataset")
        write_marker(final, sha256_file(final), marker)
        with pytest.raises(PathOutsideRoot):
            intermediates.drop(out, vid)
    vid = "clip-0123456789"
    final, marker = dataset_file(out, vid)
    write_text_atomic(final, "dataset")
    write_marker(final, sha256_file(final), marker)
    write_text_atomic(work_dir(out, vid) / "preprocess.npz", "intermediate")
    assert intermediates.drop(out, vid) > 0
    assert not work_dir(out, vid).exists() and keep.exists() and final.exists() and marker.exists()


def test_a_refusal_is_a_permanent_error_of_the_job_kinds():
    assert issubclass(JobRefused, BadJobMessage) and issubclass(PathRefused, PathOutsideRoot)
    assert os.sep == "/"  # the id rule's separator


def test_a_worker_reads_its_allowed_roots_again_whenever_the_file_changes(tmp_path, monkeypatch):
    """The allowed roots are read once per version of the file, not per job; a pair added (`framefleet
    enqueue`), a file rewritten without it, or opened to others is seen by the next job of the same worker."""
    from tasks.workers import confinement
    from worker_config.settings import Settings

    monkeypatch.setitem(confinement.STATE, "worker", True)
    conf = Settings(allowed_roots_file=str(tmp_path / "state" / "allowed-roots.jsonl"))
    path = Path(conf.allowed_roots_file)
    raw, out, other = tmp_path / "raw", tmp_path / "out", tmp_path / "other"
    for folder in (raw, out, other):
        folder.mkdir()
    job = {"dataset_root": str(raw), "output_root": str(out)}
    with pytest.raises(PathOutsideRoot, match="not among the roots allowed"):
        confinement.check_roots(job, conf)  # no file yet
    confinement.allow(conf, raw, other)
    with pytest.raises(PathOutsideRoot, match="not among the roots allowed"):
        confinement.check_roots(job, conf)
    confinement.allow(conf, raw, out)  # appended: served by the next job
    confinement.check_roots(job, conf)
    confinement.check_roots(job, conf)
    kept = path.read_text().splitlines()[0] + "\n"
    fresh = path.with_name("new")
    fresh.write_text(kept)
    fresh.chmod(0o600)
    os.replace(fresh, path)  # rewritten without the pair (another inode)
    with pytest.raises(PathOutsideRoot, match="not among the roots allowed"):
        confinement.check_roots(job, conf)
    confinement.check_roots({**job, "output_root": str(other)}, conf)
    path.chmod(0o622)  # others may write it: none of its roots is allowed, from the next job on
    with pytest.raises(PathOutsideRoot, match="not among the roots allowed"):
        confinement.check_roots({**job, "output_root": str(other)}, conf)
