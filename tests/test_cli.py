"""The `framefleet` command: its subcommands, the Makefile's install hints, the progress display's ETA."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tomllib

import pytest

from tasks.cli.main import COMMANDS
from tests.conftest import ROOT

pytestmark = pytest.mark.timeout(120)


def test_the_console_script_points_at_the_command_and_lists_every_subcommand():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["framefleet"].partition(":")
    assert (module, function) == ("tasks.cli.main", "main")
    listing = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert listing.returncode == 0, listing.stderr
    for name in (
        "run",
        "enqueue",
        "status",
        "verify",
        "report",
        "autoscale",
        "gpu-memory",
        "sample",
        "cancel",
        "clean",
    ):
        assert f"\n  {name} " in listing.stdout, name
    unknown = subprocess.run(
        [sys.executable, "-m", module, "frobnicate"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert unknown.returncode == 2 and "no command 'frobnicate'" in unknown.stderr


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_subcommand_has_help_under_its_own_name(name, capsys):
    module = importlib.import_module(COMMANDS[name][0])
    with pytest.raises(SystemExit) as exited:
        module.main(["--help"], prog=f"framefleet {name}")
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: framefleet {name}")


def test_status_and_the_listing_leave_celery_unloaded(pipeline_env):
    # `framefleet status` reads Redis alone; Celery and the app (a third of a second to import) come only
    # with what sends or follows tasks, --watch among them.
    loaded = """
import sys
from tasks.cli.main import main
code = main(sys.argv[1:])
print(code, sorted(m for m in ("celery", "kombu", "tasks.celery_app") if m in sys.modules))
"""

    def run(*argv: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", loaded, *argv],
            cwd=ROOT,
            env=pipeline_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return [*done.stdout.splitlines(), *done.stderr.splitlines()]

    assert run("--help")[-1] == "0 []"
    shown = run("status")
    assert shown[0].startswith("framefleet status at") and shown[-1] == "0 []"
    watched = run("status", "--watch")  # no run to follow: refused, after loading the app it would follow with
    assert watched[-2:] == [
        "2 ['celery', 'kombu', 'tasks.celery_app']",
        "framefleet: Redis knows no run; give a run id or --out OUT",
    ]


def test_no_script_imports_another_script():
    for script in (ROOT / "scripts").glob("*.py"):
        text = script.read_text()
        others = [
            line
            for line in text.splitlines()
            if line.startswith(("from scripts", "import scripts")) and "_cli" not in line
        ]
        assert others == [], f"{script.name} imports a script: {others}; move what they share into tasks/"


@pytest.mark.parametrize("target", ["test", "demo"])
def test_make_without_redis_server_says_the_command_that_installs_it(target):
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "FRAMEFLEET_TEST_REDIS")}
    env["PATH"] = "/nonexistent"  # no redis-server to be found; make runs /bin/sh by path
    done = subprocess.run(
        ["/usr/bin/make", "-s", "-C", str(ROOT), "need-redis"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "apt-get install -y redis-server" in done.stderr and "brew install redis" in done.stderr
    makefile = (ROOT / "Makefile").read_text()
    # make test checks redis-server among the tools it installs itself (need-test-tools)
    assert f"\n{target}: need-redis" in makefile or (
        f"\n{target}: need-test-tools" in makefile and "redis-server:redis-server" in makefile
    )


def test_autoscale_help_shows_every_default(capsys):
    from tasks.autoscaler import cli as autoscale

    with pytest.raises(SystemExit):
        autoscale.main(["--help"], prog="framefleet autoscale")
    options = " ".join(capsys.readouterr().out.split("options:", 1)[1].split())
    for flag, default in (
        ("--tick-s", "2.0"),
        ("--stop-grace-s", "600.0"),
        ("--cpu-workers", "1"),
        ("--metrics-addr", "127.0.0.1"),
        ("--headroom-mib", "1024.0"),
    ):
        described = options.split(f" {flag} ", 1)[1]
        start = described.index("(default:")
        assert default in described[start : described.index(")", start)], (flag, described[:200])


def test_the_eta_counts_down_steadily_when_batches_finish_unevenly():
    from tasks.cli.watch import Eta

    eta = Eta(smoothing_s=20.0)
    shown = []
    # 40 stage tasks, finished in bursts of 4 every 8 s (10 s per task on average): the raw estimate jumps.
    for second in range(1, 80):
        done = 4 * (second // 8)
        shown.append(eta.update(done / 40, float(second), float(second)))
    values = [v for v in shown if v is not None]
    rises = [b - a for a, b in zip(values, values[1:], strict=False) if b > a]
    assert max(rises, default=0.0) < 8.0, rises  # the raw estimate rises by up to 40 s at times
    assert abs(values[-1] - (80 - 79)) < 25  # and it still ends near the real time left


def test_a_run_s_logs_hold_that_run_only_and_the_previous_run_s_are_kept_aside(tmp_path):
    from tasks.cli.run import Cluster, rotate_logs

    logs = tmp_path / "out" / "logs"
    for run in ("first", "second"):
        rotate_logs(logs)
        cluster = Cluster(logs)
        cluster.start("cpu-1", ["/bin/echo", f"{run} run"], dict(os.environ)).wait()
        (logs / "flower-auth.txt").write_text("framefleet:secret\n")
    assert (logs / "cpu-1.log").read_text() == "second run\n"
    assert (logs / "previous" / "cpu-1.log").read_text() == "first run\n"
    assert (logs / "flower-auth.txt").exists() and not (logs / "previous" / "flower-auth.txt").exists()


def test_the_eta_counts_only_the_videos_still_to_do_and_says_how_many_failed():
    from tasks.cli.watch import Eta, fraction_done, render

    stages = ["preprocess", "depth", "tracks", "hands", "h5"]
    # 6 videos: 4 failed at once in preprocess, 2 still to do, of which one has done 2 stages in 30 s.
    counts = {"videos.failed": 4, "preprocess.done": 2, "depth.done": 1, "videos.done": 0}
    left_s = Eta().update(fraction_done(counts, 6, stages), 30.0, 0.0)
    # 3 stage tasks took 30 s; 7 are left (2 videos × 5 stages, less the 3 done): about 70 s, not seconds.
    assert left_s is not None and 60 <= left_s <= 80, left_s
    line = render(counts, 6, 30.0, left_s, stages)
    assert "ETA 00:01:10 for 2 left (4 failed, not counted)" in line, line
    assert fraction_done({"videos.failed": 4, "videos.done": 2}, 6, stages) == 1.0


WARM_WORKER = """
import signal, sys, time
import redis

url, out = sys.argv[1], sys.argv[2]
r = redis.Redis.from_url(url)
r.ping()


def warm(*_):  # a warm shutdown: the task in hand ends, writing to Redis as it goes
    try:
        for _ in range(20):
            r.incr("finished")
            time.sleep(0.05)
        ended = "wrote"
    except redis.RedisError as exc:
        ended = type(exc).__name__
    open(out, "w").write(ended)
    sys.exit(0)


signal.signal(signal.SIGTERM, warm)
open(out + ".ready", "w").close()
while True:
    time.sleep(1)
"""


def test_a_local_run_stops_redis_last_so_a_worker_s_warm_shutdown_still_writes(tmp_path):
    """`framefleet run`'s end (tasks.cli.run.stop_local): Flower at once, each worker warm, Redis only after them;
    a worker finishing its task as it stops writes its statistics and marks to Redis, which must still answer."""
    from tasks.autoscaler.supervisor import Supervisor
    from tasks.cli.run import Cluster, stop_local
    from tests.conftest import wait_until

    cluster = Cluster(tmp_path / "logs")
    url = cluster.start_redis()
    flower = cluster.start("flower", [sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ))
    ended = tmp_path / "worker-ended"
    supervisor = Supervisor(
        lambda _gpu, _name: [sys.executable, "-c", WARM_WORKER, url, str(ended)], lambda _gpu: dict(os.environ)
    )
    try:
        supervisor.start(0, "cpu")
        wait_until(lambda: (tmp_path / "worker-ended.ready").exists(), 60, "the worker stand-in to start")
        stop_local(cluster, supervisor, lambda: False)
    finally:
        supervisor.stop_all(0)
        cluster.stop(0)
    assert ended.read_text() == "wrote", "Redis went away while a worker was still stopping"
    assert flower.poll() is not None and all(proc.poll() is not None for _name, proc in cluster.procs)
