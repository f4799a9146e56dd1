"""What a rollout leaves behind for the trainer: tokens and behaviour log-probs.

Stored as MessagePack (``msgspec``) in the ledger's payload table, in the same
transaction as the ``generated`` event, so a generated sample survives a crash.
No pickle.

A multi-turn episode's payload adds its loss mask and its turns
(:mod:`freshroll.engines.trajectory`); a single-turn one is written without them, so its
bytes, and the digest its ``generated`` event records, are what they were before turns
existed. Either decodes to :class:`RolloutPayload` (absent fields: their defaults).
"""

from __future__ import annotations

import msgspec

from freshroll.engines.base import Completion


class _SingleTurn(msgspec.Struct, frozen=True, array_like=True):
    """The payload of a one-segment completion, as it was always stored."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    versions: list[tuple[str, int]] = []


class RolloutPayload(msgspec.Struct, frozen=True, array_like=True):
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    #: the tokens' policy versions as run-length ``(version, tokens)`` ranges, oldest first
    #: (the ``generated`` event's ``token_versions``); empty: all of the started version.
    #: ``logprobs[i]`` is the behaviour log-prob under the version of token ``i``'s range.
    versions: list[tuple[str, int]] = []
    #: run-length ``(trained, tokens)``: 1 a model token, 0 a tool/environment token (no
    #: loss, log-prob 0.0); empty: every token is trained
    mask: list[tuple[int, int]] = []
    #: one ``(kind, tokens, seconds, call, outcome)`` per turn (``model`` / ``env``; an env
    #: turn's tool call, its latency and outcome); empty: one model turn
    turns: list[tuple[str, int, float, str, str]] = []


_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(RolloutPayload)


def encode(c: Completion, versions: list[tuple[str, int]] | None = None) -> bytes:
    if not c.loss_mask and not c.turns:
        return _ENC.encode(_SingleTurn(
            list(c.prompt_token_ids), list(c.token_ids), list(c.logprobs), c.text,
            c.finish_reason, list(versions or ()),
        ))
    return _ENC.encode(RolloutPayload(
        list(c.prompt_token_ids), list(c.token_ids), list(c.logprobs), c.text, c.finish_reason,
        list(versions or ()), [(int(b), int(n)) for b, n in c.loss_mask],
        [(str(k), int(n), float(s), str(call), str(o)) for k, n, s, call, o in c.turns],
    ))


def decode(data: bytes) -> RolloutPayload:
    return _DEC.decode(data)


#: the first byte of a multi-turn payload (a MessagePack array of RolloutPayload's 8 fields);
#: a single-turn payload is an array of 5 or 6
_MULTI_TURN = 0x98


def env_seconds(data: bytes | None) -> float:
    """The seconds of a payload's environment (tool) turns: 0.0 for no payload and for a
    single-turn one, which is told by its first byte and never decoded."""
    if not data or data[0] != _MULTI_TURN:
        return 0.0
    return sum(t[2] for t in decode(data).turns if t[0] == "env")
