"""Says on stderr when a run has stopped learning from its rewards.

A GRPO advantage is a sample's reward minus its group's mean, over the group's std: where
every group of a step scored its members alike (``frac_reward_zero_std`` 1), every advantage
is 0 and the step teaches nothing. A policy that learned to end every completion at once,
scored 0 by every reward, stays there: it gets no gradient to leave (seen in three sessions at
1.06M parameters, 16 new tokens, lr 1e-3: docs/benchmarks.md, "Learning at 1.06M
parameters / 16 new tokens"). Its steps then get cheap, so its rate rises while it learns
nothing. The metrics row's ``no_signal_steps`` counts the
stretch (:func:`freshroll.figures.metrics.no_signal_steps`); :class:`NoSignal` reads it and says
so once per stretch, when it reaches ``monitor.no_signal_steps``, and when it ends.
"""

from __future__ import annotations

from typing import TextIO

from freshroll.pipeline.observers import Observer, Row


class NoSignal(Observer):
    """One warning when ``threshold`` consecutive steps had no learning signal, one line when
    the signal comes back; nothing for the rows a resumed run catches up on."""

    def __init__(self, threshold: int, stream: TextIO) -> None:
        self.threshold, self.stream = threshold, stream
        self.warned = False  # said for the stretch now running

    def on_row(self, row: Row, live: bool) -> None:
        streak = row.get("no_signal_steps")
        if not isinstance(streak, int):  # a step with no scored group: no news
            return
        step = row["step"]
        if streak >= self.threshold and not self.warned:
            self.warned = True
            if live:
                reward = row.get("reward_mean")
                said = f" (reward {reward:.3f})" if isinstance(reward, int | float) else ""
                self._say(
                    f"warning: no learning signal for {streak} steps (steps "
                    f"{step - streak + 1}-{step}): in every group every completion scored "
                    f"the same{said}, so every advantage is 0 and no gradient flows; a policy "
                    "there rarely leaves by itself. Look at its completions (freshroll "
                    "export-samples), the rewards, rollout.temperature and trainer.lr "
                    "(monitor.no_signal_steps sets this warning's patience)")
        elif streak == 0 and self.warned:
            self.warned = False
            if live:
                self._say(f"learning signal back at step {step}")

    def _say(self, line: str) -> None:
        tty = self.stream.isatty()  # a progress line drawn in place keeps its own line
        self.stream.write(("\n" if tty else "") + line + "\n")
        self.stream.flush()


__all__ = ["NoSignal"]
