"""A `framefleet run` user's day, on a machine where another Redis answers: a second terminal's `cancel` and
`status` reach the run's own Redis from OUT, settings are refused before anything starts, and every command the
run prints works as printed."""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.conftest import ROOT, settings_env, wait_until
from tests.test_runs import ff

pytestmark = pytest.mark.timeout(420)

# About 16 s of depth per video, waited (text, as every environment gives it: typed at start-up): the second
# terminal's commands come while the run is live.
SLOW_DEPTH = {"FRAMEFLEET_STAGES__DEPTH__PARAMS__SECONDS_PER_FRAME": "1.0"}


def user_env(pipeline_env: dict[str, str]) -> dict[str, str]:
    """A terminal with no Redis named: `framefleet run` starts its own."""
    return {k: v for k, v in pipeline_env.items() if k != "REDIS_URL"}


def printed_command(text: str) -> list[str]:
    """The last `framefleet …` command quoted in ``text``, as the argv that runs it here."""
    found = re.findall(r"`(framefleet [^`]+)`", text)
    assert found, text
    argv = shlex.split(found[-1])
    return [sys.executable, "-m", "tasks.cli.main", *argv[1:]]


def stop(run: subprocess.Popen) -> None:
    """End a `framefleet run` as Ctrl-C does (it ends every process it started), killing it only if it hangs."""
    if run.poll() is None:
        run.send_signal(signal.SIGINT)
        try:
            run.wait(timeout=90)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()


def run_printed(argv: list[str], env: dict[str, str], timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


def start_and_cancel(raw: Path, out: Path, env: dict[str, str], decoy: str, tmp_path: Path) -> tuple[str, str]:
    """Run `framefleet run RAW --out OUT` in one terminal and cancel it from another, first with $REDIS_URL naming
    the decoy (refused, nothing touched there), then with nothing named while the decoy is that terminal's
    default Redis (its settings' redis_url): the run stops with exit status 4. Return (run id, the run's stderr)."""
    other = {**env, **settings_env(tmp_path, f"redis_url: {decoy}\n")}
    log_out, log_err = tmp_path / "run.out", tmp_path / "run.err"
    with open(log_out, "w") as o, open(log_err, "w") as e:
        argv = [sys.executable, "-m", "tasks.cli.main", "run", str(raw), "--out", str(out)]
        run = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=o, stderr=e, text=True)
    try:
        wait_until(
            lambda: re.search(r"^run \S+: 2 videos", log_out.read_text(), re.M) or run.poll() is not None,
            240,
            "the run to be sent",
        )
        assert run.poll() is None, log_out.read_text() + log_err.read_text()
        run_id = re.search(r"^run (\S+): 2 videos", log_out.read_text(), re.M).group(1)

        # $REDIS_URL names the decoy: it does not know the run, so nothing is cancelled there.
        wrong = ff("cancel", "--out", str(out), env={**env, "REDIS_URL": decoy}, timeout_s=60)
        assert wrong.returncode == 2, wrong.stdout + wrong.stderr
        assert f"does not know run {run_id}" in wrong.stderr and "cancelled" not in wrong.stdout, wrong.stderr
        assert "redis-auth.txt: run the command without $REDIS_URL" in wrong.stderr, wrong.stderr

        # A second run into OUT asks the live run's own Redis (through OUT) and is refused, naming commands that work.
        second = ff("run", str(raw), "--out", str(out), "--continue", env=other, timeout_s=60)
        assert second.returncode == 2 and f"is held by run {run_id}" in second.stderr, second.stdout + second.stderr
        assert "its workers are running it" in second.stderr and f"framefleet cancel --out {out}" in second.stderr

        # No Redis named: OUT says which holds the run, whatever answers at the default address.
        done = ff("cancel", "--out", str(out), env=other, timeout_s=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"run {run_id} cancelled" in done.stdout, done.stdout
        assert f"`framefleet run {raw} --out {out} --continue` finishes the rest" in done.stdout, done.stdout
        assert run.wait(timeout=120) == 4, log_out.read_text() + log_err.read_text()
    finally:
        stop(run)
    assert not redis.Redis.from_url(decoy).keys("ff:*")  # nothing left in the other Redis

    # A run that has ended is shown from OUT's own records, whatever the other Redis says.
    shown = ff("status", "--out", str(out), env=other, timeout_s=60)
    assert shown.returncode == 0 and f"run {run_id} (in {out})" in shown.stdout, shown.stderr
    assert "cancelled" in shown.stdout and "--continue` finishes it" in shown.stdout, shown.stdout
    said = log_err.read_text()
    assert "was cancelled" in said, said
    return run_id, said.split("was cancelled", 1)[1]


def test_a_run_is_cancelled_from_another_terminal_with_no_environment_whatever_other_redis_answers(
    video_factory, pipeline_env, decoy, tmp_path
):
    out = tmp_path / "out"
    env = {**user_env(pipeline_env), **SLOW_DEPTH}
    _, said = start_and_cancel(video_factory(2), out, env, decoy, tmp_path)
    # The hint names `framefleet run`: its workers are gone with it (test_..._its_hints_work runs it).
    assert printed_command(said)[3:] == ["run", str(video_factory(2)), "--out", str(out), "--continue"], said


@pytest.mark.slow
def test_a_cancelled_runs_hint_finishes_it_and_a_finished_run_is_shown_from_its_folder(
    video_factory, pipeline_env, decoy, tmp_path
):
    raw = tmp_path / "raw"
    shutil.copytree(video_factory(2), raw)
    out = tmp_path / "out"
    env = {**user_env(pipeline_env), **SLOW_DEPTH}
    _, said = start_and_cancel(raw, out, env, decoy, tmp_path)
    hint = printed_command(said)
    assert hint[3:] == ["run", str(raw), "--out", str(out), "--continue"], hint
    finish = run_printed(hint, env)
    assert finish.returncode == 0, finish.stdout + finish.stderr
    assert "done: 2 of 2 videos" in finish.stdout, finish.stdout
    shown = ff("status", "--out", str(out), env={**env, "REDIS_URL": decoy}, timeout_s=60)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "finished" in shown.stdout and "done: 2 of 2 videos" in shown.stdout, shown.stdout
    assert re.search(r"^depth\s+2\s+0$", shown.stdout, re.M), shown.stdout  # the stage counts, from OUT
    # --continue with nothing left starts nothing and keeps the run's summary and report.
    kept = {name: (out / name).read_bytes() for name in ("run_summary.json", "report.html")}
    again = run_printed(hint, env, timeout_s=120)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
    assert "Flower:" not in again.stdout and kept == {n: (out / n).read_bytes() for n in kept}


def test_a_misspelled_stage_parameter_is_refused_before_anything_starts(video_factory, pipeline_env, tmp_path):
    raw, out = video_factory(1), tmp_path / "out"
    env = {**user_env(pipeline_env), **settings_env(tmp_path, "stages:\n  tracks:\n    params: {target_pionts: 32}\n")}
    for command in ("run", "enqueue"):
        done = ff(command, str(raw), "--out", str(out), env=env, timeout_s=60)
        assert done.returncode == 2, done.stdout + done.stderr
        said = [line for line in done.stderr.splitlines() if "target_pionts" in line]
        assert len(said) == 1 and "target_points" in said[0], done.stderr  # the name and the ones that exist
        assert not out.exists(), command  # nothing started, nothing written


def test_stage_parameters_from_the_environment_are_typed_at_start_up(monkeypatch):
    from worker_config.settings import ConfigError, load_settings

    monkeypatch.setenv("FRAMEFLEET_STAGES__DEPTH__PARAMS__SECONDS_PER_FRAME", "0.05")
    monkeypatch.setenv("FRAMEFLEET_STAGES__TRACKS__PARAMS__TARGET_POINTS", "32")
    conf = load_settings()
    assert conf.stages["depth"].params["seconds_per_frame"] == 0.05
    assert conf.stages["tracks"].params["target_points"] == 32
    monkeypatch.setenv("FRAMEFLEET_STAGES__DEPTH__PARAMS__HOLD_MIB", "1.0e12")  # YAML 1.1 reads it as text
    assert load_settings().stages["depth"].params["hold_mib"] == 1.0e12
    monkeypatch.setenv("FRAMEFLEET_STAGES__TRACKS__PARAMS__TARGET_POINTS", "many")
    with pytest.raises(ConfigError, match=r"stages\.tracks\.params\.target_points .* must be a whole number"):
        load_settings()


def test_a_worker_that_cannot_start_ends_the_run_at_once_with_its_own_words(video_factory, pipeline_env, tmp_path):
    missing = tmp_path / "no-such-cache"
    yaml_text = f"stages:\n  depth:\n    backend: vipe\n    params: {{weights_dir: {missing}}}\n"
    env = {**user_env(pipeline_env), **settings_env(tmp_path, yaml_text)}
    done = ff("run", str(video_factory(1)), "--out", str(tmp_path / "out"), env=env, timeout_s=200)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot start: the depth model (vipe backend" in done.stderr, done.stderr
    assert f"{missing} is not a folder" in done.stderr and "did not register" not in done.stderr, done.stderr


@pytest.mark.slow
def test_the_quarantine_hint_of_a_run_is_a_command_that_runs_them_again(video_factory, pipeline_env, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(video_factory(1), raw)
    good = next(raw.iterdir())
    broken = raw / "broken.mp4"
    broken.write_bytes(b"")  # fails as bad input, and is quarantined
    out, env = tmp_path / "out", user_env(pipeline_env)
    first = ff("run", str(raw), "--out", str(out), env=env, timeout_s=300)
    assert first.returncode == 1, first.stdout + first.stderr
    hint = printed_command(first.stdout.split("quarantined:", 1)[1])
    assert hint[3:] == ["run", str(raw), "--out", str(out), "--continue"], hint
    broken.unlink()
    shutil.copyfile(good, broken)  # "after fixing"
    again = run_printed(hint, env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "quarantined:" not in again.stdout
