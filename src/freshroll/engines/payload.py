"""What a rollout leaves behind for the trainer: tokens and behaviour log-probs.

Stored as MessagePack (``msgspec``) in the ledger's payload table, in the same
transaction as the ``generated`` event, so a generated sample survives a crash.
No pickle.
"""

from __future__ import annotations

import msgspec

from freshroll.engines.base import Completion


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


_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(RolloutPayload)


def encode(c: Completion, versions: list[tuple[str, int]] | None = None) -> bytes:
    return _ENC.encode(RolloutPayload(
        list(c.prompt_token_ids), list(c.token_ids), list(c.logprobs), c.text, c.finish_reason,
        list(versions or ()),
    ))


def decode(data: bytes) -> RolloutPayload:
    return _DEC.decode(data)
