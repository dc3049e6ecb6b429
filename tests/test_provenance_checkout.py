"""What provenance says of the code that ran: a checkout's commit, and whether its tracked files were changed
(real git repositories; the tree a GPU host is given is a copy with its ``.git`` and the edits not committed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tasks.outputs import provenance
from tasks.outputs.provenance_file import summary


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "model.py").write_text("WEIGHTS = 1\n")
    (repo / "other.py").write_text("X = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "pinned")
    return repo


def test_a_clean_checkout_names_its_commit_and_no_change(checkout):
    (checkout / "notes.txt").write_text("untracked: not code that ran\n")
    assert provenance.git_state(checkout) == (_git(checkout, "rev-parse", "HEAD"), 0)


def test_edited_staged_and_removed_files_are_counted(checkout):
    head = _git(checkout, "rev-parse", "HEAD")
    (checkout / "model.py").write_text("WEIGHTS = 2\n")
    assert provenance.git_state(checkout) == (head, 1)
    _git(checkout, "add", "model.py")  # staged, not committed: still not the commit's code
    (checkout / "other.py").unlink()
    assert provenance.git_state(checkout) == (head, 2)


def test_a_folder_that_is_no_checkout_has_no_state(tmp_path):
    assert provenance.git_state(tmp_path) is None and provenance.git_commit(tmp_path) is None


def test_an_upstream_checkout_with_changes_says_so_in_the_stage_version(checkout):
    class Model:
        packages = ()
        repo_dir = str(checkout)

    (checkout / "model.py").write_text("WEIGHTS = 3\n")
    found = provenance._identity(Model())
    head = _git(checkout, "rev-parse", "HEAD")
    assert found["upstream_commit"] == head and found["upstream_modified_files"] == 1
    meta = {"stages": {"depth": {"backend": "vipe", **found, "settings_sha256": "0" * 64}}}
    assert summary(meta)["versions"]["depth"] == f"{head}, 1 tracked file(s) changed"
    assert provenance.with_changes(head, 1) == f"{head[:12]}, 1 tracked file(s) changed"
    assert provenance.with_changes(head, 0) == head[:12]
