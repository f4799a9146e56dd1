"""What a SIGKILL inside an unprotected ledger creation leaves, built on purpose (a test aid).

A new SQLite file starts in rollback-journal mode: its first write (the switch to WAL, the
tables) goes through ``<file>-journal``. A process killed inside that write, once SQLite has
spilled pages into the file, leaves a *hot* journal that the next opener must roll back; a
read-only connection cannot ("attempt to write a readonly database"). Issue 23, defect 1.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

_HOT_JOURNAL = textwrap.dedent("""
    import os, sqlite3, sys
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("PRAGMA cache_size=2")  # spill dirty pages into the file before the commit
    db.execute("BEGIN")
    db.execute("CREATE TABLE half (x)")
    for _ in range(300):
        db.execute("INSERT INTO half VALUES (?)", (b"x" * 1000,))
    os._exit(9)  # dies inside the first transaction, like a SIGKILL
""")


def kill_inside_ledger_creation(path: Path) -> Path:
    """Leave at ``path`` a file with a hot ``-journal`` whose rollback empties it; returns
    the journal's path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-c", _HOT_JOURNAL, str(path)],
                          capture_output=True, timeout=60)
    assert proc.returncode == 9, proc.stderr.decode()
    journal = path.with_name(path.name + "-journal")
    assert journal.stat().st_size > 0 and path.stat().st_size > 4096
    return journal
