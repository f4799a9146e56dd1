"""``freshroll validate ACCEPTANCE.yaml``: repeats, gates and the decision record (issue 8).

Modules::

    acceptance.py  the ACCEPTANCE.yaml schema (validated, unknown keys rejected)
    gates.py       pure: measured values per repeat -> one criterion per gate
    record.py      the decision record (diagnosis, design, validation, recommendation),
                   markdown and JSON
    runner.py      runs the repeats (async and the synchronous baseline) and the chaos
                   cases of the recovery gate, reads their run directories, writes the record

docs/validate.md describes the file, the gates and how to read a record.
"""
