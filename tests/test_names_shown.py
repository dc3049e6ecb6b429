"""What a run shows of the names in a dataset: a name is shown escaped (no control character reaches the terminal),
and enqueue lists exactly the videos the workers will read (a link leading out of the folder is skipped, said)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tasks.cli.watch import report
from tasks.errors import PathOutsideRoot
from tasks.outputs.storage import confine
from tasks.run.listing import walk_videos

ESCAPE = "\x1b[2J\x1b[31m"  # clear the screen, then red


def test_the_failed_list_shows_each_name_escaped(tmp_path, capsys):
    failed = {
        "video": f"cam{ESCAPE}1.mp4",
        "video_id": "cam1-0a1b2c3d",
        "stage": "depth",
        "error_class": "BadInput",
        "reason": "unreadable\nfailed: 0 videos (a forged line)",
    }
    summary = {"done": 0, "videos": 1, "statistics_videos": 0, "failed": [failed]}
    assert report(summary, tmp_path) == 1
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\\x1b[2J\\x1b[31m" in shown
    (line,) = [line for line in shown.splitlines() if "cam" in line]
    assert (
        line
        == "  cam\\x1b[2J\\x1b[31m1.mp4 (cam1-0a1b2c3d): depth: BadInput: unreadable\\nfailed: 0 videos (a forged line)"
    )


def test_enqueue_lists_a_linked_video_exactly_when_the_workers_read_it(tmp_path, caplog):
    raw, elsewhere = tmp_path / "raw", tmp_path / "elsewhere"
    (raw / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    (raw / "a.mp4").write_bytes(b"a")
    (elsewhere / "b.mp4").write_bytes(b"bb")
    (raw / "sub" / "inside.mp4").symlink_to(raw / "a.mp4")
    (raw / "outside.mp4").symlink_to(elsewhere / "b.mp4")
    (raw / "up.mp4").symlink_to(Path("..") / "elsewhere" / "b.mp4")
    with caplog.at_level(logging.WARNING, logger="framefleet.enqueue"):
        listed = [found.path for found in walk_videos(raw)]
    assert listed == ["a.mp4", "sub/inside.mp4"]
    for name in ("a.mp4", "sub/inside.mp4", "outside.mp4", "up.mp4"):
        try:
            confine(raw, name)  # the worker's rule for a job's video (tasks.job_check)
            read = True
        except PathOutsideRoot:
            read = False
        assert read == (name in listed), name
    assert "skipped 'outside.mp4'" in caplog.text and "skipped 'up.mp4'" in caplog.text
    assert "the workers refuse to read" in caplog.text


@pytest.mark.parametrize("name", ["plain.mp4", "café.mp4"])
def test_a_printable_name_is_shown_as_it_is(tmp_path, capsys, name):
    failed = {"video": name, "video_id": "x", "stage": "depth", "error_class": "BadInput", "reason": "r"}
    report({"done": 0, "videos": 1, "statistics_videos": 0, "failed": [failed]}, tmp_path)
    assert f"  {name} (x): depth: BadInput: r" in capsys.readouterr().out.splitlines()
