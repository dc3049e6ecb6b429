"""Bad inputs and hostile messages: each is processed or quarantined with a reason; nothing else is touched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import redis
from kombu import Connection, Exchange, Producer

from tasks.cli.sample import make_corrupt_inputs, make_video
from tests.conftest import ROOT, Workers, run_script, send_task, task_result, wait_until
from tests.faults.conftest import RedisServer, _pings, assert_nothing_lost, env_for, free_port, record
from tests.redis_servers import certificates
from tests.test_flower_monitoring import Flower


# In the CI fault tier (make test-ci-faults); what stands for it in `make test`:
# tests/test_pipeline_e2e.py::test_corrupt_inputs_end_as_failure_records_and_the_rest_finishes.
@pytest.mark.slow
@pytest.mark.ci_fault
def test_corrupt_and_odd_inputs_each_end_processed_or_quarantined(fault_raw, fault_workers, fault_env, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(fault_raw, raw)
    bad = make_corrupt_inputs(raw)
    make_video(raw / "one frame.mp4", 320, 240, 10, 0.1, seed=3)
    make_video(raw / "huge.mp4", 3840, 2160, 10, 1.0, seed=4)  # one track window: 10 frames
    make_video(raw / "vidéo ünïcode 東京.MOV", 480, 360, 15, 1.2, seed=5)
    fault_workers.start("cpu")
    fault_workers.start("gpu0")
    out = tmp_path / "out"
    done = run_script("enqueue_dataset.py", str(raw), "--out", str(out), env=fault_env, timeout_s=400)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads((out / "run_summary.json").read_text())
    failed = {f["video"]: f for f in summary["failed"]}
    expected_bad = {p.name for p in bad.values()}  # zero_frames.mp4: a video with no decodable frame
    assert expected_bad <= set(failed), failed.keys()
    for name in expected_bad:
        assert failed[name]["error_class"] == "BadInput" and name in failed[name]["reason"], failed[name]
    for name in ("huge.mp4", "vidéo ünïcode 東京.MOV", *(p.name for p in fault_raw.iterdir())):
        assert name not in failed, failed.get(name)
    one = failed.get("one frame.mp4")
    if one is not None:  # quarantined is fine, with a reason naming the problem
        assert one["reason"]
    assert summary["done"] == len(list(raw.iterdir())) - len(failed)
    assert_nothing_lost(out)
    record(
        "corrupt and odd inputs", "truncated, empty, text, zero-frame, 1-frame, 4K, non-ASCII names", out, None, None
    )


class _LeavesATrace:
    """A pickle whose loading makes a directory: if a worker ever unpickled it, the directory would exist."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_pickled_messages_are_rejected_and_logged(fault_workers, fault_env, tmp_path):
    marker = tmp_path / "pwned"
    fault_workers.start("cpu")
    with Connection(fault_env["REDIS_URL"]) as conn:
        producer = Producer(
            conn.channel(), exchange=Exchange("cpu", type="direct"), routing_key="cpu", serializer="pickle"
        )
        producer.publish(
            ((_LeavesATrace(str(marker)),), {}, {}),
            headers={"task": "framefleet.preprocess", "id": "p1", "lang": "py", "argsrepr": "", "kwargsrepr": ""},
            declare=[],
        )
    wait_until(lambda: "pickle" in fault_workers.log("cpu").lower(), 30, "the refusal in the log")
    r = redis.Redis.from_url(fault_env["REDIS_URL"])
    wait_until(lambda: r.llen("cpu") == 0, 10, "the message to be consumed")
    assert not marker.exists()
    assert "ContentDisallowed" in fault_workers.log("cpu") or "untrusted content" in fault_workers.log("cpu")


def test_paths_outside_the_roots_are_refused_without_reading(fault_raw, fault_workers, fault_env, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(fault_raw, raw)
    (raw / "escape.mp4").symlink_to("/etc/hostname")
    fault_workers.start("cpu", env={"FRAMEFLEET_DATASET_ROOT": str(raw)})
    out = tmp_path / "out"
    jobs = {
        "../../etc/passwd": "leaves the root",
        "/etc/passwd": "absolute path",
        "escape.mp4": "leaves the root",
        "clip 00.mp4": "outside",
    }
    results = {}
    for rel in jobs:
        # The last names a real video, but of a dataset root the worker does not serve.
        root = fault_raw if rel == "clip 00.mp4" else raw
        job = {
            "run_id": "r",
            "video_id": "v" + str(len(results)),
            "video": rel,
            "dataset_root": str(root),
            "output_root": str(out),
            "gpus": None,
            "gpu": None,
        }
        # A stage before the last stores no result unless asked: this test reads each refusal from it.
        results[rel] = send_task(fault_env["REDIS_URL"], "framefleet.preprocess", (job,), "cpu", ignore_result=False)
    for rel, why in jobs.items():
        meta = wait_until(
            lambda rel=rel: task_result(fault_env["REDIS_URL"], results[rel]), 60, f"the result for {rel}"
        )
        # The gate refuses it (tasks.pipeline.gate): the task fails with the refusal, naming the field.
        assert meta["status"] == "FAILURE", meta
        refusal = meta["result"]
        assert refusal["exc_type"] in ("PathRefused", "PathOutsideRoot"), refusal
        assert why in str(refusal["exc_message"]) and "job refused: " in str(refusal["exc_message"]), refusal
    assert not out.exists()  # refused jobs write nothing: no file, no folder


# In the CI fault tier (make test-ci-faults); what stands for it in `make test`:
# test_tls_with_a_password_works_and_the_password_never_shows, below (a password over TLS).
@pytest.mark.slow
@pytest.mark.ci_fault
def test_a_redis_password_works_and_never_shows(fault_raw, tmp_path):
    folder = tmp_path / "redis"
    folder.mkdir()
    server = RedisServer(folder, password="s3cr3t-pw")
    server.start()
    env = env_for(server.url)
    pool = Workers(env, tmp_path / "logs")
    try:
        pool.start("cpu")
        pool.start("gpu0")
        out = tmp_path / "out"
        done = run_script("enqueue_dataset.py", str(fault_raw), "--out", str(out), env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert_nothing_lost(out)
        texts = [done.stdout, done.stderr] + [p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*")]
        texts += [p.read_text(errors="replace") for p in out.rglob("*") if p.suffix in {".json", ".yaml", ".jsonl"}]
        assert not [t for t in texts if "s3cr3t-pw" in t]
        assert "redis://:***@" in (out / "settings.resolved.yaml").read_text()
        # Flower's pages, the worker's configuration page included, show the URL masked.
        flower = Flower(env, tmp_path / "flower.log", "ops:flower-pw", "--address=127.0.0.1")
        try:
            flower.wait_ready()
            wait_until(lambda: "gpu0@test" in flower.get("/api/workers")[1], 30, "Flower to see the worker")
            pages = {
                path: flower.get(path)
                for path in ("/", "/workers", "/broker", "/tasks", "/api/workers", "/api/tasks", "/worker/gpu0@test")
            }
            assert all(status == 200 for status, _ in pages.values()), {p: s for p, (s, _) in pages.items()}
            assert not [path for path, (_, body) in pages.items() if "s3cr3t-pw" in body]
            assert "s3cr3t-pw" not in flower.log.read_text()
        finally:
            flower.stop()
    finally:
        pool.stop_all()
        server.stop()


def test_processes_are_started_with_argument_lists_never_a_shell():
    sources = [p for d in ("tasks", "scripts", "worker_config") for p in (ROOT / d).rglob("*.py")]
    offenders = [str(p) for p in sources if "shell=True" in p.read_text() or "os.system(" in p.read_text()]
    assert offenders == []
    assert os.path.exists(ROOT / "scripts" / "run_local.py")


def test_tls_with_a_password_works_and_the_password_never_shows(fault_raw, tmp_path):
    folder = tmp_path / "tls"
    folder.mkdir()
    certificates(folder)
    port = free_port()
    server = subprocess.Popen(
        [
            "redis-server",
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            "server.crt",
            "--tls-key-file",
            "server.key",
            "--tls-ca-cert-file",
            "ca.crt",
            "--tls-auth-clients",
            "no",
            "--requirepass",
            "tls-s3cret",
            "--save",
            "",
            "--dir",
            str(folder),
        ],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"rediss://:tls-s3cret@127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={folder / 'ca.crt'}"
    client = redis.Redis.from_url(url)
    wait_until(lambda: _pings(client), 20, "the TLS redis-server")
    env = env_for(url)
    pool = Workers(env, tmp_path / "logs")
    try:
        pool.start("cpu")
        pool.start("gpu0")
        out = tmp_path / "out"
        done = run_script("enqueue_dataset.py", str(fault_raw), "--out", str(out), "--limit", "2", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert_nothing_lost(out)
        texts = [done.stdout, done.stderr] + [p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*")]
        texts += [p.read_text(errors="replace") for p in out.rglob("*") if p.suffix in {".json", ".yaml", ".jsonl"}]
        assert not [t for t in texts if "tls-s3cret" in t]
    finally:
        pool.stop_all()
        server.terminate()
        server.wait()
