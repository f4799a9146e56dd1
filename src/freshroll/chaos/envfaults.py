"""Environment faults: what the chaos library does to an episode's tools (issue 49, item 6).

:class:`EnvFaults` is a base of the Injector (:mod:`freshroll.chaos.inject` decides when a
fault fires and records it). Its ``workflow`` hook (:meth:`Hooks.workflow
<freshroll.pipeline.hooks.Hooks.workflow>`) wraps the tool of a tool-using workflow (one with a
``tool``: :class:`~freshroll.envs.tool_use.ToolUse`) in a :class:`FaultyTool` before any worker
starts; a fault that fires arms it:

==============  ===========================================================================
hang_tool       the next ``count`` calls never answer: ``tools.timeout_s`` ends each
fail_tool       the next ``count`` calls raise :class:`InjectedToolError`
malformed_tool  the next ``count`` calls return, in turn: a bare string (not a ToolResult),
                a ToolResult whose text is None, one with an unknown outcome
kill_env        the environment's process is gone: every call within ``duration_s`` raises
                ``ConnectionResetError`` (what an RPC client sees of a dead server), then it
                is back
==============  ===========================================================================

and the agent of a harnessed workflow (one with an ``agent``:
:class:`~freshroll.envs.harnessed.Harnessed`) in a :class:`FaultyAgent`:

==================  =======================================================================
disconnect_gateway  the next ``count`` episodes' clients send a model call to the gateway
                    and close the connection before its answer (mid-call), then the harness
                    fails with ``ConnectionResetError``; the gateway answers nobody and keeps
                    no record of the closed episode's late call
==================  =======================================================================

Each call a fault hits is named in a continuation ``fault_injected`` record (``#<index> failed
<sample>``, the sample from :data:`~freshroll.envs.tool_use.EPISODE_REQUEST`): the chaos check
``tool_failures`` (:mod:`freshroll.chaos.checks`) wants each such sample never committed and
discarded ``tool_error``: a typed reason, never a reward of 0, never a hang. The faults are
injected at the tool seam, in the run's process, around the real workflow and engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from freshroll.chaos.plan import Fault
from freshroll.envs.calc import Tool, ToolResult
from freshroll.envs.tool_use import EPISODE_REQUEST
from freshroll.ledger import events as ev

if TYPE_CHECKING:
    from freshroll.chaos.faulty import FaultyEngine, Gen
    from freshroll.engines.episodes import EpisodeWorkflow
    from freshroll.envs.harnessed import Agent
    from freshroll.kernel.buffer import SampleBuffer


class InjectedToolError(RuntimeError):
    """A tool call the chaos library made fail (``fail_tool``)."""


@dataclass
class _ToolFault:
    index: int
    kind: str  # hang | fail | malformed | lost
    left: int = 0  # calls still to hit (hang, fail, malformed)
    until: float = 0.0  # lost: calls before this time of the run's clock fail
    turn: int = 0  # malformed: which malformation next


#: what a fault kind arms, and how a call it hits reads in the ledger
_ARMS = {"hang_tool": "hang", "fail_tool": "fail", "malformed_tool": "malformed",
         "kill_env": "lost", "disconnect_gateway": "disconnect"}


class EnvFaults:
    """The environment faults of one scenario's run (module doc); the Injector's base."""

    buf: SampleBuffer | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tool_faults: list[_ToolFault] = []
        self.tools: list[FaultyTool] = []  # the tools wrapped (one per workflow)

    # -- the hook ----------------------------------------------------------------------------
    def workflow(self, workflow: EpisodeWorkflow) -> EpisodeWorkflow:
        """Wrap the workflow's tool or its harness's agent (a workflow with neither is
        returned as it is)."""
        tool = getattr(workflow, "tool", None)
        if tool is not None and not isinstance(tool, FaultyTool):
            wrapped = FaultyTool(self, tool)
            workflow.tool = wrapped  # type: ignore[attr-defined]  # ToolUse.tool, checked above
            self.tools.append(wrapped)
        agent = getattr(workflow, "agent", None)
        if agent is not None and not isinstance(agent, FaultyAgent):
            workflow.agent = FaultyAgent(self, agent)  # type: ignore[attr-defined]  # Harnessed
        return workflow

    # -- the actions -------------------------------------------------------------------------
    def _tool(self, i: int, f: Fault, ctx: FaultyEngine | None = None,
              gen: Gen | None = None) -> tuple[str, str]:
        kind = _ARMS[f.kind]
        if kind == "lost":
            self._tool_faults.append(_ToolFault(i, kind, until=self._clock() + f.duration_s))
            return "tool", (f"the environment's process is gone for {f.duration_s:g} s: every "
                            "tool call fails with a lost connection")
        self._tool_faults.append(_ToolFault(i, kind, left=f.count))
        if kind == "disconnect":
            return "gateway", (f"the next {f.count} episode(s)' clients disconnect from the "
                               "gateway mid-call")
        what = {"hang": "never answer", "fail": "raise",
                "malformed": "return malformed output"}[kind]
        return "tool", f"the next {f.count} tool call(s) {what}"

    # every environment fault is armed the same way (``_ARMS`` says which)
    _do_hang_tool = _do_fail_tool = _do_malformed_tool = _do_kill_env = _tool
    _do_disconnect_gateway = _tool

    # -- the tool's queries ------------------------------------------------------------------
    def _clock(self) -> float:
        return self.buf.clock.now() if self.buf is not None else 0.0

    def tool_fault(self, agent: bool = False) -> _ToolFault | None:
        """The armed fault the next tool call (``agent``: the next harness episode) hits,
        one hit counted, or None."""
        now = self._clock()
        for t in self._tool_faults:
            if (t.kind == "disconnect") != agent:
                continue
            if t.kind == "lost" and now < t.until:
                return t
            if t.kind != "lost" and t.left > 0:
                t.left -= 1
                return t
        return None

    def tool_hit(self, t: _ToolFault, sample: str | None) -> None:
        """Name the sample a fault's call belongs to (the ``tool_failures`` check reads it)."""
        buf = self.buf
        if sample is None or buf is None or buf.closed:
            return
        kind = next(k for k, v in _ARMS.items() if v == t.kind)
        buf.record(ev.FaultInjected(ts=buf.clock.now(), fault=kind,
                                    target="gateway" if t.kind == "disconnect" else "tool",
                                    detail=f"#{t.index} failed {sample}"))


class FaultyTool:
    """A :class:`~freshroll.envs.calc.Tool` with the faults :class:`EnvFaults` armed."""

    def __init__(self, ctl: EnvFaults, inner: Tool) -> None:
        self.ctl, self.inner = ctl, inner
        self.name = inner.name

    async def __call__(self, arg: str) -> ToolResult:
        t = self.ctl.tool_fault()
        if t is None:
            return await self.inner(arg)
        req = EPISODE_REQUEST.get(None)
        self.ctl.tool_hit(t, req.sample if req is not None else None)
        tag = f"chaos fault #{t.index}"
        if t.kind == "hang":
            await asyncio.Event().wait()  # never set: the workflow's timeout cancels it
        if t.kind == "lost":
            raise ConnectionResetError(f"{tag} kill_env: the environment's process is gone")
        if t.kind == "malformed":
            t.turn += 1
            bad: ToolResult = _malformed(t.turn - 1)  # what a broken tool hands back
            return bad
        raise InjectedToolError(f"{tag} fail_tool")


class FaultyAgent:
    """A harness's agent (:data:`~freshroll.envs.harnessed.Agent`) with the
    ``disconnect_gateway`` faults :class:`EnvFaults` armed."""

    def __init__(self, ctl: EnvFaults, inner: Agent) -> None:
        self.ctl, self.inner = ctl, inner

    async def __call__(self, url: str, prompt: str, episode: str) -> object:
        t = self.ctl.tool_fault(agent=True)
        if t is None:
            return await self.inner(url, prompt, episode)
        self.ctl.tool_hit(t, episode)
        await disconnect_mid_call(url, prompt, episode)
        raise ConnectionResetError(f"chaos fault #{t.index} disconnect_gateway: the client "
                                   "disconnected mid-call")


async def disconnect_mid_call(url: str, prompt: str, episode: str) -> None:
    """Send one ``/v1/completions`` call of ``episode`` to the gateway at ``url`` and close the
    connection before its answer (a client that goes away mid-call)."""
    parts = urlsplit(url)
    body = json.dumps({"model": "freshroll", "prompt": prompt, "max_tokens": 4,
                       "episode": episode}).encode()
    head = (f"POST {parts.path.rstrip('/')}/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    _reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(head.encode() + body)
        await writer.drain()
    finally:
        writer.close()  # gone before the answer
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _malformed(turn: int) -> Any:
    """A malformed answer, in turn: not a ToolResult, text None, an unknown outcome."""
    return ("=12|", ToolResult(None, "ok"), ToolResult("=12|", "fine"))[turn % 3]  # type: ignore[arg-type]  # malformed on purpose


__all__ = ["EnvFaults", "FaultyAgent", "FaultyTool", "InjectedToolError",
           "disconnect_mid_call"]
