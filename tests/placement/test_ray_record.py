"""``RUN_DIR/ray.json`` holds the private Ray instance's token: readable by its owner only.

Issue 23, defect 4. Before: written with the umask's mode (0644: anyone could read it).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from freshroll.placement.ray_reaper import RECORD_FILE, read_record, remove_record, write_record


@pytest.fixture
def open_umask():
    """The most permissive umask: the mode must come from the open, not from the umask."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_record_is_created_with_mode_0600(tmp_path: Path, open_umask: None):
    write_record(tmp_path, "tok" * 8, watchdog_pid=123)
    assert _mode(tmp_path / RECORD_FILE) == 0o600
    record = read_record(tmp_path)
    assert record is not None and record["token"] == "tok" * 8
    assert record["driver_pid"] == os.getpid() and record["watchdog_pid"] == 123
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD_FILE]  # no temp file left


def test_a_leftover_readable_temp_file_does_not_lend_its_mode(tmp_path: Path, open_umask: None):
    leftover = tmp_path / (RECORD_FILE + ".tmp")  # a kill between write and rename
    leftover.write_text("old")
    leftover.chmod(0o644)
    (tmp_path / RECORD_FILE).write_text("{}")
    (tmp_path / RECORD_FILE).chmod(0o644)  # an older freshroll's record
    write_record(tmp_path, "new-token", watchdog_pid=None)
    assert _mode(tmp_path / RECORD_FILE) == 0o600
    remove_record(tmp_path, "new-token")
    assert not (tmp_path / RECORD_FILE).exists()
