"""freshroll: fast and trustworthy asynchronous rollouts for RL post-training."""

__version__ = "0.1.0"
