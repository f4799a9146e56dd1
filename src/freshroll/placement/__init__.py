"""freshroll.placement: where a run's compute runs (inline threads, worker processes, Ray
actors) and how the policy's weights move to it."""
