"""Stage 4: fault plans, the chaos harness, and what it proves (issue 8).

Modules::

    plan.py      fault plans as data (YAML, validated, unknown keys rejected)
    inject.py    the Injector: a runtime.placements.ChaosSession that fires a scenario's faults
                 at the run's hand-offs and records each as a ``fault_injected`` event
    actions.py   the fault actions (the Injector's base): what each kind does when it
                 fires, and the faults it leaves armed for the wrappers to ask
    faulty.py    the seam wrappers the Injector puts around the engine factory, the
                 engines, the scorer and the trainer
    case.py      one case (scenario x seed): its fault-free twin, the faulted run (resumed
                 after a kill or an interrupt), the checks
    runner.py    a whole plan over seeds (in worker processes with --jobs); the command
    child.py     the child process of a case whose fault kills the process (a real SIGKILL)
    checks.py    the invariants beyond ``verify`` (every planned fault recorded, no prompt
                 skipped or repeated across resumes, the admission bound after a resume,
                 injected reward failures never committed, the expected outcome)
    recovery.py  recovery time and throughput under faults, from two ledgers
    digest.py    the ledger digest of a case (run-independent: the same seed, the same digest)
    table.py     the scenario x seed table (markdown and JSON)

``freshroll chaos PLAN.yaml --seeds N`` runs every scenario of a plan on the simulated
engine in virtual time (deterministic: the same seed gives the same ledger digest), and the
scenarios marked ``real`` on the tiny real model too. The shipped library is
``chaos/library.yaml`` at the repository's root; docs/chaos.md and docs/runbook.md.

The switches of :mod:`freshroll.unsafe` remove one protection each (a deliberately broken
build), so the harness is shown to catch what it claims to.
"""
