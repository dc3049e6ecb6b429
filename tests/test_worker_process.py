"""Real worker processes: GPU pinning by queue, model preload, refusing to start badly."""

from __future__ import annotations

import subprocess
import sys

import redis

from tests.conftest import CLUSTER_GPU_ENV, ROOT, send_task, wait_for_run_end, wait_until


def test_importing_tasks_touches_no_cuda_and_loads_no_model(pipeline_env):
    code = (
        "import sys, tasks, tasks.workers.worker as w; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')), "
        "dict(w.MODEL_LOADS), len(w.STAGES))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=pipeline_env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "{}", "0"]


def test_a_worker_refuses_two_gpus_queues(workers):
    proc = workers.start("gpu0,gpu1", name="both", wait=False)
    assert proc.wait(timeout=60) != 0
    assert "one worker per GPU" in workers.log("both")
    assert workers.state("both") is None


def test_a_failed_model_load_exits_3_and_consumes_nothing(workers, pipeline_env, tmp_path):
    """Exit 3 (EXIT_CANNOT_START) is what the supervisor reads as "cannot start here": no restart loop."""
    from tasks.errors import EXIT_CANNOT_START

    r = redis.Redis.from_url(pipeline_env["REDIS_URL"])
    send_task(pipeline_env["REDIS_URL"], "framefleet.depth", ({"run_id": "r", "video_id": "v"},), "gpu0")
    assert r.llen("gpu0") == 1
    config = tmp_path / "huge.yaml"
    config.write_text("stages:\n  depth:\n    params: {hold_mib: 1.0e12}\n")  # an exbibyte
    proc = workers.start("gpu0", env={"FRAMEFLEET_CONFIG": str(config)}, wait=False)
    code = proc.wait(timeout=90)
    log = workers.log("gpu0")
    assert code == EXIT_CANNOT_START == 3, log
    assert "the depth model (synthetic backend" in log and "failed to load" in log
    assert "Fix stages.depth.backend/params" in log
    assert r.llen("gpu0") == 1 and r.hlen("unacked") == 0  # the task still waits, untouched


def test_without_gpu_the_gpu0_worker_runs_models_on_cpu_and_says_so(cluster):
    state = wait_until(lambda: (s := cluster.state("gpu0")) and s["model_loads"] and s, 30, "models loaded")
    assert state["device"] == "cpu" and state["gpu"] == 0
    # However many tasks the shared worker has run, it loaded each model once.
    assert state["model_loads"] == {"depth": 1, "tracks": 1, "hands": 1}
    assert "no GPU visible" in cluster.log("gpu0")


def test_a_worker_recycles_itself_after_n_tasks(workers, video_factory, pipeline_env, tmp_path):
    from tests.conftest import run_script

    workers.start("cpu")
    proc = workers.start("gpu0", env={"FRAMEFLEET_MAX_TASKS_PER_WORKER": "2"})
    out = tmp_path / "out"
    assert (
        run_script(
            "enqueue_dataset.py", str(video_factory(1)), "--out", str(out), "--no-wait", env=pipeline_env
        ).returncode
        == 0
    )
    assert proc.wait(timeout=120) == 0  # finished its second task, then a clean warm shutdown
    assert "recycling after 2 tasks" in workers.log("gpu0")
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"])
    from tasks.delivery import queues

    assert queues.length(r, "gpu0") == 1  # the third GPU stage waits for the fresh worker
    workers.start("gpu0", name="gpu0-fresh")
    wait_for_run_end(out, 120)


def test_a_model_worker_gives_torch_the_threads_its_settings_say(cluster):
    threads = CLUSTER_GPU_ENV["FRAMEFLEET_TORCH_THREADS"]  # the shared gpu0 worker's setting
    wait_until(lambda: f"torch uses {threads} CPU threads" in cluster.log("gpu0"), 30, "the thread count in the log")
