"""Fakes to drive the real :class:`~freshroll.pipeline.pipeline.Pipeline` in about a second.

The buffer, ledger, reward set, pipeline and thread adapters are real; the blocking engines
and (by default) the learner are scripted fakes, so a test can make a stage fail, hang or
return late. The engines reach the pipeline the way real ones do: through a
:class:`~freshroll.placement.adapters.ThreadEngineFactory` (worker ``w<i>`` gets ``engines[i]``;
a replacement restarts it).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from freshroll.clock import RealClock
from freshroll.config import Config, load_config
from freshroll.engines.base import Completion
from freshroll.harness.verify import Report, verify_ledger
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.results import KernelConfig
from freshroll.ledger.lineage import PolicyVersion
from freshroll.ledger.store import Ledger
from freshroll.pipeline.observers import Callbacks, Heartbeats
from freshroll.pipeline.pipeline import Pipeline, StepReport
from freshroll.placement.adapters import ThreadEngineFactory, ThreadScorer, ThreadTrainer
from freshroll.rewards.scoring import RewardSet, RewardSpec
from freshroll.rewards.tasks import make_prompts

BASE = ["run.progress=false", "task.n_prompts=64", "rollout.group_size=2",
        "rollout.batch_groups=2", "rollout.worker_batch=4", "run.steps=3"]


def ok_reward(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
    return [float(i % 2) for i in range(len(completions))]


class FakeEngine:
    """Returns fixed completions; ``behaviour(call_number)`` may raise, hang or return.
    ``can_restart=False``: an engine without ``restart`` (not
    :class:`~freshroll.engines.base.Restartable`)."""

    def __new__(cls, behaviour: Callable[[int], None] | None = None,
                can_restart: bool = True) -> FakeEngine:
        return super().__new__(cls if can_restart else _FakeEngineNoRestart)

    def __init__(self, behaviour: Callable[[int], None] | None = None,
                 can_restart: bool = True) -> None:
        self.behaviour, self.calls, self.restarts, self.loads = behaviour, 0, 0, 0

    def generate(self, prompts: Sequence[str], **kw: Any) -> list[Completion]:
        self.calls += 1
        if self.behaviour is not None:
            self.behaviour(self.calls)
        return [Completion((1, 2, 3), (4, 5), (-1.0, -1.0), "ab", "length", 0.001)
                for _ in prompts]

    def load_weights(self, state: Any) -> float:
        self.loads += 1
        return 0.0

    def restart(self) -> None:
        self.restarts += 1


class _FakeEngineNoRestart(FakeEngine):
    restart = None  # type: ignore[assignment]  # no restart: the class says so


class FakeLearner:
    """Counts steps; ``behaviour(step_call)`` may raise (e.g. NonFiniteStep)."""

    def __init__(self, behaviour: Callable[[int], None] | None = None) -> None:
        self.model = torch.nn.Linear(2, 2)
        self.settings_digest = "fake-settings"
        self.behaviour, self.calls, self.applied = behaviour, 0, 0

    def step(self, samples: Sequence[Any], step: int | None = None) -> dict[str, float]:
        self.calls += 1
        if self.behaviour is not None:
            self.behaviour(self.calls)
        self.applied += 1
        with torch.no_grad():
            self.model.weight.add_(0.01)
        return {"train_s": 0.0, "loss": 0.0}

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.model.state_dict().items()}


class LedgerChecks:
    """``verify()`` and ``events(kind)`` of a harness's ledger (``buf``, ``ledger_path``)."""

    buf: SampleBuffer
    ledger_path: Path

    def verify(self) -> Report:
        self.buf.ledger.flush()
        with Ledger(self.ledger_path, readonly=True) as ledger:
            return verify_ledger(ledger, dict(self.buf.counts))

    def events(self, kind: type) -> list[Any]:
        self.buf.ledger.flush()
        return [e for _, e in self.buf.ledger.events() if isinstance(e, kind)]


class Harness(LedgerChecks):
    """One pipeline on a ledger in ``tmp``; ``run()`` returns the error it raised (or None)."""

    def __init__(self, tmp: Path, *, overrides: Sequence[str] = (),
                 engines: Sequence[Any] | None = None, learner: Any = None,
                 rewards: Sequence[tuple[str, Callable[..., Any]]] = (("ok", ok_reward),),
                 ledger_path: Path | None = None) -> None:
        n = len(engines) if engines is not None else 1
        self.cfg: Config = load_config(None, [*BASE, f"rollout.workers={n}", *overrides])
        c = self.cfg
        self.kernel = KernelConfig(c.run.max_staleness, c.rollout.batch_groups,
                                   c.rollout.group_size, c.rollout.max_inflight_groups)
        self.ledger_path = ledger_path or tmp / "ledger.sqlite"
        self.buf = SampleBuffer.open(
            Ledger(self.ledger_path, sync="off"), self.kernel, RealClock(), run_id="t",
            initial_version=PolicyVersion.initial("fake-model"),
        )
        self.engines = list(engines) if engines is not None else [FakeEngine()]
        self.learner = learner or FakeLearner()
        prompts = make_prompts("reverse", c.task.n_prompts, 0, min_len=3, max_len=3)
        self.steps: list[StepReport] = []
        self.skips: list[tuple[int, str]] = []
        self.factory = ThreadEngineFactory(lambda name: self.engines[int(name[1:])], c.limits)
        self.scorer = ThreadScorer(RewardSet([RewardSpec(n, f) for n, f in rewards]))
        self.trainer = ThreadTrainer(self.learner, self.buf,  # type: ignore[arg-type]
                                     timeout_s=c.limits.train_timeout_s)
        self.pipe = Pipeline(
            self.buf, self.factory, self.scorer, self.trainer,
            {p.prompt_id: p for p in prompts}, [p.prompt_id for p in prompts], c,
            observers=[Callbacks(on_step=self.steps.append,
                                 on_skip=lambda step, detail: self.skips.append((step, detail))),
                       Heartbeats()],
        )

    def run(self, timeout_s: float = 60.0) -> BaseException | None:
        """Run the pipeline; a run that does not end within ``timeout_s`` fails the test."""
        async def main() -> None:
            await asyncio.wait_for(self.pipe.run(), timeout_s)

        try:
            asyncio.run(main())
        except TimeoutError as exc:
            raise AssertionError(f"the pipeline did not end within {timeout_s} s") from exc
        except BaseException as exc:
            return exc
        finally:
            self.scorer.close()
            self.trainer.close()
        return None


def blocker() -> tuple[threading.Event, Callable[[int], None]]:
    """An event and a behaviour that blocks the first call until the event is set."""
    gate = threading.Event()

    def behaviour(call: int) -> None:
        if call == 1:
            gate.wait(60)

    return gate, behaviour


def fill_ready(buf: Any, worker: str = "w0") -> None:
    """Admit what ``buf`` has room for and run every request to a reward on ``worker`` (one
    token, reward 0.5): the admission window's groups end ready to lease."""
    epoch = buf.register_worker(worker)
    for _ in range(buf.capacity()):
        buf.admit("p")
    for rid in buf.take_requests(100):
        sid = buf.start(rid, worker, epoch, buf.version)
        buf.complete(sid, tokens=1, gen_s=0.0)
        buf.reward(sid, 0.5, "r:x:0123456789abcdef0123456789abcdef")
