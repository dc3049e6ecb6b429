"""The fence before publishing: a run whose claim another run took over writes nothing (real Redis, real files,
and the stage task's own code path, ``execute`` with the ``Claim`` hook, on a real video)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from tasks.delivery import claims
from tasks.errors import ClaimLost, ClaimUnconfirmed
from tasks.job import Job
from tasks.outputs.stage_io import marker_of, output_path, read_done
from tasks.outputs.storage import read_marker, save_npz, write_marker
from tasks.pipeline.claim import Claim
from tasks.pipeline.execute import execute
from tasks.pipeline.hooks import StageCall
from tasks.workers import worker

KEY = claims.claim_key("/data/out", "clip_00", "depth")


@pytest.fixture
def r(redis_url: str) -> redis.Redis:
    claims.HELD.clear()
    yield redis.Redis.from_url(redis_url, decode_responses=True)
    claims.HELD.clear()


def test_a_run_that_still_holds_its_claim_publishes(r, tmp_path):
    assert claims.acquire(r, KEY, "gpu0@hostB task-1", ttl_s=30) is None
    out = tmp_path / "depth.npz"
    digest = save_npz(out, {"x": [1, 2, 3]}, fence=lambda: claims.confirm(r, KEY, 30))
    write_marker(out, digest, fence=lambda: claims.confirm(r, KEY, 30))
    assert read_marker(out) is not None


def test_a_lapsed_claim_nobody_took_is_taken_back(r):
    assert claims.acquire(r, KEY, "gpu0@hostB task-1", ttl_s=30) is None
    r.delete(KEY)  # expired while the host was away, and no other run claimed the stage
    claims.confirm(r, KEY, 30)
    assert r.get(KEY) == "gpu0@hostB task-1" and 0 < r.pttl(KEY) <= 30_000


def test_a_run_whose_claim_another_run_took_publishes_nothing(r, tmp_path):
    out = tmp_path / "depth.npz"
    first = save_npz(out, {"x": [1, 2, 3]})  # what the other host published
    write_marker(out, first)
    assert claims.acquire(r, KEY, "gpu0@hostB task-1", ttl_s=30) is None
    r.set(KEY, "gpu0@hostA task-1")  # hostB's claim lapsed while it was cut off; hostA took the stage over
    with pytest.raises(ClaimLost, match="gpu0@hostA"):
        save_npz(out, {"x": [9, 9, 9]}, fence=lambda: claims.confirm(r, KEY, 30))
    assert read_marker(out)["sha256"] == first  # hostA's output and marker untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["depth.npz", "depth.npz.done.json"]  # no temporary left
    assert r.get(KEY) == "gpu0@hostA task-1"


def test_a_run_that_cannot_reach_redis_publishes_nothing_and_retries(r, tmp_path):
    assert claims.acquire(r, KEY, "gpu0@hostB task-1", ttl_s=30) is None
    unreachable = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    out = tmp_path / "depth.npz"
    with pytest.raises(ClaimUnconfirmed, match=KEY) as caught:
        save_npz(out, {"x": [1]}, fence=lambda: claims.confirm(unreachable, KEY, 30))
    assert caught.value.delay_s > 0  # retried
    assert list(tmp_path.iterdir()) == []


def test_temporaries_of_a_writer_that_died_are_cleared_and_nothing_else(tmp_path):
    from tasks.outputs.storage import clear_temporaries

    out = tmp_path / "depth.npz"
    (tmp_path / ".depth.npz.1a2b3c4d.tmp").write_bytes(b"torn")  # a host killed mid-write
    (tmp_path / ".tracks.npz.1a2b3c4d.tmp").write_bytes(b"another stage's")
    save_npz(out, {"x": [1]})
    assert clear_temporaries(out) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tracks.npz.1a2b3c4d.tmp", "depth.npz"]


class Meanwhile:
    """A real stage whose run is followed, once, by ``then``: what another host does while this run computes."""

    def __init__(self, stage: Any, then: Callable[[], None]) -> None:
        self.stage = stage
        self.then: Callable[[], None] | None = then

    def run(self, inputs: dict[str, Any], progress: Any = None) -> dict[str, Any]:
        out = self.stage.run(inputs, progress=progress)
        then, self.then = self.then, None  # the other host's own run of the stage goes straight through
        if then is not None:
            then()
        return out


@pytest.fixture
def late_writer(app_on_test_redis, video_factory, tmp_path, monkeypatch):
    """A preprocess job on a real video, its claim held by this process (hostB), and a way to run the stage
    through the task's own code (``execute`` with the ``Claim`` hook's fence) while another host acts."""
    conf, r = app_on_test_redis
    raw = video_factory(1)
    job = Job(
        "run-1",
        "clip_00",
        video=next(p.name for p in raw.iterdir()),
        dataset_root=str(raw),
        output_root=str(tmp_path / "out"),
        chain=("preprocess", "depth"),
    )
    key = claims.claim_key(job.output_root, job.video_id, "preprocess")
    claims.HELD.clear()
    assert claims.acquire(r, key, "cpu@hostB task-1", conf.lease_ttl_s) is None
    real = worker.load_stage("preprocess", "cpu")
    output = output_path(Path(job.output_root), job.video_id, "preprocess")
    marker = marker_of(Path(job.output_root), job.video_id, "preprocess")

    def run(meanwhile: Callable[[], None]) -> dict[str, Any]:
        monkeypatch.setitem(worker.STAGES, "preprocess", Meanwhile(real, meanwhile))
        return execute(StageCall(None, "preprocess", job, job), [Claim()])  # type: ignore[arg-type]

    yield SimpleNamespace(r=r, job=job, key=key, run=run, output=output, marker=marker)
    claims.HELD.clear()


def _stamp(path: Path) -> tuple[int, int, bytes]:
    st = path.stat()
    return st.st_mtime_ns, st.st_ino, path.read_bytes()


def test_a_run_cut_off_while_another_host_finished_the_stage_publishes_nothing(late_writer):
    """hostB's claim lapsed while it was cut off; hostA took the stage over, finished it and released its claim.
    hostB's fence finds the claim free again, but the marker written since it looked is another run's."""
    w = late_writer
    made: dict[str, Any] = {}

    def host_a_finishes() -> None:
        w.r.set(w.key, "cpu@hostA task-1")  # hostB's claim lapsed; hostA claimed the stage ...
        execute(StageCall(None, "preprocess", w.job, w.job))  # type: ignore[arg-type]  # ... ran it to the end ...
        w.r.delete(w.key)  # ... and released its claim
        made.update(output=_stamp(w.output), marker=_stamp(w.marker))

    with pytest.raises(ClaimLost, match="completed by another run"):
        w.run(host_a_finishes)
    assert (_stamp(w.output), _stamp(w.marker)) == (made["output"], made["marker"])  # hostA's files, untouched
    assert read_done(Path(w.job.output_root), w.job.video_id, "preprocess") is not None
    assert [p.name for p in w.output.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_a_run_whose_claim_another_host_holds_publishes_nothing(late_writer):
    """hostA took the stage over and still runs it: hostB, back, writes neither an output nor a marker."""
    w = late_writer
    with pytest.raises(ClaimLost, match="cpu@hostA"):
        w.run(lambda: w.r.set(w.key, "cpu@hostA task-1"))
    assert sorted(p.name for p in w.output.parent.iterdir()) == []
    assert w.r.get(w.key) == "cpu@hostA task-1"


def test_a_run_that_keeps_its_claim_publishes_through_the_same_path(late_writer):
    """The fence lets the holder through: the two tests above fail for the fence, not for the set-up."""
    w = late_writer
    w.run(lambda: None)
    assert read_done(Path(w.job.output_root), w.job.video_id, "preprocess") is not None


def test_a_run_that_cannot_confirm_its_claim_is_sent_again_10_s_later(app_on_test_redis):
    """The README's promise: output discarded, the stage run again 10 s later (then 20, 40: the stage's backoff)."""
    from celery.exceptions import Retry

    from tasks.pipeline import STAGE_TASKS
    from tasks.pipeline.retries import Retries

    conf, r = app_on_test_redis
    claims.HELD.clear()
    assert claims.acquire(r, KEY, "gpu0@hostB task-1", ttl_s=30) is None
    unreachable = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    with pytest.raises(ClaimUnconfirmed) as caught:
        claims.confirm(unreachable, KEY, 30)
    task = STAGE_TASKS["h5"]
    job = Job("run-1", "clip_00", video="clip_00.mp4", output_root="/data/out", chain=("preprocess", "h5"))
    for tries, countdown_s in ((0, 10), (1, 20)):
        task.push_request(id=f"task-{tries}", retries=tries, args=(job.to_dict(),), kwargs={}, called_directly=False)
        try:
            with pytest.raises(Retry) as retried:
                Retries().after_failure(StageCall(task, "h5", job, job), caught.value)
        finally:
            task.pop_request()
        assert retried.value.when == countdown_s
    sent = [json.loads(raw) for raw in r.lrange(conf.cpu_queue, 0, -1)]
    assert [m["headers"]["retries"] for m in sent] == [2, 1]  # the second retry is the newest, at the left
    claims.HELD.clear()


def test_a_run_whose_confirm_is_answered_after_another_host_finished_publishes_nothing(late_writer, monkeypatch):
    """hostB, cut off, sends its confirm; Redis answers only once hostB is back, after hostA has claimed, finished
    and released the stage. The confirm then finds the claim free and takes it: the marker must be read after it.
    (Seen on two namespaced hosts: the stage ran to its output on both, hostA's output overwritten.)"""
    w = late_writer
    made: dict[str, Any] = {}

    def host_a_finishes() -> None:
        w.r.set(w.key, "cpu@hostA task-1")
        execute(StageCall(None, "preprocess", w.job, w.job))  # type: ignore[arg-type]
        w.r.delete(w.key)
        made.update(output=_stamp(w.output), marker=_stamp(w.marker))

    class SlowConfirm(Claim):
        """The Claim hook's fence, whose round trip hostA's whole run overtakes (once)."""

        overtaken = False

        def fence(self, call: StageCall) -> None:
            if not self.overtaken:
                self.overtaken = True
                host_a_finishes()
            super().fence(call)

    monkeypatch.setitem(worker.STAGES, "preprocess", worker.load_stage("preprocess", "cpu"))
    with pytest.raises(ClaimLost, match="completed by another run"):
        execute(StageCall(None, "preprocess", w.job, w.job), [SlowConfirm()])  # type: ignore[arg-type]
    assert (_stamp(w.output), _stamp(w.marker)) == (made["output"], made["marker"])  # hostA's files, untouched
    assert [p.name for p in w.output.parent.iterdir() if p.name.endswith(".tmp")] == []
