"""``freshroll bench``: stage capacities in isolation, then sync, static and adaptive runs
of one workload side by side, in one table (docs/bench.md).

capacity.py  each stage alone (generation, reward, trainer, weight transfer)
figures.py   the table's figures (E, speedup, A, worker-seconds), pure
runner.py    the plan of runs and running it
table.py     rendering: text, markdown, JSON
"""
