"""What the trainer actor (``ray.trainer: actor``) costs, measured on real runs.

Three short real runs of the same shape (sync, one worker, the tiny default or a model
directory): ``ray.trainer: actor``, ``ray.trainer: driver`` and ``run.runtime: inline``.
Prints, for the actor run, the per-step overhead of the actor (a step's wall time as the
driver waits for it vs inside the actor), the checkpoint fetch cost (``checkpoint_every``
steps), the actor's start; then the rebuild time after a kill (a fourth run whose actor is
killed as step ``--kill-at`` begins); and whether the committed weights digests of the
three runs are equal step by step.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/ray_trainer.py               # ~3 min, 2 cores
    PYTHONPATH=src .venv/bin/python benchmarks/ray_trainer.py --steps 20 --checkpoint-every 5
"""

from __future__ import annotations

import argparse
import io
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from freshroll.config import load_config
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.state import Lease
from freshroll.ledger.lineage import PolicyVersion
from freshroll.pipeline.hooks import Hooks
from freshroll.placement.ray_trainer import RayTrainer
from freshroll.runtime.placements import Components
from freshroll.runtime.run import run


class Session(Hooks):
    """Keeps the run's RayTrainer; kills its actor as step ``kill_at`` begins."""

    def __init__(self, kill_at: int = 0) -> None:
        self.hooks, self.kill_at, self.trainer = self, kill_at, None
        self.buf: SampleBuffer | None = None

    def wrap(self, parts: Components, buf: SampleBuffer) -> Components:
        self.buf = buf
        if not isinstance(parts.trainer, RayTrainer):
            return parts
        self.trainer = trainer = parts.trainer
        session = self

        class Killing:
            settings_digest = trainer.settings_digest

            async def step(self, lease: Lease) -> Any:
                assert buf.version is not None
                if buf.version.step + 1 == session.kill_at:
                    session.kill_at = 0
                    await trainer.kill()
                return await trainer.step(lease)

            async def before_commit(self, version: PolicyVersion) -> None:
                await trainer.before_commit(version)

            def weights(self) -> Any:
                return trainer.weights()

        return Components(parts.engine_factory, parts.scorer, Killing(), parts.close)


def digests(run_dir: Path) -> list[str | None]:
    db = sqlite3.connect(run_dir / "ledger.sqlite")
    rows = db.execute("SELECT body FROM events WHERE kind='committed' ORDER BY seq")
    return [PolicyVersion.parse(json.loads(r[0])["version"]).weights_digest for r in rows]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--checkpoint-every", type=int, default=3)
    ap.add_argument("--kill-at", type=int, default=5)
    ap.add_argument("--model", default=None, help="a model directory (default: tiny)")
    ap.add_argument("overrides", nargs="*", help="more config overrides (key=value)")
    args = ap.parse_args(argv)
    base = ["run.progress=false", "task.n_prompts=256", "rollout.group_size=4",
            "rollout.batch_groups=4", "rollout.workers=1", "run.max_staleness=0",
            f"run.steps={args.steps}", f"trainer.checkpoint_every={args.checkpoint_every}",
            *([f"model.path={args.model}"] if args.model else []), *args.overrides]
    root = Path(tempfile.mkdtemp(prefix="ray-trainer-"))
    out: dict[str, Any] = {}
    runs = {"actor": ["run.runtime=ray"], "driver": ["run.runtime=ray", "ray.trainer=driver"],
            "inline": ["run.runtime=inline"]}
    for name, over in runs.items():
        session = Session()
        t0 = time.perf_counter()
        res = run(load_config(None, [*base, *over]), root / name, chaos=session,
                  stream=io.StringIO(), report=False)
        out[name] = {"ok": res.ok, "wall_s": time.perf_counter() - t0,
                     "accepted_per_s": res.summary.get("accepted_rollouts_per_s")}
        if session.trainer is not None:
            t = session.trainer.timings
            n = len(t.step_wall_s)
            out[name].update(
                step_driver_ms=1e3 * sum(t.step_wall_s) / n,
                step_actor_ms=1e3 * sum(t.step_actor_s) / n,
                fetch_ms=[round(1e3 * x, 1) for x in t.fetch_s], start_s=t.start_s)
        print(name, json.dumps(out[name]), flush=True)
    session = Session(kill_at=args.kill_at)
    res = run(load_config(None, [*base, "run.runtime=ray"]), root / "kill", chaos=session,
              stream=io.StringIO(), report=False)
    assert session.trainer is not None
    t = session.trainer.timings
    out["kill"] = {"ok": res.ok, "restarts": res.summary.get("trainer_restarts"),
                   "rebuild_s": t.rebuild_s, "of_which_build_learner_s": t.rebuild_learner_s}
    print("kill", json.dumps(out["kill"]), flush=True)
    d = {name: digests(root / name) for name in (*runs, "kill")}
    print("digests: actor == driver", d["actor"] == d["driver"], "| actor == inline",
          d["actor"] == d["inline"], "| kill run == actor", d["kill"] == d["actor"])
    if d["actor"] != d["inline"]:
        pairs = zip(d["actor"], d["inline"], strict=False)
        first = next(i for i, (a, b) in enumerate(pairs) if a != b)
        print(f"  actor and inline differ from step {first + 1} on")
    print(f"runs in {root}", file=sys.stderr)


if __name__ == "__main__":
    main()
