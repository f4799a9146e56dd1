"""The durable ledger: round trips, durability, atomic flushes, and bad input of every kind.

Every unreadable file must give a :class:`LedgerError` naming the file (and the
sequence number for a bad row), never a bare ``sqlite3`` or ``msgspec`` error.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest
from kernel_driver import SimConfig, simulate

from freshroll.errors import LedgerError, StorageError, UnknownEventError
from freshroll.ledger import events as ev
from freshroll.ledger.store import APPLICATION_ID, LEDGER_FILE, Ledger, decode_event, open_ledger


def _events(n: int, start: int = 0) -> list[ev.Event]:
    out: list[ev.Event] = []
    for i in range(start, start + n):
        out.append(ev.Requested(ts=float(i), group=f"g{i}", prompt_id=f"p{i}", size=2,
                                version="p0-ab"))
    return out


def _read(path: Path) -> list[tuple[int, ev.Event]]:
    with Ledger(path, readonly=True) as ledger:
        return list(ledger.events())


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed, simulated run with every event kind the simulator writes."""
    from freshroll.kernel.results import KernelConfig

    run = tmp_path_factory.mktemp("run") / "sim"
    buf = simulate(run, KernelConfig(1, 2, 3),
                   SimConfig(steps=6, seed=5, faults=True, payload_bytes=7))
    buf.ledger.close()
    return run


@pytest.fixture
def ledger_copy(real_run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy" / LEDGER_FILE
    dst.parent.mkdir()
    shutil.copy(real_run / LEDGER_FILE, dst)
    assert not (real_run / (LEDGER_FILE + "-wal")).exists()  # closed: nothing left in a WAL
    return dst


# -- round trip ----------------------------------------------------------------------
def test_append_flush_read_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    sent = [*_events(3),
            ev.Started(ts=3.0, sample="g0.0#1", worker="w0", epoch=0, version="p0-ab"),
            ev.Discarded(ts=4.0, request="g0.1", reason="invalid", detail="empty"),
            ev.Closed(ts=5.0)]
    with Ledger(path) as ledger:
        assert ledger.last_seq == 0
        seqs = [ledger.append(e) for e in sent]
        assert seqs == [1, 2, 3, 4, 5, 6]
        assert ledger.last_seq == 6
        ledger.flush()
        assert ledger.flushes == 1
        ledger.flush()  # nothing pending: no empty transaction
        assert ledger.flushes == 1
        assert list(ledger.events()) == list(zip(seqs, sent, strict=True))
        assert list(ledger.events(after=4)) == [(5, sent[4]), (6, sent[5])]
        assert [(s, k) for s, k, _ in ledger.rows(after=2)] == [
            (3, "requested"), (4, "started"), (5, "discarded"), (6, "closed")]
    # a reopened writer continues the numbering
    with Ledger(path) as ledger:
        assert ledger.last_seq == 6
        assert ledger.append(ev.Closed(ts=6.0)) == 7
    assert [s for s, _ in _read(path)] == list(range(1, 8))


def test_every_event_kind_round_trips(tmp_path: Path) -> None:
    samples: list[ev.Event] = [
        ev.Opened(ts=0.5, run_id="r", incarnation=0, max_staleness=1, batch_groups=2,
                  group_size=2, max_inflight_groups=3),
        ev.PolicyPublished(ts=1, version="p0-ab"),
        ev.Requested(ts=1, group="g0", prompt_id="x", size=2, version="p0-ab"),
        ev.WorkerStarted(ts=1, worker="w0", epoch=0),
        ev.WorkerFenced(ts=1, worker="w0", epoch=0, reason="lost"),
        ev.Started(ts=1, sample="g0.0#1", worker="w0", epoch=0, version="p0-ab"),
        ev.Generated(ts=1, sample="g0.0#1", tokens=3, gen_s=0.1, last_version="p1-cd",
                     payload_digest="0f" * 16),
        ev.Rewarded(ts=1, sample="g0.0#1", reward=-0.5, reward_version="r:x:ab", reward_s=0.2),
        ev.Ready(ts=1, group="g0", samples=["g0.0#1"]),
        ev.Leased(ts=1, lease="l0", version="p0-ab", groups=["g0"], wait_s=0.3),
        ev.LeaseReleased(ts=1, lease="l0", reason="trainer_error"),
        ev.Committed(ts=1, lease="l0", version="p1-cd", parent="p0-ab", settings_digest="s",
                     samples=["g0.0#1"], train_s=1.5),
        ev.CheckpointSaved(ts=1, step=1, version="p1-cd", files={"meta.json": "ab" * 32}),
        ev.Evaluated(ts=1, step=1, lines=[{"step": 1, "mode": "greedy", "reward": 0.25,
                                           "rewards": {"reverse": 0.25}, "n_scored": 4}]),
        ev.StepSkipped(ts=1, lease="l1", version="p1-cd", reason="nonfinite", detail="loss nan"),
        ev.Discarded(ts=1, request="g0.1", reason="stale", sample="g0.1#1", detail="lag 3"),
        ev.Rejected(ts=1, sample="g0.0#1", reason="duplicate"),
        ev.WeightsLoaded(ts=1, worker="w0", epoch=1, version="p1-cd", transfer_s=0.01),
        ev.FaultInjected(ts=1, fault="kill", target="w0", detail="x"),
        ev.RunConfig(ts=1, step=0, config='{"run":{}}', config_digest="ab", model_digest="cd"),
        ev.SettingsChanged(ts=1, step=3, keys=["trainer.lr"], old='{"trainer.lr":0.1}',
                           new='{"trainer.lr":0.2}', allowed=["trainer.lr"]),
        ev.WorkerReady(ts=1, worker="w0", epoch=0, startup_s=2.5),
        ev.ControllerDecided(
            ts=1, mode="adaptive",
            previous=ev.LiveSettings(admission_limit=4, concurrency=8, workers=2),
            settings=ev.LiveSettings(admission_limit=6, concurrency=8, workers=3),
            bottleneck="producer", reason="+1 workers",
            inputs={"window_s": 5.0, "worker_rates": [1.0, 2.5], "discards": {"stale": 1}},
            state={"last_up_at": 3.0, "probe": None, "latched": False}),
        ev.TrainerRestarted(ts=1, lease="l2", version="p1-cd", restart=1, reason="lost",
                            rebuild_s=1.5, detail="actor died"),
        ev.ModeDecided(ts=1, step=12, mode="sync", lookahead=0, phase="chose",
                       reason="async 0.93x the sync window", async_per_s=93.0,
                       sync_per_s=100.0),
        ev.Closed(ts=2, reason="done"),
    ]
    assert {type(e) for e in samples} == set(ev.EVENT_TYPES)
    with Ledger(tmp_path / "l.sqlite") as ledger:
        for e in samples:
            ledger.append(e)
    assert [e for _, e in _read(tmp_path / "l.sqlite")] == samples


def test_payloads_are_stored_with_their_flush(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.sqlite") as ledger:
        ledger.append(_events(1)[0])
        ledger.put_payload("g0.0#1", b"\x00tokens\xff")
        assert ledger.payload("g0.0#1") is None  # not yet flushed
        ledger.flush()
        assert ledger.payload("g0.0#1") == b"\x00tokens\xff"
        ledger.put_payload("g0.0#1", b"again")  # replace, e.g. after a re-score
        ledger.flush()
        assert ledger.payloads() == {"g0.0#1": b"again"}
        assert ledger.payload("nope") is None


def test_flush_every_flushes_by_itself(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    writer = Ledger(path, flush_every=3)
    for e in _events(7):
        writer.append(e)
    assert writer.flushes == 2
    assert len(_read(path)) == 6  # the 7th is still only buffered
    writer.close()
    assert len(_read(path)) == 7


# -- durability ----------------------------------------------------------------------
def test_unflushed_events_are_invisible_to_a_second_reader(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    writer = Ledger(path)
    for e in _events(2):
        writer.append(e)
    writer.flush()
    writer.append(_events(1, start=2)[0])
    writer.put_payload("g2.0#1", b"p")
    assert writer.last_seq == 3
    with Ledger(path, readonly=True) as reader:
        assert [s for s, _ in reader.events()] == [1, 2]
        assert reader.payload("g2.0#1") is None
        writer.flush()
        assert [s for s, _ in reader.events()] == [1, 2, 3]  # same reader sees it now
        assert reader.payload("g2.0#1") == b"p"
    writer.close()


def test_unflushed_events_are_lost_if_the_writer_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    writer = Ledger(path)
    for e in _events(2):
        writer.append(e)
    writer.flush()
    for e in _events(5, start=2):
        writer.append(e)
    writer.put_payload("lost", b"x")
    del writer  # no close(): the process "died" with events buffered
    with Ledger(path) as again:
        assert [s for s, _ in again.events()] == [1, 2]
        assert again.payload("lost") is None
        assert again.last_seq == 2
        assert again.append(_events(1, start=9)[0]) == 3  # numbering continues, no gap


def test_sigkill_keeps_exactly_the_flushed_prefix(tmp_path: Path) -> None:
    """A real process dies (SIGKILL) with events buffered: the flushed prefix survives."""
    path = tmp_path / "l.sqlite"
    script = textwrap.dedent(f"""
        import os, signal
        from freshroll.ledger import events as ev
        from freshroll.ledger.store import Ledger
        led = Ledger({str(path)!r})
        for i in range(10):
            led.append(ev.Closed(ts=float(i)))
            if i == 5:
                led.put_payload("kept", b"k")
                led.flush()
        led.put_payload("lost", b"l")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()
    with Ledger(path) as ledger:
        assert [(s, e.ts) for s, e in ledger.events()] == [(i + 1, float(i)) for i in range(6)]
        assert ledger.payloads() == {"kept": b"k"}


def test_flush_is_atomic_events_and_payloads(tmp_path: Path) -> None:
    """A flush that fails part-way (after its events are inserted) writes nothing."""
    path = tmp_path / "l.sqlite"
    writer = Ledger(path)
    writer.append(_events(1)[0])
    writer.flush()
    side = sqlite3.connect(path)
    side.execute("CREATE TRIGGER boom BEFORE INSERT ON payloads WHEN NEW.sample = 'bad' "
                 "BEGIN SELECT RAISE(ABORT, 'injected failure'); END")
    side.commit()
    for e in _events(3, start=1):
        writer.append(e)
    writer.put_payload("good", b"g")
    writer.put_payload("bad", b"b")  # inserted last, after the events: fails the transaction
    with pytest.raises(LedgerError) as info:
        writer.flush()
    assert str(path) in str(info.value) and "injected failure" in str(info.value)
    with Ledger(path, readonly=True) as reader:
        assert [s for s, _ in reader.events()] == [1]
        assert reader.payloads() == {}
    # the batch is still buffered: once the fault is gone it is written whole, once
    side.execute("DROP TRIGGER boom")
    side.commit()
    side.close()
    writer.flush()
    writer.close()
    with Ledger(path, readonly=True) as reader:
        assert [s for s, _ in reader.events()] == [1, 2, 3, 4]
        assert reader.payloads() == {"good": b"g", "bad": b"b"}


def test_two_writers_cannot_interleave_sequence_numbers(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    a, b = Ledger(path), Ledger(path)
    a.append(_events(1)[0])
    a.flush()
    b.append(_events(1, start=5)[0])  # b still believes seq 1 is free
    with pytest.raises(LedgerError) as info:
        b.flush()
    assert str(path) in str(info.value)
    assert [e.group for _, e in a.events()] == ["g0"]  # type: ignore[attr-defined]
    a.close()
    b._pending.clear()
    b.close()


def test_readonly_ledger_refuses_writes(ledger_copy: Path) -> None:
    with Ledger(ledger_copy, readonly=True) as ledger:
        ledger.append(ev.Closed(ts=1.0))
        with pytest.raises(LedgerError, match="read-only"):
            ledger.flush()


# -- bad rows ------------------------------------------------------------------------
def _insert_row(path: Path, kind: str, body: bytes, seq: int | None = None) -> int:
    db = sqlite3.connect(path)
    if seq is None:
        seq = db.execute("SELECT MAX(seq) FROM events").fetchone()[0] + 1
    db.execute("INSERT INTO events VALUES (?, ?, ?)", (seq, kind, body))
    db.commit()
    db.close()
    return seq


@pytest.mark.parametrize(("kind", "body", "error", "words"), [
    ("started", b'{"kind":"started","ts":1.0,', LedgerError, "malformed event JSON"),
    ("started", b"\xff\xfe not utf-8", LedgerError, "malformed event JSON"),
    ("started", b"[1, 2]", LedgerError, "malformed event"),
    ("teleported", b'{"kind":"teleported","ts":1.0}', UnknownEventError, "teleported"),
    ("started", b'{"kind":"teleported","ts":1.0}', UnknownEventError, "teleported"),
    ("started", b'{"ts":1.0,"sample":"g0.0#1"}', LedgerError, "kind"),
    ("started", b'{"kind":"started","ts":1.0,"worker":"w","epoch":0,"version":"p0-a"}',
     LedgerError, "sample"),
    ("started", b'{"kind":"started","ts":"noon","sample":"g0.0#1","worker":"w","epoch":0,'
                b'"version":"p0-a"}', LedgerError, "ts"),
    ("discarded", b'{"kind":"discarded","ts":1.0,"request":"g0.0","reason":"bored"}',
     LedgerError, "reason"),
    ("committed", b'{"kind":"closed","ts":1.0}', LedgerError, "does not match"),
])
def test_bad_rows_raise_typed_errors_naming_file_and_seq(
    ledger_copy: Path, kind: str, body: bytes, error: type[Exception], words: str
) -> None:
    good = len(_read(ledger_copy))
    seq = _insert_row(ledger_copy, kind, body)
    with Ledger(ledger_copy, readonly=True) as ledger:
        it = ledger.events()
        for _ in range(good):  # everything before the bad row still reads
            next(it)
        with pytest.raises(error) as info:
            next(it)
    msg = str(info.value)
    assert type(info.value) is error
    assert str(ledger_copy) in msg
    assert f"seq {seq}" in msg
    assert words in msg


def test_unknown_event_error_is_a_ledger_error() -> None:
    assert issubclass(UnknownEventError, LedgerError)
    with pytest.raises(UnknownEventError, match="here"):
        decode_event(b'{"kind":"nope","ts":0}', where="here")


def test_sequence_gap_is_detected(ledger_copy: Path) -> None:
    last = len(_read(ledger_copy))
    _insert_row(ledger_copy, "closed", b'{"kind":"closed","ts":1.0,"reason":"x"}', seq=last + 3)
    with pytest.raises(LedgerError) as info:
        _read(ledger_copy)
    assert str(ledger_copy) in str(info.value)
    assert f"expected {last + 1}, got {last + 3}" in str(info.value)


# -- bad files -----------------------------------------------------------------------
def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _bad_files(ledger_copy: Path) -> dict[str, Path]:
    data = ledger_copy.read_bytes()
    assert len(data) > 8192
    d = ledger_copy.parent
    foreign = d / "foreign.sqlite"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE users (name TEXT)")
    db.execute("INSERT INTO users VALUES ('ada')")
    db.commit()
    db.close()
    other_app = d / "other_app.sqlite"
    db = sqlite3.connect(other_app)
    db.execute("PRAGMA application_id=1234")
    db.execute("CREATE TABLE meta (key TEXT, value TEXT)")
    db.commit()
    db.close()
    return {
        "half": _write(d / "half.sqlite", data[: len(data) // 2]),
        "100_bytes": _write(d / "b100.sqlite", data[:100]),
        "header_only": _write(d / "b4096.sqlite", data[:4096]),
        "random": _write(d / "random.sqlite", os.urandom(len(data))),
        "text": _write(d / "text.sqlite", b"this is not a database\n" * 100),
        "foreign_sqlite": foreign,
        "other_application_id": other_app,
    }


@pytest.mark.parametrize("readonly", [True, False])
@pytest.mark.parametrize("case", [
    "half", "100_bytes", "header_only", "random", "text", "foreign_sqlite",
    "other_application_id",
])
def test_bad_files_raise_ledger_error_naming_the_file(
    ledger_copy: Path, case: str, readonly: bool
) -> None:
    path = _bad_files(ledger_copy)[case]
    before = path.read_bytes()
    # a bare sqlite3.Error would fail this test
    with pytest.raises(LedgerError) as info, Ledger(path, readonly=readonly) as ledger:
        list(ledger.events())
        ledger.payloads()
    assert str(path) in str(info.value)
    assert path.read_bytes() == before  # never "repaired" or overwritten


def test_empty_file_reads_as_an_empty_ledger(tmp_path: Path) -> None:
    """What a kill inside an older freshroll's ledger creation left (issue 23, defect 1):
    readers see no events (verify, export and resume's checks read it), and it stays as is."""
    path = _write(tmp_path / "empty.sqlite", b"")
    with Ledger(path, readonly=True) as ledger:
        assert list(ledger.events()) == [] and ledger.payloads() == {}
    assert path.read_bytes() == b""


def test_empty_file_becomes_a_ledger_when_writing(tmp_path: Path) -> None:
    """SQLite treats a 0-byte file as an empty database: a writer may create its ledger there."""
    path = _write(tmp_path / "empty.sqlite", b"")
    with Ledger(path) as ledger:
        ledger.append(ev.Closed(ts=0.0))
    assert len(_read(path)) == 1


def test_missing_path_in_readonly_mode(tmp_path: Path) -> None:
    path = tmp_path / "nope" / LEDGER_FILE
    with pytest.raises(LedgerError) as info:
        Ledger(path, readonly=True)
    assert str(path) in str(info.value)
    assert not path.parent.exists()  # reading never creates anything
    with pytest.raises(LedgerError, match="no such ledger"):
        open_ledger(tmp_path / "nope", readonly=True)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    (tmp_path / LEDGER_FILE).mkdir()
    for readonly in (True, False):
        with pytest.raises(LedgerError) as info:
            Ledger(tmp_path / LEDGER_FILE, readonly=readonly)
        assert str(tmp_path / LEDGER_FILE) in str(info.value)


def test_newer_schema_version_is_refused(ledger_copy: Path) -> None:
    db = sqlite3.connect(ledger_copy)
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    for readonly in (True, False):
        with pytest.raises(LedgerError, match="schema 99") as info:
            Ledger(ledger_copy, readonly=readonly)
        assert str(ledger_copy) in str(info.value)


def test_new_ledger_is_marked_and_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dir" / LEDGER_FILE
    Ledger(path).close()  # creates parent directories
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "1"
    db.close()


# -- export ----------------------------------------------------------------------------
def test_export_jsonl_is_one_complete_object_per_event(ledger_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with Ledger(ledger_copy, readonly=True) as ledger, open(out, "wb") as fh:
        n = ledger.export_jsonl(fh)
    decoded = _read(ledger_copy)
    lines = out.read_bytes().splitlines()
    assert n == len(lines) == len(decoded) > 100
    assert out.read_bytes().endswith(b"\n")
    kinds = set()
    for line, (seq, event) in zip(lines, decoded, strict=True):
        obj = json.loads(line)
        assert isinstance(obj, dict)
        assert next(iter(obj)) == "seq" and obj["seq"] == seq
        fields = set(type(event).__struct_fields__)
        assert set(obj) == {"seq", "kind", *fields}  # every field, defaults included
        assert obj["kind"] == type(event).__struct_config__.tag
        del obj["seq"]
        assert msgspec.convert(obj, ev.AnyEvent) == event
        assert obj == msgspec.to_builtins(event)
        kinds.add(obj["kind"])
    assert {"opened", "requested", "started", "generated", "rewarded", "ready", "leased",
            "committed", "discarded", "rejected", "worker_fenced", "closed"} <= kinds


def test_export_of_an_empty_ledger_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    Ledger(path).close()
    out = tmp_path / "o.jsonl"
    with Ledger(path, readonly=True) as ledger, open(out, "wb") as fh:
        assert ledger.export_jsonl(fh) == 0
    assert out.read_bytes() == b""


@pytest.mark.parametrize("n", [1, 3, 255, 256, 257, 700])
def test_stored_rows_are_exactly_each_events_json(tmp_path: Path, n: int) -> None:
    """A flush writes, per event, its seq, kind and ``msgspec.json.encode(event)`` as a BLOB,
    in multi-row statements of any size; payloads as BLOBs under their sample id."""
    import sqlite3

    import msgspec

    tricky = ev.Discarded(ts=1.5, request="g0.0", reason="invalid",
                          detail='line\none "quoted" \\ tab\t \u00e9 \u2028 end')
    sent: list[ev.Event] = [tricky, *_events(n - 1)]
    path = tmp_path / "l.sqlite"
    with Ledger(path, sync="off") as ledger:
        ledger.append(ev.Closed(ts=0.0))
        ledger.flush()
        for i, e in enumerate(sent):
            ledger.put_payload(f"g{i}.0#1", bytes([i % 256]) * 3)
            ledger.append(e)
        ledger.flush()
    db = sqlite3.connect(path)
    rows = db.execute("SELECT seq, kind, typeof(body), body FROM events WHERE seq > 1 "
                      "ORDER BY seq").fetchall()
    assert rows == [(i + 2, ev.KIND_OF[type(e)], "blob", msgspec.json.encode(e))
                    for i, e in enumerate(sent)]
    pays = db.execute("SELECT sample, typeof(data), data FROM payloads").fetchall()
    assert sorted(pays) == sorted((f"g{i}.0#1", "blob", bytes([i % 256]) * 3)
                                  for i in range(n))
    db.close()
    assert [e for _, e in _read(path)][1:] == sent


# -- a full disk: issue 23, defect 6 --------------------------------------------------------
# SQLite's page limit gives the very error a full disk gives (SQLITE_FULL, "database or disk
# is full"); the "disk" here gets space back when the ledger spends its reserve.
def _fill(ledger: Ledger) -> None:
    pages = ledger._db.execute("PRAGMA page_count").fetchone()[0]
    ledger._db.execute(f"PRAGMA max_page_count={pages}")


def _space_back(ledger: Ledger) -> None:
    ledger._db.execute("PRAGMA max_page_count=1000000")


@pytest.fixture
def reserve_frees_space(monkeypatch: pytest.MonkeyPatch) -> None:
    spend = Ledger._spend_reserve

    def spend_and_free(self: Ledger) -> bool:
        spent = spend(self)
        if spent:
            _space_back(self)
        return spent

    monkeypatch.setattr(Ledger, "_spend_reserve", spend_and_free)


def test_a_full_disk_is_a_storage_error_naming_the_file_and_loses_nothing(
    tmp_path: Path, reserve_frees_space: None
) -> None:
    path = tmp_path / LEDGER_FILE
    ledger = Ledger(path, reserve=1 << 16)
    reserve = tmp_path / (LEDGER_FILE + ".reserve")
    assert reserve.stat().st_size == 1 << 16
    ledger.append(_events(1)[0])
    ledger.flush()
    _fill(ledger)
    ledger.append(_events(1, start=1)[0])
    ledger.put_payload("s1", os.urandom(50_000))
    with pytest.raises(StorageError) as info:
        ledger.flush()
    assert str(info.value) == f"cannot write {path}: disk full (database or disk is full)"
    assert reserve.exists(), "the reserve is only for the closing write"
    assert len(_read(path)) == 1
    _space_back(ledger)
    ledger.flush()  # nothing was dropped: the buffered events are written now
    assert [seq for seq, _ in _read(path)] == [1, 2]
    ledger.close()
    assert not reserve.exists()


def test_the_closing_write_spends_the_reserve_on_a_full_disk(
    tmp_path: Path, reserve_frees_space: None
) -> None:
    path = tmp_path / LEDGER_FILE
    ledger = Ledger(path, reserve=1 << 16)
    ledger.append(_events(1)[0])
    ledger.flush()
    _fill(ledger)
    ledger.append(_events(1, start=1)[0])
    ledger.put_payload("s1", os.urandom(50_000))
    with pytest.raises(StorageError):
        ledger.flush()
    ledger.append(ev.Closed(ts=9.0, reason="failed"))
    ledger.flush()  # the batch ends in `closed`: the reserve makes room for it
    assert not (tmp_path / (LEDGER_FILE + ".reserve")).exists()
    events = [e for _, e in _read(path)]
    assert len(events) == 3 and events[-1] == ev.Closed(ts=9.0, reason="failed")
    ledger.close()


def test_without_a_reserve_the_closing_write_fails_as_storage_error(tmp_path: Path) -> None:
    path = tmp_path / LEDGER_FILE
    ledger = Ledger(path)
    ledger.append(_events(1)[0])
    ledger.flush()
    _fill(ledger)
    ledger.put_payload("s1", os.urandom(50_000))
    ledger.append(ev.Closed(ts=9.0))
    with pytest.raises(StorageError, match="disk full"):
        ledger.close()  # still closes the file: nothing held open
    assert len(_read(path)) == 1  # the durable prefix, open: --resume continues it
