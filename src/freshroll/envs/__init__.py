"""Environments and tools of agentic episodes (issue 49): the built-in calculator tool and
its tool-using workflow; :mod:`freshroll.envs.registry` registers them."""
