"""Tests for freshroll.rewards.data: datasets in every supported form, chat prompts, vocabulary."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from freshroll.engines.tiny import build_tokenizer
from freshroll.errors import ConfigError
from freshroll.rewards.data import (
    chat_renderer,
    check_round_trip,
    check_vocabulary,
    load_prompts,
    plain_chat_text,
)
from freshroll.rewards.tasks import Prompt

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _templated() -> Any:
    tok = build_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def _chat(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


# --- files and directories -------------------------------------------------------------------


def test_load_jsonl_keeps_every_column_with_its_type(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "mine.jsonl", [
        {"prompt": "rev 12=", "answer": "21", "extra": 1},
        {"prompt": "rev 345=", "answer": "543", "extra": 2},
    ])
    assert load_prompts(path) == [
        Prompt("mine-0", "rev 12=", {"prompt": "rev 12=", "answer": "21", "extra": 1}),
        Prompt("mine-1", "rev 345=", {"prompt": "rev 345=", "answer": "543", "extra": 2}),
    ]


def test_reading_a_file_prints_no_progress_bar_and_keeps_the_callers_settings(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from datasets.utils import logging as ds_logging

    rows = [{"prompt": f"{tmp_path} {i}", "answer": str(i)} for i in range(3)]  # never cached
    ds_logging.enable_progress_bar()
    try:
        capfd.readouterr()
        assert len(load_prompts(_jsonl(tmp_path / "fresh.jsonl", rows))) == 3
        out, err = capfd.readouterr()
        assert "Generating" not in err and "examples" not in err and not out, err
        assert ds_logging.is_progress_bar_enabled()  # a notebook's own setting is restored
    finally:
        ds_logging.disable_progress_bar()


def test_load_parquet_custom_fields_ids_and_answer_alias(tmp_path: Path) -> None:
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"q": ["1+1=", "2+3="], "a": ["2", "5"], "uid": ["x", "y"]}), path)
    got = load_prompts(str(path), prompt_field="q", answer_field="a", id_field="uid")
    assert [(p.prompt_id, p.text, p.answer) for p in got] == [
        ("x", "1+1=", "2"), ("y", "2+3=", "5")]
    assert got[0].columns == {"q": "1+1=", "a": "2", "uid": "x", "answer": "2"}


def test_load_csv(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("prompt,answer,n\nrev 1=,1,7\n")
    (p,) = load_prompts(path)
    assert p.text == "rev 1=" and p.columns["n"] == 7


def test_load_from_disk_dataset_and_dataset_dict(tmp_path: Path) -> None:
    rows = [{"prompt": "a", "solution": 1}, {"prompt": "b", "solution": 2}]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "single"))
    got = load_prompts(tmp_path / "single")
    assert [p.columns for p in got] == rows and got[1].prompt_id == "single-1"
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_list(rows),
        "test": datasets.Dataset.from_list([{"prompt": "t", "solution": 3}]),
    })
    dd.save_to_disk(str(tmp_path / "dict"))
    assert [p.text for p in load_prompts(tmp_path / "dict")] == ["a", "b"]
    assert [p.text for p in load_prompts(tmp_path / "dict", split="test")] == ["t"]
    with pytest.raises(ConfigError, match=r"no split 'dev'.*\['test', 'train'\].*task\.split"):
        load_prompts(tmp_path / "dict", split="dev")


def test_a_folder_that_is_no_dataset_names_it(tmp_path: Path) -> None:
    (tmp_path / "junk").mkdir()
    with pytest.raises(ConfigError, match=r"junk: not a dataset written by save_to_disk"):
        load_prompts(tmp_path / "junk")


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.jsonl"):
        load_prompts(tmp_path / "nope.jsonl")


def test_a_fifo_or_a_device_is_not_a_regular_file(tmp_path: Path) -> None:
    """Issue 23, 5g. Before: reported as "does not exist"."""
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        with pytest.raises(ConfigError, match=rf"prompt file {path} is not a regular file"):
            load_prompts(path)


def test_unsupported_extension_names_file(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("prompt,answer\na,b\n")
    with pytest.raises(ConfigError, match=r"p\.txt.*unsupported"):
        load_prompts(path)


def test_empty_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(ConfigError, match=r"empty\.jsonl is empty"):
        load_prompts(path)


def test_unparseable_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "garbage.jsonl"
    path.write_text("{not json\n")
    with pytest.raises(ConfigError, match=r"garbage\.jsonl: cannot read it"):
        load_prompts(path)


def test_parquet_without_rows_names_it(tmp_path: Path) -> None:
    path = tmp_path / "none.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    with pytest.raises(ConfigError, match=r"none\.parquet is empty"):
        load_prompts(path)


# --- columns -----------------------------------------------------------------------------------


def test_answer_is_optional_and_may_be_any_type(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "free.jsonl", [{"prompt": "a", "solution": [1, 2]}])
    (p,) = load_prompts(path)
    assert p.answer is None and p.columns == {"prompt": "a", "solution": [1, 2]}
    path = _jsonl(tmp_path / "typed.jsonl", [{"prompt": "a", "answer": 4}, {"prompt": "b"}])
    assert [p.answer for p in load_prompts(path)] == [4, None]


def test_missing_prompt_or_named_answer_column_names_column_and_file(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "cols.jsonl", [{"question": "a", "solution": "b"}])
    with pytest.raises(ConfigError, match=r"cols\.jsonl.*'prompt'.*\['question', 'solution'\]"):
        load_prompts(path)
    with pytest.raises(ConfigError, match=r"answer_field='sol'.*\['question', 'solution'\]"):
        load_prompts(path, prompt_field="question", answer_field="sol")


def test_answer_alias_clashing_with_an_answer_column_is_refused(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "two.jsonl", [{"prompt": "a", "answer": "1", "gold": "2"}])
    with pytest.raises(ConfigError, match="own 'answer' column"):
        load_prompts(path, answer_field="gold")


def test_non_string_prompt_names_file_row_and_column(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "a"}, {"prompt": None}])
    with pytest.raises(ConfigError, match=r"bad\.jsonl, row 1: column 'prompt' must be a string"):
        load_prompts(path)


def test_duplicate_ids_are_rejected_and_int_ids_allowed(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "dup.jsonl", [
        {"prompt": "a", "id": "k"},
        {"prompt": "b", "id": "k"},
    ])
    with pytest.raises(ConfigError, match=r"dup\.jsonl, row 1: duplicate"):
        load_prompts(path, id_field="id")
    path = _jsonl(tmp_path / "ints.jsonl", [{"prompt": "a", "id": 7}])
    assert load_prompts(path, id_field="id")[0].prompt_id == "7"


# --- chat prompts ------------------------------------------------------------------------------


def test_chat_prompts_are_rendered_with_the_chat_template(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "chat.jsonl", [
        {"prompt": _chat("rev 12="), "answer": "21"},
        {"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]},
    ])
    render = chat_renderer(_templated(), model="m")
    first, second = load_prompts(path, render=render)
    assert first.text == "user: rev 12= assistant:"  # add_generation_prompt
    assert second.text == "user: hi assistant: ok"  # continue_final_message
    assert first.messages == _chat("rev 12=") and first.reward_prompt() == _chat("rev 12=")


def test_chat_fields_that_datasets_fills_with_none_are_dropped(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "names.jsonl", [
        {"prompt": [{"role": "user", "content": "a", "name": "x"}]},
        {"prompt": _chat("b")},
    ])
    _, second = load_prompts(path, render=plain_chat_text)
    assert second.messages == _chat("b")


def test_chat_without_a_template_is_refused_unless_the_fallback_is_allowed(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "chat.jsonl", [{"prompt": [*_chat("rev"), *_chat("12=")]}])
    with pytest.raises(ConfigError, match="tokenizer of m-dir has none"):
        load_prompts(path, render=chat_renderer(build_tokenizer(), model="m-dir"))
    render = chat_renderer(build_tokenizer(), model="m", plain_fallback=True)
    assert load_prompts(path, render=render)[0].text == "rev 12="
    with pytest.raises(ConfigError, match="need a tokenizer"):
        load_prompts(path)


@pytest.mark.parametrize(
    ("rows", "fragment"),
    [
        ([{"prompt": _chat("a")}, {"prompt": "b"}], r"row 1: column 'prompt' must be chat"),
        ([{"prompt": "a"}, {"prompt": _chat("b")}], r"row 1: .*string.*got chat messages"),
        ([{"prompt": [{"role": "user"}]}], r"row 0: .*message 0 needs a string 'role'"),
        ([{"prompt": []}], r"row 0: .*non-empty list"),
    ],
)
def test_malformed_chat_rows_are_named(tmp_path: Path, rows: list[Any], fragment: str) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=fragment):
        load_prompts(path, render=plain_chat_text)


# --- vocabulary --------------------------------------------------------------------------------


def test_text_outside_the_vocabulary_is_refused_with_count_and_characters() -> None:
    tok = build_tokenizer()
    good = Prompt("ok", "rev 12=")
    check_vocabulary([good], tok, model="tiny")  # nothing to refuse
    bad = [good, Prompt("p1", "Rev 12=\n"), Prompt("p2", "Ä")]
    with pytest.raises(ConfigError) as info:
        check_vocabulary(bad, tok, model="tiny")
    msg = str(info.value)
    assert "2 of 3 prompts" in msg and "'p1'" in msg and "'R', '\\n'" in msg and "<unk>" in msg


def _saved_char_tokenizer(tmp_path: Path, config: Any) -> Any:
    """The character tokenizer saved beside ``config`` and reloaded as a user's run loads it."""
    from transformers import AutoTokenizer

    config.save_pretrained(tmp_path)
    build_tokenizer().save_pretrained(tmp_path)
    return AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)


def test_a_tokenizer_that_drops_characters_is_refused_naming_class_model_and_prompt(
    tmp_path: Path,
) -> None:
    """Issue 48, item 1: under a Qwen2 config transformers loads the character tokenizer as
    Qwen2Tokenizer, which drops the space ('rev 123' -> 'rev123') with no <unk> to see."""
    from transformers import Qwen2Config

    tok = _saved_char_tokenizer(tmp_path, Qwen2Config(vocab_size=64))
    prompts = [Prompt("p0", "rev 123"), Prompt("p1", "rev12")]
    check_vocabulary(prompts, tok, model=str(tmp_path))  # no <unk>: this check sees nothing
    with pytest.raises(ConfigError) as info:
        check_round_trip(prompts, tok, model=str(tmp_path))
    msg = str(info.value)
    assert type(tok).__name__ in msg and str(tmp_path) in msg
    assert "1 of 2 prompts" in msg and "'p0' 'rev 123' becomes 'rev123'" in msg


def test_a_tokenizer_that_gives_the_text_back_is_accepted(tmp_path: Path) -> None:
    """The same files under the tiny Llama config keep their text (and a chat template's
    special-token markers are not counted as changes)."""
    from freshroll.engines.tiny import tiny_config

    tok = _saved_char_tokenizer(tmp_path, tiny_config())
    check_round_trip([Prompt("p0", "rev 123"), Prompt("p1", "<bos>rev 1=")], tok, model="m")
    check_round_trip([], tok, model="m")


def _sentencepiece_like() -> Any:
    """A Llama-2/Mistral-style tokenizer: Metaspace pre-tokenizer, byte fallback, and a decoder
    that strips the dummy prefix (trained here on a few lines)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>", "[INST]", *(f"<0x{i:02X}>" for i in range(256))]
    backend.train_from_iterator(["hello world", "rev 123 = 321", "user: hi"] * 20,
                                trainers.BpeTrainer(vocab_size=300, special_tokens=specials))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>",
                                   additional_special_tokens=["[INST]"])


def test_spaces_a_sentencepiece_tokenizer_moves_are_not_a_change() -> None:
    """Its decoder drops a leading space and writes one after a special token ('</s>[INST]'
    as '</s> [INST]' in a multi-turn template): the model's own way, not a corruption; a
    space lost between two words still is."""
    tok = _sentencepiece_like()
    check_round_trip([Prompt("a", " hello world"), Prompt("b", "hi</s>[INST]rev 123 =")],
                     tok, model="sp")
    assert tok.decode(tok("hi</s>[INST]x", add_special_tokens=False)["input_ids"]) != \
        "hi</s>[INST]x"  # the case is real: the text does change
    tok.backend_tokenizer.decoder = _decoder_dropping_spaces()
    with pytest.raises(ConfigError, match="'b' 'rev 123' becomes 'rev123'"):
        check_round_trip([Prompt("a", "hello"), Prompt("b", "rev 123")], tok, model="sp")


def _decoder_dropping_spaces() -> Any:
    """A decoder that loses every space, as Qwen2Tokenizer did with the character vocabulary."""
    from tokenizers import decoders

    return decoders.Sequence([decoders.Replace("▁", ""), decoders.ByteFallback(),
                              decoders.Fuse()])


def test_the_round_trip_checks_an_even_sample_of_a_big_set() -> None:
    from freshroll.rewards import data

    tok = build_tokenizer()
    prompts = [Prompt(f"p{i}", "rev 1") for i in range(3 * data.ROUND_TRIP_SAMPLE)]
    seen: list[int] = []
    check_round_trip(prompts, _Counting(tok, seen), model="m")
    assert seen == [data.ROUND_TRIP_SAMPLE]


class _Counting:
    """A tokenizer that records how many texts each encoding call receives."""

    def __init__(self, tok: Any, seen: list[int]) -> None:
        self.tok, self.seen = tok, seen

    def __call__(self, texts: list[str], **kw: Any) -> Any:
        self.seen.append(len(texts))
        return self.tok(texts, **kw)

    def decode(self, ids: list[int], **kw: Any) -> str:
        return str(self.tok.decode(ids, **kw))


def test_prompt_lengths_are_checked_against_the_limit_as_the_engines_encode() -> None:
    from freshroll.rewards.data import check_prompt_lengths

    tok = build_tokenizer()
    prompts = [Prompt("a", "rev 12="), Prompt("b", "rev 123456="), Prompt("c", "")]
    check_prompt_lengths(prompts, tok, 11, source="s", limit_name="n")  # 11 tokens fit
    check_prompt_lengths(prompts, tok, None, source="s", limit_name="n")  # no limit known
    with pytest.raises(ConfigError, match=r"^s: 1 of 3 prompts have more than 10 tokens, n; "
                                          r"the longest: prompt 'b' \(11 tokens\)"):
        check_prompt_lengths(prompts, tok, 10, source="s", limit_name="n")


def test_a_tokenizer_without_unknown_token_accepts_everything() -> None:
    class ByteLevel:
        unk_token_id = None

    check_vocabulary([Prompt("p", "ÄÖ\n")], ByteLevel(), model="bpe")


def test_a_template_bos_is_not_doubled_by_a_tokenizer_that_adds_one(tmp_path: Path) -> None:
    """A template that writes BOS, with a tokenizer that also adds BOS on encoding, would give
    the engine two BOS tokens; the rendered text drops the template's."""
    from tokenizers import processors

    tok = build_tokenizer()
    bos_id = tok.bos_token_id
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, bos_id)],
    )
    tok.chat_template = "{{ bos_token }}" + TEMPLATE
    assert tok("x").input_ids[0] == bos_id  # this tokenizer adds BOS by itself
    path = _jsonl(tmp_path / "chat.jsonl", [{"prompt": _chat("rev 12=")}])
    (prompt,) = load_prompts(path, render=chat_renderer(tok, model="m"))
    ids = tok(prompt.text).input_ids
    assert ids[0] == bos_id and ids[1] != bos_id
    # a tokenizer that adds nothing keeps the template's BOS: still exactly one
    plain = _templated()
    plain.chat_template = "{{ bos_token }}" + TEMPLATE
    (kept,) = load_prompts(path, render=chat_renderer(plain, model="m"))
    assert kept.text.startswith(plain.bos_token)
