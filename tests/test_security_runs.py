"""Whoever can write to Redis but not to the disks (issue 48): a folder no enqueue made is no output folder, a
finished dataset is not made again by a message (forced jobs, forged callbacks), and `framefleet verify` fails
on a file made from another video or swapped with another together with their markers."""

from __future__ import annotations

import dataclasses
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


def stats(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under ``folder`` as ``lstat`` sees it: relative path -> (size, modification time ns, inode); a
    write changes the time, a replace the inode (cheaper than ``contents`` between two examples)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in filenames + dirnames:
            st = os.lstat(os.path.join(dirpath, name))
            found[os.path.relpath(os.path.join(dirpath, name), folder)] = (st.st_size, st.st_mtime_ns, st.st_ino)
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
    assert contents(root) == before, ran  # the dataset whole, nothing made beside it
    assert ran == [] and refusal is not None and "no record of run" in refusal, (ran, refusal)
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


@pytest.fixture
def served_here(redis_url, monkeypatch):
    """This process as a worker serving ``(raw, sandbox)`` on the test's Redis, as `framefleet run` confines its
    own: call it with the roots; the settings before are put back after."""
    from tasks import celery_app
    from tasks.pipeline import admission
    from worker_config.settings import load_settings

    earlier = celery_app.settings()
    monkeypatch.setitem(confinement.STATE, "worker", True)
    admission._READ.clear()

    def serve(raw: Path, sandbox: Path) -> None:
        monkeypatch.setenv("REDIS_URL", redis_url)
        conf = load_settings().model_copy(update={"dataset_root": raw, "output_root": sandbox})
        celery_app.configure(conf)

    yield serve
    admission._READ.clear()
    celery_app.configure(earlier)


def test_a_job_carrying_a_failure_meets_the_gate_too(served_here, tmp_path):
    """Issue 48, 7: a forged job with a failure record is refused like any other (it used to pass the gate by,
    and reach its chain's end with a root outside OUT)."""
    from tasks.pipeline.task import STAGE_TASKS

    raw, out, elsewhere = tmp_path / "raw", tmp_path / "out", tmp_path / "elsewhere"
    raw.mkdir(), out.mkdir()
    (raw / "v.mp4").write_bytes(b"not read")
    served_here(raw, out)
    failure = {"stage": "depth", "error_class": "BadInput", "reason": "forged", "attempts": 1, "worker": "w", "time": 0}
    job = {"run_id": "r1", "video_id": "v", "video": "v.mp4", "dataset_root": str(raw), "failed": failure}
    result = STAGE_TASKS[dataset_stage().name].apply(args=({**job, "output_root": str(elsewhere)},))
    assert result.failed() and "is outside" in str(result.result), result.result
    assert not elsewhere.exists()


def test_a_run_without_a_key_is_refused_naming_the_fix_and_its_video_counted(served_here, tmp_path):
    """A run of an earlier version (its record, no key) still in flight after an upgrade: each job is refused
    naming `--continue`, and counts as failed in its run (a real run's video, so the run ends); a job with no
    record counts nothing."""
    from tasks.job import Job
    from tasks.pipeline import admission, gate
    from tasks.pipeline.task import STAGE_TASKS
    from tasks.run.dataset import video_id_of

    raw, out = tmp_path / "raw", tmp_path / "out"
    raw.mkdir()
    (raw / "v.mp4").write_bytes(b"not read")
    runs.write(out, {"run_id": "r1", "raw_dir": str(raw), "output_root": str(out), "status": "running"})
    served_here(raw, out)
    job = Job("r1", video_id_of("v.mp4"), "v.mp4", str(raw), str(out), chain=CHAIN)
    task = STAGE_TASKS[CHAIN[0]]
    with pytest.raises(admission.RunRefused, match="--continue") as refused:
        gate.admit(task, CHAIN[0], job)
    assert not isinstance(refused.value, admission.NotTheRunsJob)  # counted: gate.refuse counts a real run's video
    with pytest.raises(admission.NotTheRunsJob, match="no record of run r2"):
        gate.admit(task, CHAIN[0], dataclasses.replace(job, run_id="r2"))
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["r1.json"]  # nothing written


def test_a_folder_beside_the_served_one_whose_name_begins_alike_is_outside(tmp_path, monkeypatch):
    """Issue 48, 7: OUT2 is not inside OUT (roots compared as paths, not as strings), for a worker's own roots
    and for the roots allowed on its host."""
    from tasks.errors import PathOutsideRoot

    monkeypatch.setitem(confinement.STATE, "worker", True)
    raw, out = tmp_path / "RAW", tmp_path / "OUT"
    own = Settings(dataset_root=raw, output_root=out)
    confinement.check_roots({"dataset_root": str(raw / "a"), "output_root": str(out / "b")}, own)  # inside: served
    allowed = Settings(allowed_roots_file=tmp_path / "state" / "allowed-roots.jsonl")
    confinement.allow(allowed, raw, out)
    confinement.check_roots({"dataset_root": str(raw), "output_root": str(out / "b")}, allowed)
    for conf in (own, allowed):
        for key, beside in (("output_root", tmp_path / "OUT2"), ("dataset_root", tmp_path / "RAW-other")):
            given = {"dataset_root": str(raw), "output_root": str(out), key: str(beside)}
            with pytest.raises(PathOutsideRoot):
                confinement.check_roots(given, conf)


def test_forged_jobs_and_callbacks_leave_a_finished_dataset_byte_identical(finished, served_here, tmp_path):  # noqa: F811
    """A property test: jobs of every stage, statistics callbacks and run records in Redis, forged by whoever
    can write to Redis (any mix of the runs, videos, folders and modes of a finished dataset, with no seal, a
    made-up one or one replayed from the finished run), run in a worker's gate and body against the dataset and a
    live run of it whose key the forger lacks: every file of OUT stays byte-identical, and verify says OK."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tasks.job import Job
    from tasks.pipeline import gate
    from tasks.pipeline.task import STAGE_TASKS
    from tasks.redis_client import get_redis
    from tasks.run import aggregate, seal

    out, raw, record = copy_of(finished, tmp_path / "out")
    done_id, live_id, unknown_id = record["run_id"], "20261129-020202-fedcba", "20261129-030303-abcdef"
    live_key = seal.create(out, live_id)  # an enqueue of the folder still sending: its record is "running"
    runs.write(out, {"run_id": live_id, "raw_dir": str(raw), "output_root": str(out), "status": "running"})
    done_key = seal.read_key(out, done_id)
    assert done_key is not None and live_key
    served_here(raw, tmp_path)
    r = get_redis(os.environ["REDIS_URL"])
    entries = manifest_entries(out)
    before, stated = contents(out), stats(out)
    folders = [str(out), str(out / "work"), str(out / "work" / entries[0]["video_id"]), str(out / "runs")]

    def replayed(run_id: str, entry: dict) -> str:
        """The seal of the finished run's own job of ``entry`` (a message seen in Redis once, sent again)."""
        job = Job(done_id, entry["video_id"], entry["path"], str(raw), str(out), chain=CHAIN, text=entry["text"])
        return seal.seal_of(done_key, job) if run_id == done_id else "0" * 24

    jobs = st.fixed_dictionaries(
        {
            "stage": st.sampled_from(CHAIN),
            "run_id": st.sampled_from([done_id, live_id, unknown_id]),
            "entry": st.sampled_from(entries),
            "other": st.sampled_from([*entries, {"video_id": "work", "path": entries[0]["path"]}]),
            "output_root": st.sampled_from(folders),
            "force": st.booleans(),
            "intermediates": st.sampled_from(["keep", "drop"]),
            "text": st.sampled_from([None, "forged caption"]),
            "seal": st.sampled_from(["none", "made up", "replayed"]),
            "failed": st.booleans(),
            "redis_record": st.booleans(),
        }
    )

    def forged_run_record(run_id: str) -> None:
        runs.publish(r, {"run_id": run_id, "output_root": str(out), "videos": 0, "callback_id": "x", "started": 1}, 60)

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(f=jobs)
    def forged_job_changes_nothing(f: dict) -> None:
        entry, other = f["entry"], f["other"]
        job = {"run_id": f["run_id"], "video_id": entry["video_id"], "video": other["path"], "dataset_root": str(raw)}
        job.update(output_root=f["output_root"], chain=list(CHAIN), force=f["force"], intermediates=f["intermediates"])
        job["text"] = entry["text"] if f["text"] is None else f["text"]
        if f["seal"] != "none":
            job["seal"] = replayed(f["run_id"], entry) if f["seal"] == "replayed" else "ab" * 12
        if f["failed"]:
            job["failed"] = {"stage": "depth", "error_class": "X", "reason": "", "attempts": 1, "worker": "", "time": 0}
        if f["redis_record"]:
            forged_run_record(f["run_id"])
        result = STAGE_TASKS[f["stage"]].apply(args=(job,))
        assert result.failed() and isinstance(result.result, gate.REFUSALS), (f, result.result)
        assert stats(out) == stated, f

    callbacks = st.fixed_dictionaries(
        {
            "run_id": st.sampled_from([done_id, live_id, unknown_id]),
            "output_root": st.sampled_from(folders),
            "videos": st.sampled_from([0, None, 3]),
            "seal": st.sampled_from(["none", "made up", "replayed"]),
            "redis_record": st.booleans(),
        }
    )

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(f=callbacks)
    def forged_callback_changes_nothing(f: dict) -> None:
        run = {"run_id": f["run_id"], "output_root": f["output_root"], "videos": f["videos"], "started": 1.0}
        if f["seal"] == "replayed":
            run["seal"] = seal.callback_seal(done_key, done_id, str(out))  # the finished run's own callback, again
        elif f["seal"] == "made up":
            run["seal"] = "cd" * 12
        if f["redis_record"]:
            forged_run_record(f["run_id"])
        aggregate.aggregate.apply(args=(run,))  # refused, or the ended run's summary returned: nothing written
        assert stats(out) == stated, f

    forged_job_changes_nothing()
    forged_callback_changes_nothing()
    assert contents(out) == before
    assert verify.main([str(out)]) == 0
