"""Whoever can write to Redis but not to the disks (issue 48): a folder no enqueue made is no output folder, a
finished dataset is not made again by a message (forced jobs, forged callbacks), and `framefleet verify` fails
on a file made from another video or swapped with another together with their markers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tasks.cli import verify
from tasks.outputs.stage_io import marker_of
from tasks.run import runs
from tasks.stages import dataset_stage
from tasks.workers import confinement
from tests.conftest import UNRECORDED_ENV, send_task, task_result, wait_until
from tests.test_security import finished  # noqa: F401 (the module's finished run, a fixture)
from worker_config.settings import Settings

CHAIN = tuple(Settings().enabled_stages())


def contents(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` but the tests' worker logs: relative path -> sha256 of its bytes (a link:
    where it leads)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        if dirpath == str(folder) and "logs" in dirnames:
            dirnames.remove("logs")
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                found[os.path.relpath(path, folder)] = "-> " + os.readlink(path)
            else:
                found[os.path.relpath(path, folder)] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return found


def copy_of(finished_out: Path, where: Path) -> tuple[Path, Path, dict]:
    """A copy of a finished run's OUT at ``where``, its record naming the copy as enqueue would have named it:
    (OUT, RAW, the record)."""
    out = Path(shutil.copytree(finished_out, where, symlinks=True))
    record = runs.latest(out)
    assert record is not None and record["status"] == "finished"
    record = runs.update(out, record["run_id"], output_root=str(out.resolve()))
    return out, Path(record["raw_dir"]), record


def manifest_entries(out: Path) -> list[dict]:
    from tasks.records import manifest

    return manifest.read(out)["videos"]


def run_chain(url: str, job: dict, queue: str = "cpu") -> tuple[list[str], str | None]:
    """Send ``job`` through its chain one stage at a time as a forger with only Redis would: (the stages that ran,
    the refusal that stopped it or None)."""
    ran = []
    for stage in job["chain"]:
        task_id = send_task(url, f"framefleet.{stage}", (job,), queue, ignore_result=False)
        meta = wait_until(lambda task_id=task_id: task_result(url, task_id), 120, f"{stage} of the forged job")
        if meta["status"] != "SUCCESS":
            message = meta["result"]["exc_message"]
            return ran, str(message[0] if isinstance(message, list) else message)
        ran.append(stage)
        job = meta["result"]
    return ran, None


@pytest.fixture
def strict(workers):
    """The test's workers without the tests' leave to serve folders holding no run record (as users run them)."""
    workers.env = {k: v for k, v in workers.env.items() if k not in UNRECORDED_ENV}
    return workers


def test_a_folder_no_enqueue_made_is_not_an_output_folder(finished, video_factory, strict, tmp_path):  # noqa: F811
    """Issue 48, 1: a worker confined to ROOT; a message names ROOT/team as its output folder and the name of a
    finished dataset kept in ROOT/team/work/ as its video, with --intermediates drop. Nothing is read, written
    or deleted: ROOT/team holds no record of the run, so it is no output folder."""
    root = tmp_path / "root"
    raw = Path(shutil.copytree(video_factory(1), root / "raw"))
    dataset = Path(shutil.copytree(finished, root / "team" / "work" / "dsA", symlinks=True))
    strict.start("cpu", env=confinement.run_env(raw, root))
    url = strict.env["REDIS_URL"]
    before = contents(root)
    video = next(p.name for p in raw.iterdir())
    job = {"run_id": "20261129-010101-abcdef", "video_id": "dsA", "video": video, "dataset_root": str(raw)}
    job.update(output_root=str(root / "team"), intermediates="drop", chain=list(CHAIN), gpus=None, gpu=None)
    ran, refusal = run_chain(url, job)
    assert ran == [] and refusal is not None and "no record of run" in refusal, (ran, refusal)
    assert contents(root) == before  # the dataset whole, nothing made beside it
    assert (dataset / "manifest.json").is_file() and len(list(dataset.glob("*.hdf5"))) == 3


def test_a_finished_dataset_is_not_made_again_by_a_forced_job_or_a_forged_callback(
    finished,  # noqa: F811
    strict,
    tmp_path,
    capsys,
):
    """Issue 48, 3: a worker as `framefleet run` starts it; a forced chain rewrites a finished video from another
    video of the folder with a caption of the forger's, then a forged statistics callback would write the run's
    summary, report and quarantine again. Every file of OUT stays byte-identical, and verify says OK."""
    out, raw, record = copy_of(finished, tmp_path / "out")
    strict.start("cpu", env=confinement.run_env(raw, out))
    url = strict.env["REDIS_URL"]
    first, other = manifest_entries(out)[:2]
    before = contents(out)
    job = {"run_id": record["run_id"], "video_id": first["video_id"], "video": other["path"]}
    job.update(dataset_root=str(raw), output_root=str(out), force=True, text="forged caption", chain=list(CHAIN))
    ran, refusal = run_chain(url, {**job, "gpus": None, "gpu": None})
    assert ran == [] and refusal is not None and "job refused" in refusal, (ran, refusal)
    # Its own id, too (a replay of the video's job with force): the run has ended.
    ran, refusal = run_chain(url, {**job, "video_id": other["video_id"], "gpus": None, "gpu": None})
    assert ran == [] and refusal is not None and "has ended" in refusal, (ran, refusal)
    forged = {"run_id": record["run_id"], "output_root": str(out), "started": 1.0, "videos": 0}
    task_id = send_task(url, "framefleet.aggregate", (forged,), "cpu", ignore_result=False)
    meta = wait_until(lambda: task_result(url, task_id), 120, "the forged callback")
    assert meta["status"] == "FAILURE" and "job refused: seal" in str(meta["result"]["exc_message"]), meta
    assert contents(out) == before
    capsys.readouterr()
    assert verify.main([str(out)]) == 0, capsys.readouterr().out


def test_verify_fails_on_a_file_made_from_another_video_or_two_swapped_with_their_markers(finished, tmp_path, capsys):  # noqa: F811
    out, _raw, _record = copy_of(finished, tmp_path / "out")
    assert verify.main([str(out)]) == 0, capsys.readouterr().out
    a, b = (e["video_id"] for e in manifest_entries(out)[:2])
    final = dataset_stage().name
    file_a, file_b = out / f"{a}.hdf5", out / f"{b}.hdf5"
    mark_a, mark_b = marker_of(out, a, final), marker_of(out, b, final)
    data_a, data_b = file_a.read_bytes(), file_b.read_bytes()
    rec_a, rec_b = json.loads(mark_a.read_text()), json.loads(mark_b.read_text())
    file_a.write_bytes(data_b), file_b.write_bytes(data_a)  # swapped, their markers' records too
    for path, rec, name in ((mark_a, rec_b, file_a), (mark_b, rec_a, file_b)):
        path.write_text(json.dumps({**rec, "file": name.name, "mtime_ns": name.stat().st_mtime_ns}))
    capsys.readouterr()
    assert verify.main([str(out)]) == 1
    printed = capsys.readouterr().out
    assert f"{a}.hdf5: made from " in printed and f"{b}.hdf5: made from " in printed, printed
    assert "rewritten from another video or swapped" in printed, printed
