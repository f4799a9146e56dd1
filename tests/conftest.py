"""Test-suite settings shared by every test directory."""

from __future__ import annotations

import os

from hypothesis import settings

# CI (CI=true, as .ci/run is invoked) explores a fixed, reproducible set of examples, so a
# red run is re-runnable and never a coin toss; locally every run explores new examples.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
