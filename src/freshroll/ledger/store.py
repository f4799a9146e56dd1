"""The durable, append-only ledger of lifecycle events (SQLite, WAL).

Guarantees:

- Events get consecutive sequence numbers starting at 1 and are never updated
  or deleted.
- :meth:`Ledger.append` only buffers; :meth:`Ledger.flush` writes everything
  buffered in ONE transaction. With ``sync="full"`` (the default) SQLite fsyncs
  the WAL at that commit, so after ``flush()`` returns the events survive a
  SIGKILL or a power cut. A crash loses at most the events appended since the
  last flush, and what survives is always a *prefix* of the history: replaying
  it gives a consistent state. Callers flush at every commit boundary (a
  trainer step, a clean shutdown); the ledger also flushes by itself once
  ``flush_every`` events are buffered.
- Sample payloads (completion tokens and the like) are stored in the same
  transaction as the event that produced them.
- Reading an unreadable, truncated or foreign file, or an event this version
  does not know, raises :class:`~freshroll.errors.LedgerError` naming the file
  (and the sequence number), never a bare sqlite or decode error.
- Creation is atomic (:func:`~freshroll.ledger.file.create_ledger`): the empty ledger is
  built whole beside its path and linked into place, so a kill leaves no ledger or an
  empty one, never a half-made file. Every reader first recovers a hot journal or WAL that
  a killed writer left (:func:`~freshroll.ledger.file.recover_journal`; a read-only
  connection cannot), or says in one :class:`~freshroll.errors.LedgerError` what to do
  where it cannot. An uninitialised SQLite file (a creation cut short by an older
  freshroll) is an empty ledger: readers see no events, a writer replaces it with a whole
  one.
- A full disk is a :class:`~freshroll.errors.StorageError` naming the file, and loses
  nothing that was flushed. A run's ledger keeps a reserve on the disk
  (:data:`RESERVE_BYTES`) that only its closing write may spend, so a run stopped by a
  full disk still closes its ledger; where even that does not fit, the ledger is left
  open, as a kill leaves it (``--resume`` continues it).
"""

from __future__ import annotations

import functools
import os
import sqlite3
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

import msgspec

from freshroll.errors import FreshrollError, LedgerError, StorageError, UnknownEventError
from freshroll.ledger.events import DECODER, ENCODER, EVENT_KINDS, KIND_OF, AnyEvent, Closed, Event
from freshroll.ledger.file import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    connect_writable,
    create_ledger,
    empty_ledger_db,
    identity,
    journals,
    recover_journal,
    sweep_aside,
)

LEDGER_FILE = "ledger.sqlite"
#: what a run's ledger sets aside for its closing write on a full disk (see Ledger)
RESERVE_BYTES = 4 << 20

_encode_lines = ENCODER.encode_lines
#: rows per INSERT statement: one multi-row ``INSERT .. VALUES (..), (..)`` binds and steps
#: far faster than ``executemany`` row by row (the same rows, the same file). 256 x 3
#: parameters stay under SQLite's oldest limit of 999 bound parameters per statement.
_ROWS_PER_INSERT = 256
_INSERT_EVENT = "INSERT INTO events VALUES "
_INSERT_PAYLOAD = "INSERT OR REPLACE INTO payloads VALUES "


@functools.cache
def _insert_sql(head: str, width: int, n: int) -> str:
    row = "(" + ",".join("?" * width) + ")"
    return head + ",".join([row] * n)


def _event_rows(events: list[Event], first_seq: int) -> list[Any]:
    """The ``(seq, kind, body)`` rows of ``events``, flattened. Bodies are encoded in one
    call (``encode_lines``: exactly ``encode(event)`` per line; JSON escapes every newline
    inside strings, so splitting on newlines is exact), as ``bytearray``: the sqlite3 module
    binds bytes and bytearray alike as a BLOB, but runs every ``bytes`` parameter through its
    adapter lookup first (thousands of instructions each; bytearray skips it)."""
    n = len(events)
    bodies = bytearray(_encode_lines(events)).split(b"\n")
    bodies.pop()  # after the last newline
    flat: list[Any] = [None] * (3 * n)
    flat[0::3] = range(first_seq, first_seq + n)
    flat[1::3] = [KIND_OF[type(e)] for e in events]
    flat[2::3] = bodies
    return flat


def _insert(db: sqlite3.Connection, head: str, width: int, flat: Sequence[Any]) -> None:
    """Insert the rows of ``width`` values in ``flat`` in order, ``_ROWS_PER_INSERT`` per
    statement; the tail is split into powers of two so that only a few distinct statements
    are ever prepared (and cached)."""
    i, n = 0, len(flat) // width
    while i < n:
        k = min(_ROWS_PER_INSERT, 1 << ((n - i).bit_length() - 1))
        db.execute(_insert_sql(head, width, k), flat[i * width : (i + k) * width])
        i += k


def _readonly_uri(path: Path) -> str:
    """The URI of a read-only connection to ``path``. With no journal or WAL beside it (no
    writer is live, no kill left one: a closed run's ledger) the file is opened
    ``immutable``: SQLite then creates no ``-wal`` or ``-shm`` beside it, so ``verify``,
    ``export``, ``timing``, ``report`` and ``replay`` leave the run directory as they found
    it (a plain read-only open of a WAL-mode file creates both). Beside a live writer's WAL,
    a plain read-only connection, which reads what the writer committed."""
    quoted = urllib.parse.quote(str(path))
    if journals(path):
        return f"file:{quoted}?mode=ro"
    return f"file:{quoted}?mode=ro&immutable=1"


class Ledger:
    """Append-only event store over one SQLite file.

    ``reserve``: bytes a writer sets aside on the disk (``<path>.reserve``, allocated at
    open, best effort; deleted at close) for the write that closes the ledger when the disk
    is full (:meth:`flush`). A run asks for :data:`RESERVE_BYTES`; 0 keeps none.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        sync: Literal["full", "normal", "off"] = "full",
        flush_every: int = 8192,
        readonly: bool = False,
        reserve: int = 0,
    ) -> None:
        self.path = Path(path)
        self.flush_every = flush_every
        self.readonly = readonly
        self._pending: list[Event] = []  # appended, not yet written: seqs _seq-len+1 .. _seq
        self._pending_payloads: list[tuple[str, bytes]] = []
        self._reserve: Path | None = None
        self._db = self._connect(sync)
        if reserve > 0 and not readonly:
            self._reserve = _make_reserve(self.path, reserve)
        self._seq: int = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
        self.flushes = 0

    # -- opening --------------------------------------------------------------------
    def _connect(self, sync: str) -> sqlite3.Connection:
        db: sqlite3.Connection | None = None
        try:
            db = self._open_readonly() if self.readonly else self._open_writable(sync)
            self._check_schema(db)
        except (sqlite3.DatabaseError, LedgerError) as exc:
            if db is not None:
                if db.in_transaction:
                    db.rollback()
                db.close()
            if isinstance(exc, LedgerError):
                raise
            raise LedgerError(f"{self.path}: cannot open ledger: {exc}") from exc
        return db

    def _open_readonly(self) -> sqlite3.Connection:
        """A read-only connection, after recovering what a killed writer left beside the file
        (:func:`recover_journal`). An empty, uninitialised SQLite file (a creation that a
        kill cut short, by a freshroll older than atomic creation) reads as an empty ledger."""
        if not self.path.is_file():
            raise LedgerError(f"{self.path}: no such ledger file")
        recover_journal(self.path)
        db = sqlite3.connect(_readonly_uri(self.path), uri=True, isolation_level=None)
        try:
            app_id, tables = identity(db)
        except sqlite3.DatabaseError as exc:
            db.close()
            left = [p for p in journals(self.path) if p.stat().st_size > 0]
            if not left:  # a damaged file, not a killed writer's (an empty -wal holds nothing)
                raise
            raise LedgerError(
                f"{self.path}: cannot open ledger: {exc}; a process killed while writing it "
                f"left {left[0].name}, and recovering it needs write access: run the command "
                f"once where {self.path.parent} is writable (or on a copy of the whole run "
                "directory, side files included)"
            ) from exc
        if app_id not in (0, APPLICATION_ID):
            db.close()
            raise LedgerError(f"{self.path}: not a freshroll ledger (application_id={app_id})")
        if app_id == 0 and tables == 0:
            db.close()
            return empty_ledger_db()
        return db

    def _open_writable(self, sync: str) -> sqlite3.Connection:
        """A read-write connection in WAL mode; a new ledger is created whole first
        (:func:`create_ledger`), so no kill leaves a half-made file at :attr:`path`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sweep_aside(self.path)
        if not self.path.exists():
            create_ledger(self.path)
        db, app_id, tables = connect_writable(self.path)
        if app_id == 0 and tables == 0:  # uninitialised (see _open_readonly): make it whole
            db.close()
            create_ledger(self.path, replace=True)
            db, app_id, tables = connect_writable(self.path)
        if app_id != APPLICATION_ID:
            db.close()
            raise LedgerError(f"{self.path}: not a freshroll ledger (application_id={app_id})")
        db.execute("PRAGMA journal_mode=WAL")  # already so: writes nothing
        db.execute(f"PRAGMA synchronous={sync.upper()}")
        return db

    def _check_schema(self, db: sqlite3.Connection) -> None:
        try:
            row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.OperationalError as exc:
            raise LedgerError(f"{self.path}: not a freshroll ledger ({exc})") from exc
        if row is None or int(row[0]) != SCHEMA_VERSION:
            raise LedgerError(
                f"{self.path}: ledger schema {row[0] if row else 'missing'}, "
                f"this freshroll reads schema {SCHEMA_VERSION}"
            )

    # -- writing --------------------------------------------------------------------
    @property
    def last_seq(self) -> int:
        """Sequence number of the last appended event (durable or not)."""
        return self._seq

    def append(self, event: Event) -> int:
        """Buffer ``event``; returns its sequence number."""
        self._seq = seq = self._seq + 1
        pending = self._pending
        pending.append(event)
        if len(pending) >= self.flush_every:
            self.flush()
        return seq

    def put_payload(self, sample: str, data: bytes) -> None:
        """Store ``data`` for ``sample`` with the next flush."""
        self._pending_payloads.append((sample, data))

    def flush(self) -> None:
        """Write all buffered events and payloads in one durable transaction.

        A full disk raises :class:`~freshroll.errors.StorageError` naming the file and keeps
        the events buffered; a batch that ends in a ``closed`` event (the run's close, also
        after a failure) first spends the reserve (see :class:`Ledger`) and tries once more,
        so a run stopped by a full disk still closes its ledger. Any other failure raises
        :class:`~freshroll.errors.LedgerError`."""
        if self.readonly:
            raise LedgerError(f"{self.path}: opened read-only")
        if not self._pending and not self._pending_payloads:
            return
        try:
            self._write()
        except sqlite3.Error as exc:
            if not (_full(exc) and self._closes() and self._spend_reserve()):
                raise self._write_error(exc) from exc
            try:
                self._write()
            except sqlite3.Error as again:
                raise self._write_error(again) from again
        self._pending.clear()
        self._pending_payloads.clear()
        self.flushes += 1

    def _write(self) -> None:
        """The buffered events and payloads in one transaction (rolled back on failure)."""
        try:
            rows = _event_rows(self._pending, self._seq - len(self._pending) + 1)
            payloads = [x for s, d in self._pending_payloads for x in (s, bytearray(d))]
            self._db.execute("BEGIN IMMEDIATE")
            _insert(self._db, _INSERT_EVENT, 3, rows)
            _insert(self._db, _INSERT_PAYLOAD, 2, payloads)
            self._db.execute("COMMIT")
        except sqlite3.Error:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _write_error(self, exc: sqlite3.Error) -> FreshrollError:
        if _full(exc):
            return StorageError(f"cannot write {self.path}: disk full ({exc})")
        return LedgerError(f"{self.path}: write failed: {exc}")

    def _closes(self) -> bool:
        return bool(self._pending) and isinstance(self._pending[-1], Closed)

    def _spend_reserve(self) -> bool:
        """Free the reserve's space for the closing write; False if there is none (never
        made, or spent already)."""
        return self._drop_reserve()

    def _drop_reserve(self) -> bool:
        if self._reserve is None:
            return False
        self._reserve.unlink(missing_ok=True)
        self._reserve = None
        return True

    # -- reading --------------------------------------------------------------------
    def rows(self, after: int = 0) -> Iterator[tuple[int, str, bytes]]:
        """Durable ``(seq, kind, json body)`` rows with ``seq > after``, in order."""
        try:
            cur = self._db.execute(
                "SELECT seq, kind, body FROM events WHERE seq > ? ORDER BY seq", (after,)
            )
            expected = after + 1
            for seq, kind, body in cur:
                if seq != expected:
                    raise LedgerError(f"{self.path}: sequence gap: expected {expected}, got {seq}")
                expected += 1
                yield seq, kind, bytes(body)
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{self.path}: read failed: {exc}") from exc

    def events(self, after: int = 0) -> Iterator[tuple[int, AnyEvent]]:
        """Durable events with ``seq > after``, decoded and validated, in order."""
        decode, kind_of = DECODER.decode, KIND_OF
        for seq, kind, body in self.rows(after):
            try:  # fast path (replay is bound by this loop); errors are rebuilt below
                event: AnyEvent = decode(body)
            except msgspec.MsgspecError:
                decode_event(body, where=f"{self.path} seq {seq}", kind=kind)  # raises
                raise
            if kind_of[type(event)] != kind:
                raise LedgerError(
                    f"{self.path} seq {seq}: kind column {kind!r} does not match the "
                    f"event body ({kind_of[type(event)]!r})"
                )
            yield seq, event

    def last_of(self, kind: str) -> AnyEvent | None:
        """The durable event of ``kind`` with the highest ``seq`` (None: none), found without
        decoding the others (a finished run's last commit, read before anything starts)."""
        try:
            row = self._db.execute("SELECT seq, body FROM events WHERE kind=? ORDER BY seq DESC "
                                   "LIMIT 1", (kind,)).fetchone()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{self.path}: read failed: {exc}") from exc
        if row is None:
            return None
        return decode_event(bytes(row[1]), where=f"{self.path} seq {row[0]}", kind=kind)

    def payload(self, sample: str) -> bytes | None:
        row = self._db.execute("SELECT data FROM payloads WHERE sample=?", (sample,)).fetchone()
        return None if row is None else bytes(row[0])

    def payloads(self) -> dict[str, bytes]:
        return {s: bytes(d) for s, d in self._db.execute("SELECT sample, data FROM payloads")}

    def export_jsonl(self, out: IO[bytes]) -> int:
        """Write every durable event as one JSON line (``seq`` first); returns the count."""
        n = 0
        for seq, _kind, body in self.rows():
            out.write(b'{"seq":%d,' % seq + body[1:] + b"\n")
            n += 1
        return n

    def close(self) -> None:
        """Flush (a writer) and close the file, even if the flush fails; the reserve goes."""
        try:
            if not self.readonly:
                self.flush()
        finally:
            self._db.close()
            self._drop_reserve()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def decode_event(body: bytes, *, where: str, kind: str | None = None) -> AnyEvent:
    """Decode one JSON event; errors name ``where``."""
    try:
        event: AnyEvent = DECODER.decode(body)
    except msgspec.ValidationError as exc:
        if kind is not None and kind not in EVENT_KINDS:
            raise UnknownEventError(f"{where}: unknown event kind {kind!r}") from exc
        if "$.kind" in str(exc):
            raise UnknownEventError(f"{where}: unknown event kind: {exc}") from exc
        raise LedgerError(f"{where}: malformed event: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise LedgerError(f"{where}: malformed event JSON: {exc}") from exc
    return event


def _full(exc: sqlite3.Error) -> bool:
    """SQLite's "database or disk is full" (the disk, a quota, or max_page_count)."""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


def _make_reserve(path: Path, size: int) -> Path | None:
    """``<path>.reserve`` with ``size`` bytes allocated on disk, or None where the disk
    cannot spare them now (the ledger then works without one)."""
    reserve = path.with_name(path.name + ".reserve")
    try:
        fd = os.open(reserve, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
    except OSError:
        reserve.unlink(missing_ok=True)
        return None
    return reserve


def holds_events(path: Path) -> bool:
    """Whether the ledger file ``path`` holds a run: it exists and an event was written to
    it, or it cannot be read as a ledger (never taken for an empty one). A file that a kill
    left without events (its creation, or the run's start) holds none."""
    if not path.exists():
        return False
    try:
        with Ledger(path, readonly=True) as ledger:
            return ledger.last_seq > 0
    except LedgerError:
        return True


def open_ledger(run_dir: str | Path, **kwargs: object) -> Ledger:
    """The ledger of a run directory (``RUN_DIR/ledger.sqlite``)."""
    return Ledger(Path(run_dir) / LEDGER_FILE, **kwargs)  # type: ignore[arg-type]  # Ledger's own keywords, passed on
