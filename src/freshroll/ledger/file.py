"""The ledger's SQLite file: its schema and mark, atomic creation, a killed writer's journal.

- :func:`create_ledger` builds an empty ledger whole beside its path (tables, the
  ``application_id`` mark :data:`APPLICATION_ID`, :data:`SCHEMA_VERSION`, WAL mode) and
  links it into place: a kill leaves no ledger or an empty one, never a half-made file.
  Leftovers of killed builders (``ledger.sqlite.tmp-<pid>``) are swept first.
- :func:`recover_journal` lets SQLite roll back a hot journal or fold in a WAL that a killed
  writer left, so a read-only connection can read the file.
- :func:`identity` is what a connection's first read says the file is (mark, schema
  objects); :func:`empty_ledger_db` stands for an uninitialised file (no events).

What is stored in the file, and how it is read and written, is :mod:`freshroll.ledger.store`'s.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from freshroll import crashpoints
from freshroll.atomic import fsync_path
from freshroll.procs import pid_alive

SCHEMA_VERSION = 1
APPLICATION_ID = 0x46524C31  # "FRL1": marks a freshroll ledger file

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS payloads (sample TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_SIDE_FILES = ("-journal", "-wal", "-shm")
_ASIDE = ".tmp-"  # ledger.sqlite.tmp-<pid>: a ledger being built by process <pid>


def _init_sql() -> str:
    """Tables, mark and version in ONE transaction."""
    return (f"BEGIN IMMEDIATE;{_SCHEMA}PRAGMA application_id={APPLICATION_ID};"
            f"INSERT OR IGNORE INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}');COMMIT;")


def identity(db: sqlite3.Connection) -> tuple[int, int]:
    """``(application_id, number of schema objects)``; the first read of a connection also
    rolls back a hot journal or recovers a WAL, where the connection may write."""
    app_id = db.execute("PRAGMA application_id").fetchone()[0]
    tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    return int(app_id), int(tables)


def connect_writable(path: Path) -> tuple[sqlite3.Connection, int, int]:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        return (db, *identity(db))
    except BaseException:
        db.close()
        raise


def empty_ledger_db() -> sqlite3.Connection:
    """An in-memory ledger with no events (what an uninitialised file holds)."""
    db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    db.executescript(_init_sql())
    return db


def journals(path: Path) -> list[Path]:
    """The rollback journal and WAL beside ``path`` that exist."""
    return [p for s in ("-journal", "-wal") if (p := path.with_name(path.name + s)).exists()]


def recover_journal(path: Path) -> bool:
    """Let SQLite roll back a hot journal or fold in a WAL that a killed writer left beside
    ``path``, so that a read-only connection can read it (one cannot: "attempt to write a
    readonly database"). Opens the file read-write once, reads, closes; changes no committed
    content. Returns False where nothing needed recovering or the file cannot be written
    (then a read-only open reports it)."""
    if not journals(path):
        return False
    try:
        db = sqlite3.connect(f"file:{path}?mode=rw", uri=True, isolation_level=None)
    except sqlite3.Error:
        return False
    try:
        identity(db)
    except sqlite3.Error:
        return False
    finally:
        db.close()
    return True


def create_ledger(path: Path, *, replace: bool = False) -> None:
    """Create an empty ledger at ``path`` atomically: built whole beside it (tables, mark,
    version, WAL mode; ``ledger.sqlite.tmp-<pid>``), closed (SQLite folds and removes its
    WAL), fsynced, then linked into place. A kill leaves no file at ``path`` or a whole
    empty ledger, never a half-made one. An existing ``path`` is kept (another process
    created it first) unless ``replace``. Leftovers of killed builders are removed first,
    and so are side files with no database (they would be replayed onto the new one)."""
    sweep_aside(path)
    tmp = path.with_name(f"{path.name}{_ASIDE}{os.getpid()}")
    db = sqlite3.connect(tmp, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(_init_sql())
    finally:
        db.close()
    fsync_path(tmp)
    crashpoints.reach("ledger")
    if replace or not path.exists():
        _remove_side_files(path)
    try:
        if replace:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    finally:
        _remove_db(tmp)
    fsync_path(path.parent)


def _link_new(tmp: Path, path: Path) -> None:
    """``tmp`` at ``path`` unless a file is there already (then that one stays)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    except OSError:  # a file system without hard links: rename (the lock keeps others out)
        if not path.exists():
            os.replace(tmp, path)


def sweep_aside(path: Path) -> None:
    """Remove ``<path>.tmp-<pid>`` files (and their side files) of dead processes."""
    head = path.name + _ASIDE
    for stale in path.parent.glob(head + "*"):
        pid = stale.name[len(head):].split("-", 1)[0]
        if pid.isdigit() and (int(pid) == os.getpid() or not pid_alive(int(pid))):
            stale.unlink(missing_ok=True)


def _remove_side_files(path: Path) -> None:
    for side in _SIDE_FILES:
        path.with_name(path.name + side).unlink(missing_ok=True)


def _remove_db(path: Path) -> None:
    path.unlink(missing_ok=True)
    _remove_side_files(path)


__all__ = [
    "APPLICATION_ID", "SCHEMA_VERSION", "connect_writable", "create_ledger", "empty_ledger_db",
    "identity", "journals", "recover_journal", "sweep_aside",
]
