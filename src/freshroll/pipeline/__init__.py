"""freshroll.pipeline: the live orchestrator (feeder, worker pool, rewarder, trainer,
steering in one TaskGroup), its hand-off hooks and its observer contract."""
