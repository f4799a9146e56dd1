"""benchmarks/*.py are scripts, not a package: load one as a module by its name, or run its
``main`` in the test's process."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as the module ``NAME`` (registered once in ``sys.modules``,
    as the scripts import each other by name)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_main(name: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``benchmarks/NAME.py ARGV`` in this process: (its ``main``'s status, its stdout).

    A smoke run's own Python would import torch and transformers again (~10 CPU-s on the
    suite's machine, docs/testing.md); in the test's process they are imported already.
    What a script may change in its process is put back afterwards: the working directory,
    the environment and torch's thread count (pytest puts back the warnings filters)."""
    import torch

    cwd, env, threads = os.getcwd(), dict(os.environ), torch.get_num_threads()
    os.environ["PYTHONPATH"] = str(ROOT / "src")  # the script's own children (probes)
    os.chdir(ROOT)
    capsys.readouterr()
    try:
        status = load_script(name).main(argv)
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        torch.set_num_threads(threads)
    return status, capsys.readouterr().out
