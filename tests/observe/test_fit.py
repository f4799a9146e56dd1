"""freshroll.observe.fit: lines cut or wrapped to the terminal's width, whole in a log."""

from __future__ import annotations

import io
import os

import pytest

from freshroll.observe import fit as fit_mod
from freshroll.observe.fit import fit, fit_with, width, wrap

FIELDS = ["step   12/200", "reward 0.512", "accepted/s    31.0", "lag 0.40 (max 2/4)"]


@pytest.mark.parametrize("most", [1, 5, 13, 14, 27, 28, 40, 80])
def test_fit_keeps_the_leading_fields_that_fit(most: int):
    line = fit(FIELDS, most)
    assert len(line) <= most
    assert "  ".join(FIELDS).startswith(line)
    kept = line.split("  ")
    if len(kept) < len(FIELDS) and len(line) >= len(FIELDS[0]):  # the next one did not fit
        assert len(line) + 2 + len(FIELDS[len(kept)]) > most


def test_without_a_width_every_field_is_kept():
    assert fit(FIELDS, None) == "  ".join(FIELDS)
    assert fit_with(FIELDS, "waiting 60 s", None) == "  ".join([*FIELDS, "waiting 60 s"])
    assert wrap("a " * 300, None) == "a " * 300


def test_a_heartbeat_takes_the_place_of_the_last_fields():
    assert fit_with(FIELDS, "waiting 60 s", 45) == "step   12/200  reward 0.512  waiting 60 s"
    assert fit_with(FIELDS, "waiting 60 s on w0 generate", 20) == "step   12/200  waiti"


def test_wrap_breaks_at_spaces_and_indents_what_follows():
    text = "freshroll: /tmp/run: 200 steps, async (max_staleness 2), model /a/very/long/path"
    lines = wrap(text, 30).split("\n")
    assert all(len(x) <= 30 for x in lines) and len(lines) > 1
    assert all(x.startswith("  ") for x in lines[1:])
    assert " ".join(x.strip() for x in lines) == text


def test_width_is_the_terminals_less_one_column_and_none_for_a_file(
    monkeypatch: pytest.MonkeyPatch,
):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(fit_mod.shutil, "get_terminal_size", lambda: os.terminal_size((110, 40)))
    assert width(Tty()) == 109
    assert width(io.StringIO()) is None


@pytest.mark.parametrize(("cols", "want"), [(50, 49), (0, 109)])
def test_width_is_the_streams_own_terminals_when_it_has_one(
    monkeypatch: pytest.MonkeyPatch, cols: int, want: int,
):
    """stderr stays a terminal in ``freshroll run > log``, where stdout's size is unknown; a
    pty that answers 0 columns (not sized yet) falls back to shutil's answer."""
    import fcntl
    import struct
    import termios

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(fit_mod.shutil, "get_terminal_size", lambda: os.terminal_size((110, 40)))
    leader, follower = os.openpty()
    try:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
        with open(follower, "w", closefd=False) as stream:
            assert width(stream) == want
    finally:
        os.close(leader)
        os.close(follower)
