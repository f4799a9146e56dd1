"""A user's prompts from a dataset: JSONL/JSON, Parquet, CSV, or a ``datasets`` directory.

Rows are read with Hugging Face ``datasets`` (``load_dataset`` for files,
``load_from_disk`` for a directory written by ``Dataset.save_to_disk``) and become
:class:`~freshroll.rewards.tasks.Prompt` records, one per row, in dataset order.

Guarantees:

* Every column of a row is kept, by its own name and with its own type, in
  ``Prompt.columns``; rewards receive them as keyword lists (see
  :mod:`freshroll.rewards.scoring`). Only the prompt column has a required form.
* The prompt column holds, in every row alike, either strings or chat messages
  (``[{"role": str, "content": str}, ...]``, TRL's conversational format). Chat
  prompts are rendered to the engine's text by a ``render`` function (see
  :func:`chat_renderer`); message keys whose value is None (``datasets`` fills
  absent struct fields with None) are dropped first.
* ``answer_field`` names the column that freshroll's built-in rewards read as
  ``answer``: with the default ``"answer"`` the column is optional; any other name
  must exist, and is then also given to rewards as ``answer`` (a dataset that has
  both that column and its own ``answer`` column is refused as ambiguous).
* Ids are the ``id_field`` column's values (strings or ints, unique) or
  ``"{file stem}-{row index}"``.
* :func:`check_vocabulary` refuses prompts that the tokenizer would encode to its
  unknown token (``<unk>``), naming how many prompts, the first one and the characters.
* :func:`check_round_trip` refuses a tokenizer that does not give the prompts' text back
  (``decode(encode(p)) != p``, special tokens kept on both sides, leading spaces and those
  next to a special token not counted, on at most
  :data:`ROUND_TRIP_SAMPLE` prompts spread over the set): a tokenizer that drops spaces or
  characters silently would train on other prompts than the user's.
* :func:`check_prompt_lengths` refuses prompts longer than the model's context (its
  ``max_position_embeddings``, or ``vllm.max_model_len``) before a run starts, naming how
  many prompts, the longest one and the limit.
* Every bad input raises :class:`~freshroll.errors.ConfigError` naming the file,
  column or row at fault.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from freshroll.errors import ConfigError
from freshroll.rewards.tasks import Message, Prompt

#: Renders a chat prompt's messages to the text the engine tokenizes.
Render = Callable[[Sequence[Message]], str]

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_MAX_SHOWN = 5  # characters / rows named in an error


def load_prompts(
    path: str | Path,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    id_field: str | None = None,
    *,
    split: str | None = None,
    render: Render | None = None,
) -> list[Prompt]:
    """Prompts from a local dataset file or ``save_to_disk`` directory, one per row.

    ``split`` chooses the split of a saved ``DatasetDict`` (default: ``train``, or its
    only split). ``render`` turns chat messages into text; without one, a dataset of
    chat prompts is refused.
    """
    path = Path(path)
    rows = _read_rows(path, split)
    columns = sorted(rows[0])
    for column in (prompt_field, id_field):
        if column is not None and column not in rows[0]:
            raise missing_column(path, column, columns)
    alias = _answer_alias(path, answer_field, columns)
    chat = _is_chat(rows[0][prompt_field])
    prompts = []
    for i, row in enumerate(rows):
        where = f"prompt file {path}, row {i}"
        text, messages = _prompt_of(where, row[prompt_field], prompt_field, chat, render)
        values = dict(row)
        if alias is not None:
            values["answer"] = row[alias]
        prompts.append(Prompt(_id_of(where, path, i, row, id_field), text, values, messages))
    _check_unique_ids(path, prompts)
    return prompts


def chat_renderer(tokenizer: Any, *, model: str, plain_fallback: bool = False) -> Render:
    """Render chat prompts with ``tokenizer``'s chat template, as TRL does.

    The template is applied with ``add_generation_prompt=True``, or, when the last
    message is the assistant's, ``continue_final_message=True`` (the policy continues
    it). A BOS the template writes is dropped when the tokenizer adds one on encoding, so
    the engine's prompt holds exactly one. A tokenizer without a chat template is refused
    (naming ``model``), unless ``plain_fallback``: then the text is the messages' contents
    joined by one space, without role markers (freshroll's choice for its embedded tiny model, whose
    character vocabulary could not spell a template's markers anyway).
    """
    if getattr(tokenizer, "chat_template", None):
        bos = _added_bos(tokenizer)

        def render(messages: Sequence[Message]) -> str:
            last_is_assistant = messages[-1]["role"] == "assistant"
            text = str(tokenizer.apply_chat_template(
                [dict(m) for m in messages], tokenize=False,
                add_generation_prompt=not last_is_assistant,
                continue_final_message=last_is_assistant,
            ))
            # the engines encode prompts with the tokenizer's special tokens: a template that
            # writes the BOS itself would otherwise start with two (TRL encodes templated
            # prompts with add_special_tokens=False for the same reason)
            return text.removeprefix(bos) if bos else text

        return render
    if plain_fallback:
        return plain_chat_text

    def refuse(messages: Sequence[Message]) -> str:
        raise ConfigError(
            f"chat-format prompts need a chat template, and the tokenizer of {model} has none; "
            "add a 'chat_template' to its tokenizer_config.json, or give prompts as strings"
        )

    return refuse


def _added_bos(tokenizer: Any) -> str:
    """The BOS token text that encoding adds by itself, or "" if it adds none."""
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None or not getattr(tokenizer, "bos_token", None):
        return ""
    try:
        ids = tokenizer("x").input_ids
    except Exception:  # a tokenizer that cannot encode here: leave the text as rendered
        return ""
    return str(tokenizer.bos_token) if ids and ids[0] == bos_id else ""


def plain_chat_text(messages: Sequence[Message]) -> str:
    """The fallback rendering: the contents joined by one space (no roles, no markers)."""
    return " ".join(str(m["content"]) for m in messages)


def check_vocabulary(prompts: Sequence[Prompt], tokenizer: Any, *, model: str) -> None:
    """Refuse prompts whose text would encode to the tokenizer's unknown token.

    A tokenizer without an unknown token (byte-level BPE) accepts every text.
    """
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not prompts:
        return
    ids = tokenizer([p.text for p in prompts], add_special_tokens=False)["input_ids"]
    bad = [i for i, row in enumerate(ids) if unk in row]
    if not bad:
        return
    first = prompts[bad[0]]
    chars = _unknown_chars(tokenizer, first.text, unk)
    shown = f": {', '.join(repr(c) for c in chars[:_MAX_SHOWN])}" if chars else ""
    raise ConfigError(
        f"{len(bad)} of {len(prompts)} prompts hold characters outside the vocabulary of the "
        f"tokenizer of {model} (they would become {tokenizer.unk_token!r}); first: prompt "
        f"{first.prompt_id!r} {first.text[:80]!r}{shown}. Use a model whose tokenizer covers "
        "the text, or clean the prompts"
    )


#: The most prompts :func:`check_round_trip` decodes (evenly spread over a bigger set).
ROUND_TRIP_SAMPLE = 1000


def check_round_trip(prompts: Sequence[Prompt], tokenizer: Any, *, model: str) -> None:
    """Refuse a tokenizer that does not give the prompts' text back when decoding its encoding.

    Why: transformers picks the tokenizer class by the model's ``model_type`` (a Qwen2 model
    saved with a character tokenizer reloads as ``Qwen2Tokenizer``), and such a class can drop
    spaces and characters without any ``<unk>``, so :func:`check_vocabulary` sees nothing and
    the run trains on other prompts. Both sides keep special tokens (no BOS/EOS added on
    encoding, none skipped on decoding, no space clean-up), so a chat template's markers pass;
    spaces a SentencePiece tokenizer legitimately moves are not counted (:func:`_comparable`).
    """
    sample = _spread(prompts, ROUND_TRIP_SAMPLE)
    if not sample:
        return
    ids = tokenizer([p.text for p in sample], add_special_tokens=False)["input_ids"]
    back = [str(tokenizer.decode(row, skip_special_tokens=False,
                                 clean_up_tokenization_spaces=False)) for row in ids]
    same = _comparable(tokenizer)
    bad = [i for i, (p, text) in enumerate(zip(sample, back, strict=True))
           if text != p.text and same(text) != same(p.text)]
    if not bad:
        return
    first = sample[bad[0]]
    raise ConfigError(
        f"the tokenizer of {model} ({type(tokenizer).__name__}) changes the prompts' text: "
        f"{len(bad)} of {len(sample)} prompts checked do not decode back to themselves; first: "
        f"prompt {first.prompt_id!r} {first.text[:80]!r} becomes {back[bad[0]][:80]!r}. "
        "transformers chooses the tokenizer class by the model's model_type: save the "
        "tokenizer with a model whose type loads it as it was saved, or use one that covers "
        "the text"
    )


def _comparable(tokenizer: Any) -> Callable[[str], str]:
    """The text as :func:`check_round_trip` compares it: without the spaces that a
    SentencePiece-style tokenizer legitimately moves, its leading ones (the dummy prefix it
    strips when decoding) and those next to a special or added token (a chat template's
    markers: ``</s>[INST]`` may decode as ``</s> [INST]``). Every other space must survive."""
    specials = {str(t) for t in getattr(tokenizer, "all_special_tokens", None) or ()}
    with contextlib.suppress(Exception):  # a tokenizer without added tokens
        specials |= {str(t) for t in tokenizer.get_added_vocab()}
    names = sorted((t for t in specials if t.strip()), key=len, reverse=True)  # not "\t"
    if not names:
        return str.lstrip
    around = re.compile(r"\s*(" + "|".join(re.escape(t) for t in names) + r")\s*")
    return lambda text: around.sub(r"\1", text).lstrip()


def _spread(prompts: Sequence[Prompt], most: int) -> list[Prompt]:
    """At most ``most`` prompts, evenly spaced over ``prompts`` (all of them when few)."""
    n = len(prompts)
    if n <= most:
        return list(prompts)
    return [prompts[i * n // most] for i in range(most)]


def check_prompts(prompts: Sequence[Prompt], tokenizer: Any, limit: int | None, *, model: str,
                  source: str, limit_name: str) -> None:
    """Every check a run's prompts pass before it starts (the task's and the eval set's alike):
    :func:`check_vocabulary`, :func:`check_round_trip`, then :func:`check_prompt_lengths`."""
    check_vocabulary(prompts, tokenizer, model=model)
    check_round_trip(prompts, tokenizer, model=model)
    check_prompt_lengths(prompts, tokenizer, limit, source=source, limit_name=limit_name)


def check_prompt_lengths(
    prompts: Sequence[Prompt], tokenizer: Any, limit: int | None, *, source: str, limit_name: str
) -> None:
    """Refuse prompts of more than ``limit`` tokens, encoded as the engines encode them (the
    tokenizer's default special tokens; an empty prompt is one ``bos``). ``source``: where
    the prompts come from (a file, a built-in task); ``limit_name``: what the limit is."""
    if limit is None or not prompts:
        return
    ids = tokenizer([p.text for p in prompts])["input_ids"]
    lengths = [max(len(row), 1) for row in ids]
    bad = [i for i, n in enumerate(lengths) if n > limit]
    if not bad:
        return
    worst = max(bad, key=lengths.__getitem__)
    p = prompts[worst]
    raise ConfigError(
        f"{source}: {len(bad)} of {len(prompts)} prompts have more than {limit} tokens, "
        f"{limit_name}; the longest: prompt {p.prompt_id!r} ({lengths[worst]} tokens) "
        f"{p.text[:80]!r}. Shorten or drop them, or use a model with a longer context"
    )


def _unknown_chars(tokenizer: Any, text: str, unk: int) -> list[str]:
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, ValueError, TypeError):  # slow tokenizers have no offsets
        return []
    found: list[str] = []
    for token, (start, end) in zip(enc["input_ids"], enc["offset_mapping"], strict=False):
        piece = text[start:end]
        if token == unk and piece not in found:
            found.append(piece)
    return found


def missing_column(path: Path, column: str, columns: Sequence[str]) -> ConfigError:
    """The one error of a prompt file without ``column`` (also said before the heavy imports:
    :mod:`freshroll.runtime.precheck`)."""
    return ConfigError(f"prompt file {path}: missing column {column!r} (task.prompt_field "
                       f"names the prompt's column); columns: {sorted(columns)}")


# --- reading -------------------------------------------------------------------------------


def _read_rows(path: Path, split: str | None) -> list[dict[str, Any]]:
    if path.is_dir():
        return _rows_of(path, _load_from_disk(path, split))
    if not path.exists():
        raise ConfigError(f"prompt file {path} does not exist")
    if not path.is_file():  # a FIFO, a device (/dev/zero), a socket: never read to the end
        raise ConfigError(f"prompt file {path} is not a regular file (nor a directory "
                          "written by datasets' save_to_disk)")
    builder = _FORMATS.get(path.suffix.lower())
    if builder is None:
        raise ConfigError(
            f"prompt file {path}: unsupported extension {path.suffix!r}; use one of "
            f"{', '.join(_FORMATS)}, or a directory written by datasets' save_to_disk"
        )
    if split not in (None, "train"):
        raise ConfigError(f"task.split={split!r}: a single file has only the 'train' split")
    if path.stat().st_size == 0 or (builder == "parquet" and _parquet_rows(path) == 0):
        raise ConfigError(f"prompt file {path} is empty")
    import datasets  # heavy import, only needed here

    try:
        with quiet_datasets():
            ds = datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as exc:  # datasets raises many types for unreadable files
        cause = exc.__cause__ or exc
        raise ConfigError(
            f"prompt file {path}: cannot read it ({type(cause).__name__}: {cause})"
        ) from exc
    return _rows_of(path, ds)


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """``datasets`` without its progress bars ("Generating train split: ...") and info/warning
    logs, for the block; both are restored after it (a notebook's own settings are kept).

    A run's terminal holds freshroll's lines only; a file ``datasets`` cannot read still
    raises, and :func:`_read_rows` says why in one line.
    """
    from datasets.utils import logging as ds_logging

    bars = ds_logging.is_progress_bar_enabled()
    level = ds_logging.get_verbosity()
    ds_logging.disable_progress_bar()
    ds_logging.set_verbosity_error()
    try:
        yield
    finally:
        ds_logging.set_verbosity(level)
        if bars:
            ds_logging.enable_progress_bar()


def _load_from_disk(path: Path, split: str | None) -> Any:
    import datasets

    try:
        with quiet_datasets():
            loaded = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise ConfigError(
            f"prompt directory {path}: not a dataset written by save_to_disk "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if isinstance(loaded, datasets.Dataset):
        if split not in (None, "train"):
            raise ConfigError(f"task.split={split!r}: {path} holds a single dataset, no splits")
        return loaded
    splits = sorted(loaded)
    if split is None:
        split = "train" if "train" in loaded or len(splits) != 1 else splits[0]
    if split not in loaded:
        raise ConfigError(f"prompt directory {path}: no split {split!r}; splits: {splits} "
                          "(choose one with task.split)")
    return loaded[split]


def _rows_of(path: Path, ds: Any) -> list[dict[str, Any]]:
    if len(ds) == 0:
        raise ConfigError(f"prompt file {path} has no rows")
    return list(ds.to_list())


def _parquet_rows(path: Path) -> int | None:
    """Row count from the Parquet footer; None if unreadable (load_dataset will say why)."""
    import pyarrow.parquet as pq

    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except Exception:
        return None


# --- rows -----------------------------------------------------------------------------------


def _answer_alias(path: Path, answer_field: str, columns: list[str]) -> str | None:
    """The column to hand to rewards as ``answer`` too, if it is not ``answer`` itself."""
    if answer_field == "answer":
        return None
    if answer_field not in columns:
        raise ConfigError(
            f"prompt file {path}: task.answer_field={answer_field!r} is not a column; "
            f"columns: {columns}"
        )
    if "answer" in columns:
        raise ConfigError(
            f"prompt file {path}: task.answer_field={answer_field!r} would be given to rewards "
            "as 'answer', but the dataset has its own 'answer' column; rename one of them"
        )
    return answer_field


def _is_chat(value: Any) -> bool:
    return isinstance(value, list)


def _prompt_of(
    where: str, value: Any, column: str, chat: bool, render: Render | None
) -> tuple[str, list[dict[str, Any]] | None]:
    if not chat:
        if not isinstance(value, str):
            kind = "chat messages" if isinstance(value, list) else type(value).__name__
            raise ConfigError(
                f"{where}: column {column!r} must be a string like the first row's, got "
                f"{kind} {value!r:.80}"
            )
        return value, None
    messages = _messages(where, value, column)
    if render is None:
        raise ConfigError(f"{where}: chat-format prompts need a tokenizer to render them")
    return render(messages), messages


def _messages(where: str, value: Any, column: str) -> list[dict[str, Any]]:
    shape = f"{where}: column {column!r} must be chat messages like the first row's"
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{shape} (a non-empty list of {{role, content}}), got {value!r:.80}")
    messages = []
    for j, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise ConfigError(f"{shape}; message {j} is {message!r:.80}")
        kept = {k: v for k, v in message.items() if v is not None}
        if not isinstance(kept.get("role"), str) or not isinstance(kept.get("content"), str):
            raise ConfigError(
                f"{shape}; message {j} needs a string 'role' and a string 'content', "
                f"got {message!r:.80}"
            )
        messages.append(kept)
    return messages


def _id_of(where: str, path: Path, index: int, row: Mapping[str, Any], id_field: str | None) -> str:
    if id_field is None:
        return f"{path.stem}-{index}"
    raw_id = row[id_field]
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
        raise ConfigError(f"{where}: column {id_field!r} must be a string or int, got {raw_id!r}")
    return str(raw_id)


def _check_unique_ids(path: Path, prompts: list[Prompt]) -> None:
    seen: dict[str, int] = {}
    for i, p in enumerate(prompts):
        if p.prompt_id in seen:
            raise ConfigError(
                f"prompt file {path}, row {i}: duplicate prompt id {p.prompt_id!r} "
                f"(first at row {seen[p.prompt_id]})"
            )
        seen[p.prompt_id] = i
