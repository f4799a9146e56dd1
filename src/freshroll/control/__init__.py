"""The run's live steering, pure and clock-free: the controller (``controller.py``: settings
from a window's figures), its tail levers (``levers.py``: the admission window and the
extras), the long-tail rules (``tail.py``: group deadlines, over-provisioning) and the
failure budget (``breaker.py``: which repeating failure stops a run). Each module holds its
rule in its docstring; the pipeline applies them (``pipeline/steering.py``,
``pipeline/tails.py``, ``pipeline/context.py``)."""
