"""``freshroll.atomic.replace_dir``: a directory published whole, its files at the usual mode."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from freshroll.atomic import replace_dir


@pytest.fixture()
def umask_022() -> object:
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.usefixtures("umask_022")
def test_a_file_written_through_a_private_temp_file_gets_the_usual_mode(tmp_path: Path) -> None:
    """Issue 48, item 10: ``export-model`` wrote ``model.safetensors`` mode 0600 (transformers
    5 writes it through ``mkstemp`` and renames it)."""

    def fill(tmp: Path) -> None:
        fd, name = tempfile.mkstemp(dir=tmp)  # 0600, as transformers' writer makes it
        os.write(fd, b"weights")
        os.close(fd)
        os.replace(name, tmp / "model.safetensors")
        (tmp / "config.json").write_text("{}")

    out = replace_dir(tmp_path / "m", fill)
    assert {f.name: f.stat().st_mode & 0o777 for f in out.iterdir()} == {
        "model.safetensors": 0o644, "config.json": 0o644}


def test_a_failed_fill_leaves_nothing(tmp_path: Path) -> None:
    def fill(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        replace_dir(tmp_path / "m", fill)
    assert list(tmp_path.iterdir()) == []
