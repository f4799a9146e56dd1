"""The stages of the pipeline never see the ``Pipeline`` (issue 24, item 2: "stages on narrow
ports"): no module of ``src/freshroll/pipeline/`` but ``pipeline.py`` imports it, nor
anything else of ``freshroll.pipeline.pipeline``, not even under ``TYPE_CHECKING`` or
inside a function; each stage gets the :class:`~freshroll.pipeline.context.RunContext`
and its ports."""

from __future__ import annotations

import ast
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[2] / "src" / "freshroll" / "pipeline"
ORCHESTRATOR = "freshroll.pipeline.pipeline"


def reaches_the_pipeline(source: str) -> list[int]:
    """The lines of ``source`` that import the orchestrator's module or a name ``Pipeline``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == ORCHESTRATOR or node.module.startswith(ORCHESTRATOR + ".") \
                    or any(a.name == "Pipeline" for a in node.names) \
                    or (node.module == "freshroll.pipeline"
                        and any(a.name == "pipeline" for a in node.names)):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom):  # relative: from .pipeline / from . import
            names = {a.name for a in node.names}
            if node.module == "pipeline" or "Pipeline" in names \
                    or (node.module is None and "pipeline" in names):
                lines.append(node.lineno)
        elif isinstance(node, ast.Import) and any(
                a.name == ORCHESTRATOR or a.name.startswith(ORCHESTRATOR + ".")
                for a in node.names):
            lines.append(node.lineno)
    return lines


def test_no_stage_module_imports_the_pipeline() -> None:
    stages = sorted(p for p in PIPELINE.glob("*.py") if p.name != "pipeline.py")
    assert {"workers.py", "calls.py", "rewarding.py", "steering.py", "tailing.py",
            "context.py"} <= {p.name for p in stages}
    found = {p.name: n for p in stages if (n := reaches_the_pipeline(p.read_text()))}
    assert found == {}, "a stage takes the RunContext and its ports, never the Pipeline"


def test_the_check_sees_every_way_of_importing_it() -> None:
    for source in (
        "from freshroll.pipeline.pipeline import Pipeline",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from freshroll.pipeline.pipeline import Pipeline",
        "def f():\n    from freshroll.pipeline.pipeline import Published",
        "import freshroll.pipeline.pipeline",
        "from freshroll.pipeline import pipeline",
        "from freshroll import Pipeline",
        "from .pipeline import Pipeline",
        "from . import pipeline",
    ):
        assert reaches_the_pipeline(source), source
    assert reaches_the_pipeline("from freshroll.pipeline.context import RunContext") == []
    assert reaches_the_pipeline("from freshroll.pipeline.calls import Worker") == []
