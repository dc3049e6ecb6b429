"""The systemd units and the Slurm script start workers exactly as compose.yaml does, and stop them warm."""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import skip_unless_ci
from tests.test_compose import effective_worker, load_compose

ROOT = Path(__file__).resolve().parent.parent
SYSTEMD = ROOT / "deploy" / "systemd"
SBATCH = ROOT / "deploy" / "slurm" / "framefleet-gpu.sbatch"
CPU_SBATCH = ROOT / "deploy" / "slurm" / "framefleet-cpu.sbatch"
ENV_FILE = "/etc/framefleet/env"


def read_unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string((SYSTEMD / name).read_text())
    return unit


def exec_argv(unit: configparser.ConfigParser, instance: str = "") -> list[str]:
    """ExecStart as the argument list systemd runs: ``%i`` is the instance, ``%%`` a literal ``%``."""
    line = unit["Service"]["ExecStart"].lstrip("-@:+!")
    return [arg.replace("%%", "\0").replace("%i", instance).replace("\0", "%") for arg in shlex.split(line)]


def compose_argv(service: str) -> list[str]:
    return load_compose()["services"][service]["command"]


@pytest.mark.parametrize("name", ["framefleet-worker@.service", "framefleet-cpu-worker@.service"])
def test_worker_units_stop_warm_restart_and_read_the_env_file(name):
    service = read_unit(name)["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert service["TimeoutStopSec"] == "600"
    assert service["Restart"] == "on-failure"
    assert service["RestartForceExitStatus"].split() == ["0"]  # a recycled worker exits 0 and must come back
    assert service["KillMode"] == "mixed"  # SIGTERM to Celery's main process, not its children
    assert service["EnvironmentFile"] == ENV_FILE


@pytest.mark.parametrize("gpu", ["0", "1", "7"])
def test_gpu_unit_runs_the_compose_gpu_worker_command_for_its_instance(gpu):
    argv = exec_argv(read_unit("framefleet-worker@.service"), gpu)
    assert Path(argv[0]).name == "celery"
    worker = effective_worker(argv)
    assert worker["queues"] == [f"gpu{gpu}"]
    assert (worker["pool"], worker["concurrency"], worker["hostname"]) == ("solo", 1, f"gpu{gpu}@%h")
    # Token for token what compose.yaml runs, once the GPU index is the same.
    compose = [arg.replace("gpu0", f"gpu{gpu}") for arg in compose_argv("worker-gpu0")]
    assert argv[1:] == compose[1:]


def test_cpu_unit_runs_the_compose_cpu_worker_command_one_solo_process_per_instance():
    argv = exec_argv(read_unit("framefleet-cpu-worker@.service"), "3")
    worker = effective_worker(argv)
    assert worker["queues"] == ["cpu"] and (worker["pool"], worker["concurrency"]) == ("solo", 1)
    # Instances share the host, so each names itself; compose's containers each have their own hostname.
    assert worker["hostname"] == "cpu3@%h"
    assert argv[1:] == [*compose_argv("worker-cpu")[1:], "-n", "cpu3@%h"]


def test_autoscaler_unit_runs_the_autoscaler_and_outwaits_its_warm_stop():
    unit = read_unit("framefleet-autoscaler.service")
    argv = exec_argv(unit)
    assert argv[1] == "/opt/framefleet/scripts/autoscaler.py"
    from tasks.autoscaler.cli import parse_args

    args = parse_args(argv[2:])
    service = unit["Service"]
    assert service["EnvironmentFile"] == ENV_FILE and service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed"  # SIGTERM to the autoscaler, which warm-stops its workers itself
    assert int(service["TimeoutStopSec"]) > args.stop_grace_s


def test_flower_unit_runs_the_compose_flower_and_insists_on_auth():
    unit = read_unit("framefleet-flower.service")
    assert exec_argv(unit)[1:] == compose_argv("flower")[1:]
    service = unit["Service"]
    assert service["EnvironmentFile"] == ENV_FILE
    assert service["ExecStartPre"] == '/usr/bin/test -n "${FLOWER_BASIC_AUTH}"'
    assert service["KillSignal"] == "SIGTERM" and service["Restart"] == "on-failure"


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


@pytest.fixture
def systemd_analyze() -> str:
    """systemd-analyze (Debian's systemd; make need-test-tools installs it); a skip off CI, a failure on it."""
    if SYSTEMD_ANALYZE is None:
        skip_unless_ci("systemd-analyze is not installed here (apt install systemd); units not verified")
    return str(SYSTEMD_ANALYZE)


UNIT_NAMES = [
    "framefleet-worker@0.service",
    "framefleet-cpu-worker@1.service",
    "framefleet-flower.service",
    "framefleet-autoscaler.service",
]


def verify_units(folder: Path, texts: dict[str, str], systemd_analyze: str) -> list[str]:
    """Write ``texts`` (unit name: text) to ``folder`` and return systemd-analyze verify's complaints about them."""
    # Point ExecStart at a celery that exists here, so that only the units' own mistakes are reported.
    celery, python = shutil.which("celery") or "/bin/true", shutil.which("python3") or "/bin/true"
    for name, text in texts.items():
        text = text.replace("/opt/framefleet/.venv/bin/celery", celery)
        text = text.replace("/opt/framefleet/.venv/bin/python", python)
        (folder / name).write_text(text)
    (folder / "framefleet-worker@0.service").symlink_to(folder / "framefleet-worker@.service")
    (folder / "framefleet-cpu-worker@1.service").symlink_to(folder / "framefleet-cpu-worker@.service")
    result = subprocess.run(
        [systemd_analyze, "verify", *(str(folder / n) for n in UNIT_NAMES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return [line for line in (result.stdout + result.stderr).splitlines() if "framefleet" in line]


def test_systemd_accepts_the_units(tmp_path, systemd_analyze):
    units = {unit.name: unit.read_text() for unit in SYSTEMD.glob("*.service")}
    complaints = verify_units(tmp_path, units, systemd_analyze)
    assert not complaints, complaints


def test_systemd_verify_reports_a_broken_unit(tmp_path, systemd_analyze):
    # The check above can fail: a misspelt key and a bad value in the GPU unit are reported.
    units = {unit.name: unit.read_text() for unit in SYSTEMD.glob("*.service")}
    units["framefleet-worker@.service"] = (
        units["framefleet-worker@.service"]
        .replace("KillMode=mixed", "KillMode=gently")
        .replace("TimeoutStopSec=", "TimeoutStopSecs=")
    )
    complaints = "\n".join(verify_units(tmp_path, units, systemd_analyze))
    assert "kill mode" in complaints and "TimeoutStopSecs" in complaints, complaints


def test_sbatch_starts_the_compose_gpu_worker_per_gpu():
    text = SBATCH.read_text()
    (line,) = [line.strip() for line in text.splitlines() if line.strip().startswith("celery ")]
    argv = shlex.split(line.rstrip("&").replace('"gpu$i"', "gpu0"))
    # compose's command, named with the job id: two jobs on one node must not share a worker name.
    assert argv[1:] == [*compose_argv("worker-gpu0")[1:], "-n", "gpu$i.$job@%h"]
    assert "#SBATCH --signal=B:TERM@660" in text  # 11 minutes' warning: 10 for the tasks in hand
    assert subprocess.run(["bash", "-n", str(SBATCH)]).returncode == 0


# The job's poll: its `sleep POLL_S`, counted, so that a test waits for polls rather than for time.
FAKE_SLEEP = """#!/usr/bin/env bash
[[ $1 == "$FRAMEFLEET_POLL_S" ]] && echo >> "$FAKE_LOG/polls"
exec {sleep} "$@"
"""
FAKE_CELERY = """#!/usr/bin/env bash
# Records its arguments, folder and environment; the first run per queue exits 0 (a recycled worker),
# later ones wait for SIGTERM.
printf '%s\\0' "$@" > "$FAKE_LOG/argv.$$"
printf '%s\\0' "$PWD" "${REDIS_URL:-}" "${CUDA_VISIBLE_DEVICES:-}" "${FRAMEFLEET_CONFIG:-}" > "$FAKE_LOG/env.$$"
while (($#)); do [[ $1 == -Q ]] && queue=$2; shift; done
echo "$queue $$" >> "$FAKE_LOG/starts"
if [[ -n ${FAKE_FAIL:-} ]]; then exit 3; fi
if [[ ! -e $FAKE_LOG/$queue.recycled ]]; then touch "$FAKE_LOG/$queue.recycled"; exit 0; fi
trap 'echo "$queue" >> "$FAKE_LOG/terms"; exit 0' TERM
while :; do sleep 0.05; done
"""


def run_sbatch(
    tmp_path: Path, drop: tuple[str, ...] = (), script: Path = SBATCH, prefix: tuple[str, ...] = (), **env: str
) -> subprocess.Popen[str]:
    """Run the job script's body as Slurm would, with a stand-in ``celery`` on PATH; ``drop``: variables to unset;
    ``prefix``: what the command runs under (another user's ``setpriv``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "celery").write_text(FAKE_CELERY)
    (bin_dir / "celery").chmod(0o755)
    (bin_dir / "sleep").write_text(FAKE_SLEEP.format(sleep=shutil.which("sleep")))
    (bin_dir / "sleep").chmod(0o755)
    full_env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_LOG": str(tmp_path),
        "FRAMEFLEET_HOME": str(tmp_path),
        "FRAMEFLEET_ENV_FILE": "",  # none: the job's own environment
        "FRAMEFLEET_POLL_S": "0.1",
        "SLURM_JOB_ID": "42",
        "CUDA_VISIBLE_DEVICES": "3,5",
        **env,
    }
    for name in drop:
        full_env.pop(name, None)
    return subprocess.Popen(
        [*prefix, "bash", str(script)],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its workers too can be ended at once (``ended``)
    )


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def polls(tmp_path: Path) -> int:
    """How many polls of its workers the job has begun."""
    log = tmp_path / "polls"
    return len(log.read_text().splitlines()) if log.exists() else 0


def starts(tmp_path: Path) -> list[str]:
    log = tmp_path / "starts"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.timeout(60)
def test_sbatch_runs_one_worker_per_gpu_restarts_recycled_ones_and_stops_warm(tmp_path):
    job = run_sbatch(tmp_path)
    try:
        # Each queue: a first run that recycles (exit 0), then a second that stays up.
        wait_for(lambda: sorted(starts(tmp_path)) == ["gpu0", "gpu0", "gpu1", "gpu1"], 20, "two starts per GPU")
        begun = polls(tmp_path)
        # Two more polls begun: the pass after the one in progress has checked every worker and started none.
        wait_for(lambda: polls(tmp_path) >= begun + 2, 20, "two more polls of the workers")
        assert sorted(starts(tmp_path)) == ["gpu0", "gpu0", "gpu1", "gpu1"]
        job.send_signal(signal.SIGTERM)
        output, _ = job.communicate(timeout=20)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, output
    assert sorted((tmp_path / "terms").read_text().split()) == ["gpu0", "gpu1"]
    assert "2 GPU(s)" in output and "all workers stopped" in output


@pytest.mark.timeout(60)
def test_sbatch_gives_up_on_a_worker_that_keeps_failing(tmp_path):
    job = run_sbatch(tmp_path, FAKE_FAIL="1", FRAMEFLEET_MAX_FAILURES="2", CUDA_VISIBLE_DEVICES="0")
    output, _ = job.communicate(timeout=30)
    assert job.returncode == 1, output
    assert starts(tmp_path) == ["gpu0", "gpu0"]
    assert "giving up on gpu0" in output


def test_sbatch_refuses_a_job_without_gpus(tmp_path):
    job = run_sbatch(tmp_path, CUDA_VISIBLE_DEVICES="")
    output = ended(job)
    assert job.returncode == 2 and "--gres=gpu:N" in output
    assert starts(tmp_path) == []


def recorded(tmp_path: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Queue -> (argv, [cwd, REDIS_URL, CUDA_VISIBLE_DEVICES, FRAMEFLEET_CONFIG]) of each stand-in celery's latest
    start."""
    runs = {}
    for line in (tmp_path / "starts").read_text().splitlines():
        queue, pid = line.split()
        argv = (tmp_path / f"argv.{pid}").read_text().split("\0")[:-1]
        env = (tmp_path / f"env.{pid}").read_text().split("\0")[:-1]
        runs[queue] = (argv, env)
    return runs


@pytest.mark.timeout(60)
def test_sbatch_workers_get_the_env_file_the_job_id_in_their_names_and_the_jobs_gpus(tmp_path, monkeypatch):
    env_file = tmp_path / "env"
    env_file.write_text("REDIS_URL=redis://:secret@redis.example.internal:6379/0\n")
    job = run_sbatch(
        tmp_path,
        FRAMEFLEET_ENV_FILE=str(env_file),
        SLURM_JOB_ID="4242",
        CUDA_VISIBLE_DEVICES="3,5",
        SLURM_JOB_GPUS="3,5",
        SLURM_STEP_GPUS="3,5",
        SLURM_JOB_NODELIST="node17",
    )
    try:
        wait_for(lambda: len(starts(tmp_path)) == 4, 20, "two starts per GPU")
        runs = recorded(tmp_path)
        job.send_signal(signal.SIGTERM)
        output, _ = job.communicate(timeout=20)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, output
    assert sorted(runs) == ["gpu0", "gpu1"]
    for i, queue in enumerate(sorted(runs)):
        argv, (cwd, redis_url, visible, _config) = runs[queue]
        compose = compose_argv("worker-gpu0")
        expected = [*(a.replace("gpu0", f"gpu{i}") for a in compose), "-n", f"gpu{i}.4242@%h"]
        assert argv == expected[1:]
        assert (cwd, redis_url, visible) == (str(tmp_path), "redis://:secret@redis.example.internal:6379/0", "3,5")
        # What the real worker then does with that environment: queue gpuN takes the job's N-th GPU.
        from tasks.workers.worker import pin_visible_device

        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        monkeypatch.delenv("FRAMEFLEET_DEVICE", raising=False)
        pin_visible_device(i)
        assert os.environ["CUDA_VISIBLE_DEVICES"] == visible.split(",")[i]


@pytest.mark.timeout(60)
def test_sbatch_takes_the_gpus_from_slurm_when_cuda_visible_devices_is_unset(tmp_path):
    job = run_sbatch(tmp_path, drop=("CUDA_VISIBLE_DEVICES",), SLURM_JOB_GPUS="1,2,6")
    try:
        wait_for(lambda: len(starts(tmp_path)) == 6, 20, "two starts per GPU")
        runs = recorded(tmp_path)
        job.send_signal(signal.SIGTERM)
        output, _ = job.communicate(timeout=20)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0 and "3 GPU(s)" in output, output
    assert {queue: env[2] for queue, (_, env) in runs.items()} == {"gpu0": "1,2,6", "gpu1": "1,2,6", "gpu2": "1,2,6"}


# A password as a person may choose one: every character a shell would act on, and a command it would run.
ODD_PASSWORD = "p$HOME&x`touch PWNED`;$(touch PWNED2)'\"#"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("script", [SBATCH, CPU_SBATCH], ids=["gpu", "cpu"])
def test_sbatch_reads_the_env_file_as_data_values_kept_as_written(tmp_path, script):
    env_file = tmp_path / "env"
    env_file.write_text(
        "# the deployment's /etc/framefleet/env\n"
        "\n"
        f"REDIS_URL=redis://:{ODD_PASSWORD}@redis.example.internal:6379/0\n"
        '  FRAMEFLEET_CONFIG = "/etc/framefleet/settings file.yaml"  \n'
        "; a comment as systemd writes one\n"
    )
    env_file.chmod(0o600)
    job = run_sbatch(tmp_path, script=script, FRAMEFLEET_ENV_FILE=str(env_file), CUDA_VISIBLE_DEVICES="0")
    try:
        wait_for(lambda: len(starts(tmp_path)) == 2, 20, "the worker's two starts")
        runs = recorded(tmp_path)
        job.send_signal(signal.SIGTERM)
        output, _ = job.communicate(timeout=20)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, output
    ((_, (_, (_, redis_url, _, config))),) = runs.items()
    assert redis_url == f"redis://:{ODD_PASSWORD}@redis.example.internal:6379/0"
    assert config == "/etc/framefleet/settings file.yaml"
    assert not list(tmp_path.rglob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))


def ended(job: subprocess.Popen[str], timeout_s: float = 30) -> str:
    """The output of a job expected to stop by itself; one still running then is killed (the test fails)."""
    try:
        return job.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        return job.communicate()[0] + "\n(still running: killed)"


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder every user may pass through (pytest's own are closed to others), for the job run as nobody."""
    folder = Path(tempfile.mkdtemp(prefix="framefleet-env-"))
    folder.chmod(0o711)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def as_another_user(folder: Path, script: Path) -> tuple[tuple[str, ...], Path]:
    """What makes a file of this user's mode 0600 unreadable to the job: the job run as nobody when the tests run
    as root (root reads any file), else nothing. Returns the command prefix and a copy of ``script`` it can read."""
    if os.geteuid() != 0:
        return (), script
    copy = folder / script.name
    copy.write_text(script.read_text())
    copy.chmod(0o755)
    return ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"), copy


@pytest.mark.timeout(60)
@pytest.mark.parametrize("script", [SBATCH, CPU_SBATCH], ids=["gpu", "cpu"])
def test_sbatch_fails_naming_an_env_file_it_cannot_read_and_the_fix(tmp_path, shared_folder, script):
    env_file = shared_folder / "env"  # as deploy/README.md prescribes: mode 0600, its owner's alone
    env_file.write_text("REDIS_URL=redis://:secret@redis.example.internal:6379/0\n")
    env_file.chmod(0o600 if os.geteuid() == 0 else 0o000)
    prefix, runnable = as_another_user(shared_folder, script)
    job = run_sbatch(tmp_path, script=runnable, prefix=prefix, FRAMEFLEET_ENV_FILE=str(env_file))
    output = ended(job)
    assert job.returncode == 2, output
    assert f"the environment file {env_file} cannot be read by" in output and "chmod 600" in output
    assert starts(tmp_path) == []
    missing = shared_folder / "missing-env"
    shutil.rmtree(tmp_path / "bin")
    job = run_sbatch(tmp_path, script=runnable, prefix=prefix, FRAMEFLEET_ENV_FILE=str(missing))
    output = ended(job)
    assert job.returncode == 2 and f"the environment file {missing} does not exist" in output, output
    assert starts(tmp_path) == []


def test_sbatch_names_a_line_that_is_not_key_value(tmp_path):
    env_file = tmp_path / "env"
    env_file.write_text("REDIS_URL=redis://127.0.0.1:6379/0\nexport FRAMEFLEET_CONFIG=/etc/x.yaml\n")
    job = run_sbatch(tmp_path, FRAMEFLEET_ENV_FILE=str(env_file))
    output = ended(job)
    assert job.returncode == 2 and f"{env_file}, line 2, is not KEY=VALUE" in output, output
    assert starts(tmp_path) == []
