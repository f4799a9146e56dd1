"""The child process of a chaos case whose fault kills the process (a real SIGKILL).

``python -m freshroll.chaos.child SPEC.json``: the runner (:mod:`freshroll.chaos.runner`)
writes the spec (the scenario, the seed, the config or ``resume``, the fault indexes to skip,
the liveness horizon, the Injector to use, where to write the result). The child runs one
incarnation of the faulted run under the liveness guard with an Injector whose ``on_kill``
sends this process SIGKILL, after the fault's ``fault_injected`` event is durable: the
process ends with no cleanup at all, as ``kill -9`` would end it.

Unless killed, it writes ``{"status": finished | interrupted | liveness | stopped,
"detail": ...}`` to the result file and exits 0. The switches of :mod:`freshroll.unsafe`
come from the environment (``FRESHROLL_UNSAFE_BREAK``), as for any process.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from freshroll.chaos.plan import Scenario
from freshroll.config import validate
from freshroll.errors import FreshrollError, Interrupted


def sigkill(kind: str) -> None:
    """The Injector's ``on_kill``: a real SIGKILL of this process."""
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    from freshroll.chaos.runner import (
        Guard,
        LivenessTimeout,
        error_line,
        load_injector,
        run_in_process,
    )

    spec = json.loads(Path(argv[0]).read_text())
    scenario = Scenario.model_validate(spec["scenario"])
    make = load_injector(spec["injector"])
    session = Guard(make(scenario, int(spec["seed"]), skip=frozenset(spec["skip"]),
                         on_kill=sigkill), float(spec["horizon_s"]))
    out = Path(spec["out"])
    cfg = None if spec["resume"] else validate(spec["config"], str(argv[0]))
    status, detail = "finished", ""
    try:
        run_in_process(cfg, out, bool(spec["resume"]), session)
    except LivenessTimeout as exc:
        status, detail = "liveness", str(exc)
    except Interrupted as exc:
        status, detail = "interrupted", str(exc)
    except FreshrollError as exc:
        status, detail = "stopped", error_line(exc)
    except Exception as exc:  # a bug: the case records it
        status, detail = "stopped", f"{type(exc).__name__}: {error_line(exc)}"
    Path(spec["result"]).write_text(json.dumps({"status": status, "detail": detail}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
