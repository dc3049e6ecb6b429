"""Forged job messages sent straight to the broker (a property test): whatever their shape, a real worker
creates no file outside OUT and deletes no file that existed, and refuses each naming the field, while a
job with valid fields is served. Two workers: one confined as `framefleet run` confines its own, one
started by hand as the README says (no roots of its own: the roots allowed on its host)."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.autoscaler.supervisor import worker_argv
from tasks.workers import confinement
from tests.conftest import CONFINED_ENV, send_task, task_result, wait_until
from tests.test_security import snapshot
from worker_config.settings import Settings

# Slow (about a minute a worker): make test-faults runs it; tests/test_security.py has the fast representative.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
RUN_ID, VIDEO_ID = "20261127-101010-abcdef", "clip-0123456789"
HOSTILE_IDS = ["..", ".", "", "a/../../b", "../x", "/abs", "x\x00y", "v\nforged\tline", ".hidden", "a/b", "x" * 200]


def _exist(paths: set[str]) -> dict[str, bool]:
    return {p: os.path.lexists(p) for p in paths}


@pytest.fixture(params=["as framefleet run starts it", "by hand as the README says"])
def worker(request, video_factory, workers, tmp_path):
    """(the worker's Redis URL, the sandbox, RAW, OUT, the video's name) with its worker started."""
    raw, out = tmp_path / "raw", tmp_path / "out"
    shutil.copytree(video_factory(1), raw)
    (raw / "escape.mp4").symlink_to("/etc/hostname")
    for name, text in (
        ("earlier-0123456789.hdf5", "an earlier video's dataset"),
        ("work/other-0123456789/preprocess.npz", "another video's intermediates"),
        ("markers/ab/other-0123456789.hdf5.done.json", "{}"),
        (f"runs/{RUN_ID}.outcomes/host.jsonl", ""),
    ):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "keep.txt").write_text("a folder beside OUT")
    argv = worker_argv("cpu", "forged")  # the command framefleet run starts a CPU worker with
    args = argv[argv.index("worker") + 1 :]
    args[args.index("-n") + 1] = "forged@test"
    if request.param.startswith("as framefleet run"):
        workers.launch("forged", args, env=confinement.run_env(raw, out))
    else:
        workers.env = {k: v for k, v in workers.env.items() if k not in CONFINED_ENV}
        confinement.allow(Settings(), raw, out)  # `framefleet enqueue RAW --out OUT` on this host does this
        workers.launch("forged", ["-Q", "cpu", "-n", "forged@test"])
    wait_until(lambda: workers.state("forged"), 60, "the worker to register")
    return workers.env["REDIS_URL"], tmp_path, raw, out, next(p.name for p in raw.glob("clip*"))


def test_no_forged_job_writes_outside_out_or_deletes_anything_and_a_valid_one_is_served(worker):
    url, sandbox, raw, out, video = worker
    valid = {"run_id": RUN_ID, "video_id": VIDEO_ID, "video": video, "dataset_root": str(raw), "output_root": str(out)}
    roots = {
        "dataset_root": [str(raw), "/", "/etc", str(sandbox), f"{raw}/..", str(out), "relative/raw", "", f"{raw}/"],
        "output_root": [str(out), "/", "/tmp", str(sandbox), f"{out}/..", str(sandbox / "precious"), str(raw), ""],
    }
    fields = st.fixed_dictionaries(
        {
            "video_id": st.sampled_from([VIDEO_ID, *HOSTILE_IDS]),
            "run_id": st.sampled_from([RUN_ID, *HOSTILE_IDS, "../../x"]),
            "dataset_root": st.sampled_from(roots["dataset_root"]),
            "output_root": st.sampled_from(roots["output_root"]),
            "video": st.sampled_from([video, "../../etc/passwd", "/etc/passwd", "escape.mp4", ".", "", "a\x00b"]),
        }
    ).filter(lambda f: f != valid)
    # Outside the sandbox (whose every file is compared): what a forged job could make beside a root it names
    # (the roots' own folders are shared with other programs: /tmp changes on its own), and what it could delete.
    named = {r for values in roots.values() for r in values if r.startswith("/")}
    made = ("work", "runs", "markers", f"{VIDEO_ID}.hdf5", "x.outcomes.live", "b", "abs", "x")
    watched = {os.path.normpath(os.path.join(r, *up, n)) for r in named for up in ((), ("..",)) for n in made}
    watched -= {p for p in watched if p.startswith(str(sandbox))}
    watched |= {"/etc/passwd", "/etc/hostname"}
    before, around = snapshot(sandbox), _exist(watched)
    sent: list[tuple[dict, str]] = []

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(forged=fields, stage=st.sampled_from(["framefleet.preprocess", "framefleet.h5"]))
    def forged_job_is_refused_and_writes_nothing(forged: dict, stage: str) -> None:
        job = {**forged, "intermediates": "drop", "gpus": None, "gpu": None}
        task_id = send_task(url, stage, (job,), "cpu", ignore_result=False)
        meta = wait_until(lambda: task_result(url, task_id), 60, f"{stage} of {forged}")
        assert meta["status"] == "FAILURE", (forged, meta)
        message = str(meta["result"]["exc_message"])
        assert "job refused: " in message, (forged, message)
        assert snapshot(sandbox) == before, forged  # nothing written, nothing deleted, OUT included
        assert _exist(watched) == around, forged  # nor beside any root it named
        sent.append((forged, message))

    forged_job_is_refused_and_writes_nothing()
    assert len(sent) >= 20
    served = send_task(url, "framefleet.preprocess", ({**valid, "gpus": None, "gpu": None},), "cpu")
    wait_until(lambda: (out / "work" / VIDEO_ID / "preprocess.npz").is_file(), 120, "the valid job to be served")
    after = snapshot(sandbox)
    assert set(before) <= set(after), set(before) - set(after)
    assert all(p.startswith(f"out/work/{VIDEO_ID}/") for p in set(after) - set(before)), set(after) - set(before)
    assert served
