"""freshroll.figures: what a run directory's files say, folded from its ledger: ``summary.json``
(:mod:`~freshroll.figures.summary`, with the segments of a resumed run, the overlap verdict
of an async run and the verdict on what was trained), and the ``metrics.jsonl`` rows
(:mod:`~freshroll.figures.metrics_log`). Below the runtime: ``verify``, the report and the
run's end files all read them, and they read only the ledger, its events and
:mod:`freshroll.figures.metrics`."""
