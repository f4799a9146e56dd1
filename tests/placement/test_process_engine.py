"""``ProcessEngine``: an HFEngine in a real spawned child process (no fakes).

Each child imports torch and transformers (seconds), so the engines are shared where a test
leaves them usable, and the slow tests are marked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from freshroll.config import validate
from freshroll.engines.base import Completion
from freshroll.engines.hf import HFEngine
from freshroll.engines.tiny import build_tiny, save_tiny
from freshroll.errors import WorkerLost, WorkerTimeout
from freshroll.placement.adapters import KillableThreadEngine, adapt
from freshroll.placement.process_engine import (
    ProcessEngine,
    completion_from_json,
    completion_to_json,
)
from freshroll.placement.shm_weights import SlotHandle, WeightChannel

PROMPTS = ["rev 123=", "abc", "q", "rev 9876="]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("proc") / "tiny", seed=0)


@pytest.fixture(scope="module")
def channel(model_dir: Path) -> Iterator[WeightChannel]:
    ch = WeightChannel.create(HFEngine.from_pretrained(model_dir).model.state_dict(),
                              wait_s=10.0)
    yield ch
    ch.close()



@pytest.fixture(scope="module")
def engine(model_dir: Path, channel: WeightChannel) -> Iterator[ProcessEngine]:
    e = ProcessEngine(model_dir, channel=channel, torch_threads=1, start_timeout_s=120.0)
    e.wait_ready()
    yield e
    e.stop()


def test_a_completion_round_trips_through_json_exactly():
    c = Completion((1, 2), (3, 4, 5), (-0.1, -1e-300, -123.456789012345678), "héllo\n\"x\"",
                   "length", 0.0123456789)
    assert completion_from_json(json.loads(json.dumps(completion_to_json(c)))) == c


def test_generation_in_the_child_equals_the_engine_in_this_process(
        engine: ProcessEngine, model_dir: Path, one_thread: None):
    ref = HFEngine.from_pretrained(model_dir)
    for seed in (0, 7):
        got = engine.generate(PROMPTS, max_new_tokens=6, temperature=1.0, seed=seed)
        want = ref.generate(PROMPTS, max_new_tokens=6, temperature=1.0, seed=seed)
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
        assert [c.logprobs for c in got] == [c.logprobs for c in want]  # bit for bit
        assert [(c.text, c.finish_reason, c.prompt_token_ids) for c in got] == \
               [(c.text, c.finish_reason, c.prompt_token_ids) for c in want]
        assert all(c.gen_s > 0 for c in got)


def test_trls_sampling_knobs_reach_the_childs_engine(
        engine: ProcessEngine, model_dir: Path, one_thread: None):
    """rollout.top_k / min_p / repetition_penalty travel in the generate message (issue 48)."""
    ref = HFEngine.from_pretrained(model_dir)
    knobs = {"top_k": 1, "repetition_penalty": 1.5}
    got = engine.generate(PROMPTS, max_new_tokens=6, temperature=1.0, seed=3, **knobs)
    want = ref.generate(PROMPTS, max_new_tokens=6, temperature=1.0, seed=3, **knobs)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert all(lp == 0.0 for c in got for lp in c.logprobs)  # k=1: a point mass


def test_the_child_reports_its_thread_budget(engine: ProcessEngine):
    assert engine.child_threads == 1  # the budget, not the machine's default
    assert engine.threads() == 1


def test_a_call_runs_at_its_calling_threads_count(model_dir: Path):
    from freshroll.placement.adapters import tuned
    from freshroll.stage_threads import ModeThreads, StageThreads

    stage = ModeThreads(shared=1, sync=StageThreads("generate", many=2, warmup=1))
    e = ProcessEngine(model_dir, torch_threads=1, start_timeout_s=120.0, follow_threads=True)
    seen: list[tuple[int, int]] = []

    def calls() -> None:  # the adapter's thread: tuned() sets its count, the child follows
        for mode in ("sync", "sync", "async"):
            stage.set_mode(mode)
            with tuned(stage, rows=1):
                e.generate(PROMPTS[:1], max_new_tokens=2, seed=0)
                seen.append((torch.get_num_threads(), e.threads()))

    try:
        e.wait_ready()
        t = threading.Thread(target=calls)
        t.start()
        t.join()
        assert seen == [(2, 2), (1, 1), (1, 1)]  # warm-up at 2, a trial at 1, async's share
    finally:
        e.stop()


def test_loaded_weights_come_from_the_published_slot(
        engine: ProcessEngine, channel: WeightChannel, model_dir: Path, one_thread: None):
    other, _ = build_tiny(5)
    handle = channel.write(other.state_dict())
    secs = engine.load_weights(handle)
    assert 0 < secs < 60 and channel.readers(handle.slot) == 0
    ref = HFEngine.from_pretrained(model_dir)
    ref.load_weights(other.state_dict())
    got = engine.generate(PROMPTS, max_new_tokens=5, seed=3)
    want = ref.generate(PROMPTS, max_new_tokens=5, seed=3)
    assert [c.logprobs for c in got] == [c.logprobs for c in want]
    with pytest.raises(TypeError, match="SlotHandle"):
        engine.load_weights({"a": torch.zeros(1)})


def test_an_engine_error_fails_the_call_not_the_worker(engine: ProcessEngine):
    with pytest.raises(RuntimeError, match="ConfigError: max_new_tokens must be >= 1"):
        engine.generate(PROMPTS, max_new_tokens=0)
    assert engine.generate(PROMPTS[:1], max_new_tokens=2)[0].tokens >= 1


def _ignores(pid: int, sig: int) -> bool:
    """Whether process ``pid`` ignores ``sig`` (its SigIgn mask in /proc)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    return bool(mask >> (sig - 1) & 1)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_the_child_leaves_sigint_to_the_driver(engine: ProcessEngine):
    """Issue 48, item 4: Ctrl-C reaches the whole process group; a worker child that took it
    printed a KeyboardInterrupt traceback above the driver's clean "interrupted" line."""
    assert engine.pid is not None
    assert _ignores(engine.pid, signal.SIGINT)
    os.kill(engine.pid, signal.SIGINT)
    assert engine.generate(PROMPTS[:1], max_new_tokens=2)[0].tokens >= 1  # alive, answering
    assert engine.alive()


def test_the_proxy_is_adapted_as_a_killable_engine(engine: ProcessEngine):
    assert isinstance(adapt(engine, "w0", validate({}, "t").limits), KillableThreadEngine)  # type: ignore[arg-type]


def test_kill_makes_calls_fail_as_lost_until_restart(model_dir: Path, channel: WeightChannel):
    e = ProcessEngine(model_dir, channel=channel, torch_threads=1, start_timeout_s=120.0)
    try:
        e.wait_ready()
        pid = e.pid
        e.kill()
        assert not e.alive()
        with pytest.raises(WorkerLost, match="lost"):
            e.generate(PROMPTS, max_new_tokens=2)
        with pytest.raises(WorkerLost):  # and it stays unusable
            e.generate(PROMPTS, max_new_tokens=2)
        e.restart()
        assert e.pid != pid and e.child_threads == 1
        assert len(e.generate(PROMPTS, max_new_tokens=2)) == len(PROMPTS)
        # a stopped (alive, silent) child times out, on generate and on a load
        assert e.pid is not None
        os.kill(e.pid, signal.SIGSTOP)
        e.generate_timeout_s = e.weights_timeout_s = 0.5
        t0 = time.monotonic()
        with pytest.raises(WorkerTimeout, match=r"did not answer generate within 0\.5 s"):
            e.generate(PROMPTS, max_new_tokens=2)
        assert time.monotonic() - t0 < 5
        with pytest.raises(WorkerLost, match="unusable"):
            e.generate(PROMPTS, max_new_tokens=2)
        e.restart()
        h = channel.write(build_tiny(6)[0].state_dict())
        assert e.pid is not None
        os.kill(e.pid, signal.SIGSTOP)
        with pytest.raises(WorkerTimeout, match="load_weights"):
            e.load_weights(h)
        assert channel.readers(h.slot) == 0  # released, and the child that held it is dead
        assert not e.alive()
    finally:
        e.stop()
    assert not e.alive()


def test_a_stale_handle_is_refused_before_it_reaches_the_child(
        engine: ProcessEngine, channel: WeightChannel):
    old = channel.write(build_tiny(1)[0].state_dict())
    channel.write(build_tiny(2)[0].state_dict())
    channel.write(build_tiny(3)[0].state_dict())
    with pytest.raises(WorkerTimeout, match="no longer holds"):
        engine.load_weights(old)
    assert isinstance(old, SlotHandle) and channel.readers(old.slot) == 0


DRIVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from freshroll.engines.hf import HFEngine
    from freshroll.placement.process_engine import ProcessEngine
    from freshroll.placement.shm_weights import WeightChannel
    if __name__ == "__main__":
        path = Path(sys.argv[1])
        ch = WeightChannel.create(HFEngine.from_pretrained(path).model.state_dict(), 10.0)
        e = ProcessEngine(path, channel=ch, start_timeout_s=120.0)
        e.wait_ready()
        print(e.pid, ch.path, flush=True)
        time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_child_exits_and_the_segment_goes_when_the_driver_is_sigkilled(
        model_dir: Path, tmp_path: Path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen([sys.executable, str(script), str(model_dir)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pid_s, shm = proc.stdout.readline().split()
        child = int(pid_s)
        assert _alive(child) and Path(shm).exists()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 15
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the worker outlived its SIGKILLed driver"
        assert not Path(shm).exists(), "the weight segment leaked in /dev/shm"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_prestarted_forkserver_is_waited_for_once():
    """A run that may fork workers starts their forkserver at its start; the thread probe
    waits once for its imports (a child forked from it runs), later waits are no-ops."""
    from freshroll.placement import process_engine as pe

    pe.workers_ready(60.0)  # whatever an earlier run of this process left pre-started
    assert pe.workers_ready(60.0) is None  # nothing pre-started: no wait
    pe.prestart_workers()
    assert pe.workers_ready(60.0) is True
    assert pe.workers_ready(60.0) is None


def test_the_command_line_starts_the_workers_forkserver_before_it_imports_torch(
        tmp_path: Path) -> None:
    """The forkserver's imports (torch, transformers) run beside the command's own, not after
    them: ``freshroll run`` of an async config starts it as soon as the config is checked,
    with torch not yet imported in the driver (freshroll.placement.forkserver)."""
    from freshroll.procs import available_cores

    if available_cores() < 2:
        pytest.skip("one core: the embedded default's workers are not processes")
    code = (
        "import sys\n"
        "import freshroll.placement.forkserver as fs\n"
        "def start():\n"
        "    print('forkserver started; torch imported:', 'torch' in sys.modules)\n"
        "    raise SystemExit(7)\n"
        "fs.start = start\n"
        "from freshroll.cli import main\n"
        f"main(['run', '--out', {str(tmp_path / 'r')!r}])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 7, out.stdout + out.stderr
    assert "forkserver started; torch imported: False" in out.stdout
