"""How much libgomp's spin-waiting costs when processes share the cores (docs/testing.md,
"Threads that wait asleep").

    python benchmarks/omp_wait.py [--procs 3] [--threads 2]

Runs ``--procs`` processes at once, each doing the same small torch work on ``--threads``
intra-op threads (3,000 forward passes of a 256-wide MLP, a short sleep every 50: the gaps
between parallel regions where a team spins), first with libgomp's default wait policy, then
with ``OMP_WAIT_POLICY=PASSIVE``, then one process alone with each; prints each process's wall
and CPU seconds and the load average.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

WORK = """
import time, torch
torch.manual_seed(0)
torch.set_num_threads({threads})
m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
x = torch.randn(16, 256)
t, c = time.perf_counter(), time.process_time()
for i in range(3000):
    m(x)
    if i % 50 == 0:
        time.sleep(0.002)
print(f"{{time.perf_counter() - t:.2f}} {{time.process_time() - c:.2f}}")
"""


def batch(procs: int, threads: int, policy: str | None) -> list[tuple[float, float]]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    code = WORK.format(threads=threads)
    ps = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                           text=True) for _ in range(procs)]
    out = []
    for p in ps:
        wall, cpu = p.communicate()[0].split()
        out.append((float(wall), float(cpu)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{os.cpu_count()} cores")
    for procs in (a.procs, 1):
        for policy in (None, "PASSIVE"):
            time.sleep(1)
            runs = batch(procs, a.threads, policy)
            cells = ", ".join(f"{w:.2f} s wall / {c:.2f} s CPU" for w, c in runs)
            print(f"{procs} process(es) x {a.threads} threads, {policy or 'default'}: {cells}")


if __name__ == "__main__":
    main()
