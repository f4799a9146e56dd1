"""The built-in environments' workflows, registered by name, and the lookup the pipeline and
the run's checks use (:func:`workflow_for`). Adding an environment: one module and one line in
:func:`register_builtins` (docs/agents.md)."""

from __future__ import annotations

from freshroll.config import Config
from freshroll.engines import episodes
from freshroll.engines.episodes import EpisodeWorkflow, WorkflowSetup, register_workflow
from freshroll.envs.calc_harness import CalcHarness
from freshroll.envs.guess import GuessGame
from freshroll.envs.openenv import OpenEnvGuess
from freshroll.envs.tool_use import ToolUse


def register_builtins() -> None:
    """Register the built-in workflows (idempotent)."""
    register_workflow("calc_tool", ToolUse)
    register_workflow("guess_game", GuessGame)
    register_workflow("calc_harness", CalcHarness)
    register_workflow("openenv_guess", OpenEnvGuess)


def setup_of(cfg: Config) -> WorkflowSetup:
    """What a workflow factory gets of the run's config."""
    return WorkflowSetup(cfg.rollout, cfg.tools, cfg.run.runtime)


def workflow_for(cfg: Config) -> EpisodeWorkflow:
    """The workflow ``rollout.workflow`` names, built-ins included, made for ``cfg``."""
    register_builtins()
    return episodes.workflow_for(cfg.rollout.workflow, setup_of(cfg))


__all__ = ["register_builtins", "setup_of", "workflow_for"]
