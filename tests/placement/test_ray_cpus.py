"""The private Ray instance's logical CPUs cover every actor a run may declare at once."""

from __future__ import annotations

from freshroll.config import load_config
from freshroll.runtime.placements import ray_cpus


def _cpus(*over: str) -> int:
    return ray_cpus(load_config(None, ["run.runtime=ray", *over]))


def test_the_sum_of_the_declared_resources_rounded_up():
    # 2 workers x 1 + the trainer actor 1 + 1 reward actor x 0.5 = 3.5 -> 4
    assert _cpus("rollout.workers=2", "ray.trainer=actor") == 4
    # the controller may add workers up to max_workers: 4 x 1.5 + 2 + 3 x 0.5 = 9.5 -> 10
    assert _cpus("rollout.workers=2", "control.max_workers=4", "ray.worker_cpus=1.5",
                 "ray.trainer=actor", "ray.trainer_cpus=2", "ray.reward_actors=3") == 10
    # ray.trainer auto on a private instance trains in the driver: no trainer actor
    assert _cpus("rollout.workers=2") == 3


def test_a_driver_trainer_declares_nothing_and_two_is_the_floor():
    assert _cpus("rollout.workers=1", "ray.trainer=driver", "ray.reward_actors=0") == 2
    assert _cpus("rollout.workers=3", "ray.trainer=driver", "ray.reward_actors=0") == 3


def test_the_trainer_is_an_actor_on_a_cluster_or_with_gpus_else_in_the_driver():
    from freshroll.placement.placement import plan, ray_trainer, trainer_place

    def place(*over: str) -> str:
        return trainer_place(load_config(None, ["run.runtime=ray", *over]))[0]

    assert place() == "driver"  # a private instance: the actor's round trip buys nothing
    assert place("run.ray_address=10.0.0.5:6379") == "actor"
    assert place("ray.trainer_gpus=1") == "actor"
    assert place("ray.trainer=actor") == "actor"
    assert place("ray.trainer=driver", "run.ray_address=10.0.0.5:6379") == "driver"
    assert place("ray.trainer=driver", "ray.trainer_gpus=1") == "driver"
    # the start line says where and why; summary.json's placement keeps where
    placed = plan(load_config(None, ["run.runtime=ray"]))
    assert placed.describe().endswith("; the trainer in the driver (auto: a private Ray "
                                      "instance, where an actor's round trip buys nothing)")
    assert placed.as_dict()["trainer"] == "driver"
    assert plan(load_config(None, ["run.runtime=process"])).as_dict()["trainer"] is None
    # a vLLM run under Ray trains in the driver without the trainer seam: no place, no CPUs
    vllm = load_config(None, ["run.runtime=ray", "rollout.engine=vllm", "ray.trainer=actor"])
    assert ray_trainer(vllm, "ray") is None and ray_trainer(vllm, "process") is None


def test_a_reward_actors_module_imports_no_torch():
    # a reward actor's process imports freshroll.placement.ray_scorer and scores text: torch
    # would cost it seconds of CPU at every start (and each Ray run starts one by default)
    import subprocess
    import sys

    code = ("import sys, freshroll.placement.ray_scorer, freshroll.rewards.scoring; "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "False", done.stderr
