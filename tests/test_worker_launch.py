"""`celery -A tasks worker -Q gpu0`, typed as written, is the design's worker; one that breaks the design refuses."""

from __future__ import annotations

import json
import signal
import socket

import pytest
import redis

from tasks.workers.launch import WorkerDesignError, design_options, pool_name
from tests.conftest import run_script, send_task, wait_until
from worker_config.settings import Settings

HOST = socket.gethostname()  # Celery's %h


def test_a_plain_gpu_worker_is_one_solo_process_without_gossip_or_mingle_named_after_its_queue():
    changes = design_options(Settings(), {"queues": ["gpu0"]}, given={"queues"})
    assert changes == {
        "pool": "solo",
        "concurrency": 1,
        "without_gossip": True,
        "without_mingle": True,
        "loglevel": "INFO",
        "hostname": "gpu0@%h",
    }
    # A stage's own queue is a GPU queue too; -n and -l given stay as given.
    given = {"queues", "hostname", "loglevel"}
    changes = design_options(Settings(), {"queues": "gpu1.hands", "hostname": "h@x", "loglevel": "DEBUG"}, given)
    assert (changes["pool"], changes["concurrency"]) == ("solo", 1) and "hostname" not in changes
    assert "loglevel" not in changes


def test_a_cpu_worker_is_solo_unless_it_asks_for_processes():
    assert design_options(Settings(), {}, set())["pool"] == "solo"  # no -Q: the cpu queue
    prefork = design_options(Settings(), {"queues": ["cpu"], "concurrency": 4}, {"queues", "concurrency"})
    assert "pool" not in prefork and "concurrency" not in prefork  # Celery's prefork pool of 4, as documented


@pytest.mark.parametrize(
    ("options", "asked"),
    [
        ({"pool": "prefork"}, "-P prefork"),  # without -c: Celery's default, one process per core
        ({"pool": "prefork", "concurrency": 2}, "-P prefork -c 2"),
        ({"concurrency": 2}, "-c 2"),
        ({"pool": "threads"}, "-P threads"),
        ({"concurrency": "auto"}, "-c auto"),
    ],
)
def test_a_gpu_worker_with_another_pool_or_more_processes_refuses_naming_the_fix(options, asked):
    with pytest.raises(WorkerDesignError) as refused:
        design_options(Settings(), {"queues": ["gpu0"], **options}, {"queues", *options})
    message = str(refused.value)
    assert "\n" not in message and asked in message
    assert "`celery -A tasks worker -Q gpu0`" in message and "FRAMEFLEET_ALLOW_ANY_GPU_WORKER=1" in message


def test_only_the_options_given_count_whether_named_or_as_the_pool_class_and_queues_as_one_string():
    """Celery fills what the command line did not give (a prefork pool, a process per core): those are replaced;
    ``-Q`` may arrive as one comma-separated string, ``-P`` as the pool class."""
    from celery.concurrency.solo import TaskPool as SoloPool

    conf = Settings()
    defaults = {"queues": "gpu0,cpu", "pool": "prefork", "concurrency": 16}  # only -Q typed
    changes = design_options(conf, defaults, {"queues"})
    assert (changes["pool"], changes["concurrency"], changes["hostname"]) == ("solo", 1, "gpu0+cpu@%h")
    assert (pool_name(SoloPool), pool_name(dict), pool_name("threads"), pool_name(None)) == (
        "solo",
        "builtins:dict",
        "threads",
        None,
    )
    typed = design_options(
        conf, {"queues": ["gpu0"], "pool": SoloPool, "concurrency": 1}, {"queues", "pool", "concurrency"}
    )
    assert "pool" not in typed and "concurrency" not in typed  # -P solo -c 1: as given
    assert "concurrency" not in design_options(conf, {"queues": ["cpu"], "pool": "prefork"}, {"queues", "pool"})
    # -P solo without -c: one process, not Celery's per-core count (a solo worker prefetches that many tasks).
    for queues in (["cpu"], ["gpu0"]):
        solo = design_options(conf, {"queues": queues, "pool": "solo", "concurrency": 16}, {"queues", "pool"})
        assert "pool" not in solo and solo["concurrency"] == 1
    with pytest.raises(WorkerDesignError):
        design_options(conf, {"queues": "gpu0,gpu0.hands"}, {"queues"})


def test_a_worker_of_two_queues_of_one_gpu_refuses_naming_each_queues_command():
    with pytest.raises(WorkerDesignError) as refused:
        design_options(Settings(), {"queues": ["gpu0", "gpu0.hands"]}, {"queues"})
    message = str(refused.value)
    assert "\n" not in message and "2 queues of one GPU" in message
    assert "`celery -A tasks worker -Q gpu0`" in message
    assert "`<stages.hands.python> -m celery -A tasks worker -Q gpu0.hands`" in message
    # A GPU queue and the cpu queue (framefleet run's worker on a machine without a GPU) is one GPU queue.
    assert design_options(Settings(), {"queues": ["gpu0", "cpu"]}, {"queues"})["pool"] == "solo"
    allowed = Settings(allow_any_gpu_worker=True)
    assert design_options(allowed, {"queues": ["gpu0", "gpu0.hands"]}, {"queues"})["pool"] == "solo"


def test_a_gpu_worker_with_more_processes_starts_when_a_setting_says_it_is_on_purpose():
    conf = Settings(allow_any_gpu_worker=True)
    changes = design_options(
        conf, {"queues": ["gpu0"], "pool": "prefork", "concurrency": 2}, {"queues", "pool", "concurrency"}
    )
    assert "pool" not in changes and "concurrency" not in changes
    # -c 2 alone on a GPU queue: still the solo pool (one process), fetching two tasks ahead.
    changes = design_options(conf, {"queues": ["gpu0"], "pool": "prefork", "concurrency": 2}, {"queues", "concurrency"})
    assert changes["pool"] == "solo" and "concurrency" not in changes


def test_the_plain_command_runs_a_video_with_one_solo_process_and_logs_its_stages(
    workers, video_factory, pipeline_env, tmp_path
):
    gpu = workers.launch("gpu0", ["-Q", "gpu0"])  # exactly as the design types it
    workers.launch("cpu", ["-Q", "cpu", "-l", "WARNING"])  # Celery's own lines quieter, framefleet's not
    client = redis.Redis.from_url(pipeline_env["REDIS_URL"])
    for queue in ("gpu0", "cpu"):
        key = f"ff:worker:{queue}@{HOST}"  # named after its queue, no -n
        wait_until(lambda key=key: client.exists(key) or gpu.poll() is not None, 60, f"{key} to register")
    assert gpu.poll() is None, workers.log("gpu0")
    banner = workers.log("gpu0")
    assert "concurrency: 1 (solo)" in banner and "task events: ON" in banner, banner
    out = tmp_path / "out"
    done = run_script("enqueue_dataset.py", str(video_factory(1)), "--out", str(out), env=pipeline_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "run_summary.json").exists()
    log = workers.log("gpu0")
    # framefleet's INFO lines without -l: the model loaded once, each GPU stage's start and end.
    assert log.count("loaded depth (synthetic) on cpu") == 1, log
    for stage in ("depth", "tracks", "hands"):
        assert f"start {stage} of " in log and f"end {stage} of " in log, log
    assert ": SUCCESS in " in log
    assert "mingle: searching for neighbors" not in log  # mingle off (Celery logs its search at INFO)
    cpu = workers.log("cpu")
    assert "concurrency: 1 (solo)" in cpu and "start preprocess of " in cpu and "end h5 of " in cpu, cpu
    assert " ready." not in cpu  # Celery's INFO line: -l WARNING is honoured for Celery's own logger


def test_the_plain_command_with_the_prefork_pool_exits_with_the_fix_and_consumes_nothing(workers, pipeline_env):
    """``-P prefork`` alone (no ``-c``, which is refused on its own): Celery would start a process per core."""
    send_task(pipeline_env["REDIS_URL"], "framefleet.depth", ({"run_id": "r", "video_id": "v"},), "gpu0")
    proc = workers.launch("gpu0", ["-P", "prefork", "-Q", "gpu0"])
    r = redis.Redis.from_url(pipeline_env["REDIS_URL"])
    key = f"ff:worker:gpu0@{HOST}"  # a worker that started registers: said at once, not after a wait for its exit
    wait_until(lambda: proc.poll() is not None or r.exists(key), 60, "the prefork worker to exit (or register)")
    assert not r.exists(key), f"the prefork worker started and registered: {workers.log('gpu0')[-2000:]}"
    assert proc.wait(timeout=60) != 0, workers.log("gpu0")
    (line,) = [line for line in workers.log("gpu0").splitlines() if line.startswith("framefleet:")]
    assert "asks for -P prefork." in line and "`celery -A tasks worker -Q gpu0`" in line, line
    from tasks.delivery import queues

    assert queues.length(r, "gpu0") == 1 and r.hlen("unacked") == 0  # the task still waits, untouched


def test_a_second_worker_of_a_live_workers_node_name_is_refused_naming_n(workers, pipeline_env):
    first = workers.launch("gpu0", ["-Q", "gpu0"])
    client = redis.Redis.from_url(pipeline_env["REDIS_URL"])
    key = f"ff:worker:gpu0@{HOST}"
    wait_until(lambda: client.exists(key) or first.poll() is not None, 60, f"{key} to register")
    second = workers.launch("gpu0-again", ["-Q", "gpu0"])  # the same command typed again: the same node name
    assert second.wait(timeout=60) != 0
    (line,) = [x for x in workers.log("gpu0-again").splitlines() if x.startswith("framefleet:")]
    assert f"a live worker is named gpu0@{HOST} already (pid {first.pid} on this host)" in line, line
    assert "-n gpu0-2@%h" in line, line
    assert first.poll() is None and json.loads(client.get(key))["pid"] == first.pid  # the first one untouched
    workers.stop("gpu0", signal.SIGKILL)
    again = workers.launch("gpu0-restarted", ["-Q", "gpu0"])  # its process gone: the name is free at once
    wait_until(lambda: json.loads(client.get(key) or "{}").get("pid") == again.pid, 60, "the restarted gpu0")
