"""Rebuild the trainer's exact state from a checkpoint plus the ledger.

Every ``committed`` event names the batch a step trained on (its sample ids,
whose tokens, behaviour log-probs and rewards are in the ledger) and the digest
of the weights the step produced (``PolicyVersion.weights_digest``). So a
checkpoint every ``k`` steps is enough: on resume, the newest checkpoint on the
committed chain is loaded and the steps after it are trained again, in the same
order, on the same batches. Training on CPU with a fixed thread count is
deterministic, and each replayed step's weights digest must equal the one
committed, or :class:`~freshroll.errors.LineageError` stops the run. The
replay doubles as a lineage check: the weights are proven to be the ones that
the ledger says generated later samples.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from freshroll.engines import payload as pl
from freshroll.engines.base import FINISH_LENGTH
from freshroll.errors import LineageError
from freshroll.kernel.buffer import SampleBuffer
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion, payload_mismatches, policy_step
from freshroll.ledger.store import Ledger, decode_event
from freshroll.trainer.grpo import GRPOLearner, TrainSample


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, bytes), sorted by name."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(data)  # the array's buffer as it is: no copy of the bytes
    return h.hexdigest()[:32]


def train_samples(buf: SampleBuffer, samples: Sequence[str], consumer: int) -> list[TrainSample]:
    """The trainer's view of a batch: tokens and behaviour log-probs from the payloads,
    rewards and generating steps from the ledger; groups numbered in order of appearance."""
    out: list[TrainSample] = []
    groups: dict[str, int] = {}
    for sid in samples:
        reward, step = buf.sample_info(sid)
        data = buf.payload(sid)
        if data is None:
            raise LineageError(f"payload of {sid} is missing from the ledger")
        p = pl.decode(data)
        gid = sid.partition(".")[0]
        out.append(TrainSample(
            p.prompt_ids, p.token_ids, p.logprobs, reward, groups.setdefault(gid, len(groups)),
            consumer - step, tuple((consumer - policy_step(v), n) for v, n in p.versions),
            truncated=p.finish_reason == FINISH_LENGTH,
            loss_mask=tuple((int(b), int(n)) for b, n in p.mask),
        ))
    return out


def altered_payloads(ledger: Ledger, samples: Sequence[str]) -> list[str]:
    """``samples`` whose stored payload is missing or does not have the digest its
    ``generated`` event recorded, each as "sample: why" (events without a digest: unchecked)."""
    wanted = set(samples)
    found: dict[str, str] = {}
    for seq, kind, body in ledger.rows():  # only the generated events are decoded
        if kind != "generated":
            continue
        e = decode_event(body, where=f"{ledger.path} seq {seq}", kind=kind)
        if isinstance(e, ev.Generated) and e.sample in wanted and e.payload_digest is not None:
            found[e.sample] = e.payload_digest
    recorded = {sid: found[sid] for sid in samples if sid in found}
    return [f"{sid}: payload missing" if got is None
            else f"{sid}: payload digest {got}, recorded {recorded[sid]}"
            for sid, got in payload_mismatches(recorded, ledger.payload)]


@dataclass(frozen=True)
class CommittedStep:
    version: PolicyVersion
    parent: PolicyVersion
    samples: list[str]


def committed_chain(ledger: Ledger) -> dict[int, CommittedStep]:
    """Committed steps by step number, as the durable ledger records them."""
    chain: dict[int, CommittedStep] = {}
    for _, e in ledger.events():
        if isinstance(e, ev.Committed):
            v = PolicyVersion.parse(e.version)
            chain[v.step] = CommittedStep(v, PolicyVersion.parse(e.parent), list(e.samples))
    return chain


def replay(
    learner: GRPOLearner, buf: SampleBuffer, chain: dict[int, CommittedStep], from_step: int,
    to_step: int | None = None, before_step: Callable[[int], None] | None = None,
) -> int:
    """Train steps ``from_step + 1 .. to_step`` again (default: to ``buf.version.step``);
    returns how many.

    ``before_step(step)`` runs before each step (the caller sets the settings that step
    was trained under).
    """
    assert buf.version is not None
    n = 0
    last = buf.version.step if to_step is None else to_step
    # the inputs first: a sample altered after it was recorded is named as such (a sample of
    # zero advantage changes no weight, so the digests below could not see it)
    altered = altered_payloads(buf.ledger, [s for k in range(from_step + 1, last + 1)
                                            for s in chain[k].samples])
    if altered:
        raise LineageError(
            f"replaying steps {from_step + 1}-{last}: the ledger's stored samples were altered "
            f"after they were recorded ({'; '.join(altered[:3])}"
            f"{'; ...' if len(altered) > 3 else ''}); freshroll verify names them all")
    for step in range(from_step + 1, last + 1):
        c = chain[step]
        if before_step is not None:
            before_step(step)
        learner.step(train_samples(buf, c.samples, c.parent.step), step)
        got = weights_digest(learner.model)
        if c.version.weights_digest is not None and got != c.version.weights_digest:
            raise LineageError(
                f"replaying step {step} gave weights {got}, but the ledger committed "
                f"{c.version.weights_digest}, and every sample it trained on matches its "
                "recorded digest: training is not deterministic here "
                "(different torch threads or build?); set trainer.checkpoint_every=1"
            )
        n += 1
    return n
