"""The sample buffer and its rules, pure and clock-driven: the state machine (``state.py``:
``BufferState.apply`` is the only code that changes state), its read-only queries
(``queries.py``), the results of attempts and the commands' core (``results.py``), the
buffer the pipeline drives (``buffer.py``: ``SampleBuffer``, every command a durable ledger
event first), and the rules they apply: freshness (``freshness.py``), refreshing stale
members (``refresh.py``) and over-provisioning's stop at target (``stop_at_target.py``)."""
