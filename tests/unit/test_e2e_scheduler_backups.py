"""tests/e2e's removing_scheduler_backups: the e2e playbook runs (gpu_aware.yml, uninstall.yml,
the session's set-aside of the lab's extender) leave no kube-scheduler backups behind on the
lab host (issue 49: never leave a node worse than found), and keep them when a run failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import removing_scheduler_backups

OURS = ("extender.yaml.20261207T113522Z.24004~", "kube-scheduler.yaml.20261207T113522Z.24004~")


def test_the_backups_a_run_made_are_removed_and_the_others_kept(tmp_path: Path) -> None:
    backups = tmp_path / "backups"
    backups.mkdir()
    (backups / "extender.yaml.20260101T000000Z.1~").write_text("an administrator's")
    with removing_scheduler_backups(backups):
        for name in (*OURS, "notes.txt"):
            (backups / name).write_text("x")
    assert sorted(p.name for p in backups.iterdir()) == [
        "extender.yaml.20260101T000000Z.1~", "notes.txt"]


def test_a_directory_the_run_made_goes_too(tmp_path: Path) -> None:
    backups = tmp_path / "backups"
    with removing_scheduler_backups(backups):
        backups.mkdir()
        (backups / OURS[0]).write_text("x")
    assert not backups.exists()


def test_a_failed_run_keeps_its_backups(tmp_path: Path) -> None:
    backups = tmp_path / "backups"
    with pytest.raises(AssertionError), removing_scheduler_backups(backups):
        backups.mkdir()
        (backups / OURS[1]).write_text("x")
        raise AssertionError("ansible-playbook -> 2")
    assert [p.name for p in backups.iterdir()] == [OURS[1]]
