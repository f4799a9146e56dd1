"""The durable ledger: its event records (events.py), the ids and versions they carry
(lineage.py), the append-only SQLite store (store.py) and its file (file.py)."""
