"""A reward that calls ``os._exit`` fails its call; the process (the run) goes on.

Issue 23, 5i. Each case runs in a child interpreter: on code without the guard the reward
really ends the process (exit status 0, as the run did), which must not take pytest along.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import os, sys
    from freshroll.rewards.scoring import build_reward_set
    from freshroll.rewards.tasks import Prompt

    def leaves(prompts, completions, **kw):
        os._exit(0)

    def swallows(prompts, completions, **kw):
        try:
            os._exit(0)
        except Exception:  # a reward's own broad except must not hide it
            pass
        return [1.0] * len(completions)

    if __name__ == "__main__":  # (the reward loader imports this file too)
        rewards = build_reward_set([{"fn": f"{__file__}:{sys.argv[1]}"}])
        prompts = [Prompt("p", "rev 12=", {"answer": "21"})] * 2
        scores = rewards.score_prompts(prompts, ["21", "1"], [[1], [2]])
        print("scored:", [s.error for s in scores], flush=True)
        os._exit(7)  # outside a reward call, the real os._exit
""")


def _run(tmp_path: Path, fn: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "exits.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, str(script), fn], capture_output=True, text=True,
                          timeout=120)


def test_os_exit_in_a_reward_is_a_reward_error_not_the_end_of_the_process(tmp_path: Path):
    done = _run(tmp_path, "leaves")
    assert done.returncode == 7, done.stdout + done.stderr  # before: 0, nothing scored
    assert "scored:" in done.stdout
    assert "reward_error: leaves raised ProcessExitCalled: called os._exit(0)" in done.stdout


def test_a_reward_cannot_swallow_the_guard_with_except_exception(tmp_path: Path):
    done = _run(tmp_path, "swallows")
    assert done.returncode == 7, done.stdout + done.stderr
    assert "swallows raised ProcessExitCalled" in done.stdout
