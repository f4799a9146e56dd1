"""Lineage ids: canonical string round trips, chained policy digests, reward versions."""

from __future__ import annotations

import functools
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from freshroll.errors import LineageError
from freshroll.ledger.lineage import (
    DIGEST_LEN,
    PolicyVersion,
    RewardVersion,
    digest_callable,
    digest_of,
    group_id,
    group_of,
    parse_request_id,
    parse_sample_id,
    request_id,
    request_of,
    sample_id,
)

nat = st.integers(min_value=0, max_value=10**12)
hexdigest = st.text(alphabet="0123456789abcdef", min_size=1, max_size=64)
reward_name = st.text(alphabet=string.ascii_letters + string.digits + "_.-", min_size=1,
                      max_size=30)
sample_ids = st.lists(
    st.builds(lambda g, m, a: sample_id(request_id(group_id(g), m), a), nat, nat, nat),
    max_size=20,
)


# -- group / request / sample ids ----------------------------------------------------
@given(nat, nat, nat)
def test_request_and_sample_ids_round_trip(g: int, m: int, a: int) -> None:
    gid = group_id(g)
    rid = request_id(gid, m)
    sid = sample_id(rid, a)
    assert (gid, rid, sid) == (f"g{g}", f"g{g}.{m}", f"g{g}.{m}#{a}")
    assert parse_request_id(rid) == (gid, m)
    assert parse_sample_id(sid) == (rid, a)
    assert request_of(sid) == rid
    assert group_of(rid) == gid and group_of(sid) == gid


@given(st.text(max_size=20))
def test_request_and_sample_parse_accept_only_canonical_text(text: str) -> None:
    """Whatever parses prints back to exactly the same text: one id, one spelling."""
    try:
        gid, member = parse_request_id(text)
    except LineageError as exc:
        assert repr(text) in str(exc)
    else:
        assert request_id(gid, member) == text
    try:
        rid, attempt = parse_sample_id(text)
    except LineageError as exc:
        assert repr(text) in str(exc)
    else:
        assert sample_id(rid, attempt) == text


@pytest.mark.parametrize("bad", [
    "", "g", "g1", "17.3", "g17.", "g17.3.1", "x17.3", "g-1.0", "g17.3#2", " g17.3", "g17.3 ",
    "g17.3\n", "g01.3", "g1.03", "g\u0663.1", "G17.3",
])
def test_bad_request_ids_raise_naming_the_text(bad: str) -> None:
    with pytest.raises(LineageError) as info:
        parse_request_id(bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", [
    "", "g17.3", "g17.3#", "#2", "g17#2", "g17.3#2#1", "g17.3#-1", "g17.3#2\n", "g17.3#02",
    "g17.3#\u0662",
])
def test_bad_sample_ids_raise_naming_the_text(bad: str) -> None:
    with pytest.raises(LineageError) as info:
        parse_sample_id(bad)
    assert repr(bad) in str(info.value)


# -- policy versions ---------------------------------------------------------------
@given(nat, hexdigest, st.none() | hexdigest)
def test_policy_version_round_trips(step: int, digest: str, weights: str | None) -> None:
    v = PolicyVersion(step, digest, weights)
    text = str(v)
    assert text.startswith(f"p{step}-{digest}")
    assert ("+w" in text) == (weights is not None)
    assert PolicyVersion.parse(text) == v
    assert hash(PolicyVersion.parse(text)) == hash(v)


@given(st.text(max_size=40))
def test_policy_parse_accepts_only_canonical_text(text: str) -> None:
    try:
        v = PolicyVersion.parse(text)
    except LineageError as exc:
        assert repr(text) in str(exc)
    else:
        assert str(v) == text


@pytest.mark.parametrize("bad", [
    "", "p", "p1", "p1-", "1-abc", "p-1-abc", "p1-ABC", "p1-xyz", "p1-abc+w", "p1-abc+wXY",
    "p1-abc\n", " p1-abc", "p01-abc", "p\u0663-abc", "r:x:abc",
])
def test_bad_policy_versions_raise_naming_the_text(bad: str) -> None:
    with pytest.raises(LineageError) as info:
        PolicyVersion.parse(bad)
    assert repr(bad) in str(info.value)


def test_initial_version_is_step_zero_and_depends_on_the_model() -> None:
    a, b = PolicyVersion.initial("model-a"), PolicyVersion.initial("model-b")
    assert a.step == b.step == 0
    assert a != b
    assert a == PolicyVersion.initial("model-a")
    assert len(a.digest) == DIGEST_LEN
    assert PolicyVersion.initial("m", "abc").weights_digest == "abc"


@given(sample_ids, st.randoms(use_true_random=False), st.text(max_size=10))
def test_child_is_deterministic_and_ignores_batch_order(
    batch: list[str], rnd: object, settings: str
) -> None:
    parent = PolicyVersion.initial("model")
    shuffled = list(batch)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    one = parent.child(batch, settings)
    two = PolicyVersion.initial("model").child(iter(shuffled), settings)  # a second construction
    assert one == two
    assert str(one) == str(two)
    assert one.step == parent.step + 1


@given(sample_ids, sample_ids, st.text(max_size=10), st.text(max_size=10))
def test_child_differs_when_batch_or_settings_differ(
    b1: list[str], b2: list[str], s1: str, s2: str
) -> None:
    parent = PolicyVersion.initial("model")
    same_batch = sorted(b1) == sorted(b2)
    assert (parent.child(b1, s1) == parent.child(b2, s2)) == (same_batch and s1 == s2)


def test_child_differs_when_parent_differs() -> None:
    batch, settings = ["g0.0#1", "g0.1#1"], "lr=1e-6"
    a = PolicyVersion.initial("model-a").child(batch, settings)
    b = PolicyVersion.initial("model-b").child(batch, settings)
    assert a.step == b.step == 1
    assert a.digest != b.digest
    # the chain: same batch at a different depth gives a different id too
    assert a.child(batch, settings).digest != a.digest


def test_digest_parts_are_length_prefixed() -> None:
    # (sample ids cannot hold a newline, so the newline-joined batch is unambiguous too)
    assert digest_of("ab", "c") != digest_of("a", "bc")
    assert digest_of("abc") != digest_of("ab", "c")
    assert digest_of("x") == digest_of(b"x")
    parent = PolicyVersion.initial("model")
    assert parent.child(["g0.0#1"], "g0.1#1") != parent.child(["g0.0#1", "g0.1#1"], "")


def test_child_carries_weights_digest_and_still_round_trips() -> None:
    child = PolicyVersion.initial("m").child(["g0.0#1"], "s", weights_digest="beef")
    assert str(child).endswith("+wbeef")
    assert PolicyVersion.parse(str(child)) == child


# -- reward versions ---------------------------------------------------------------
@given(reward_name, hexdigest, st.none() | hexdigest)
def test_reward_version_round_trips(name: str, digest: str, weights: str | None) -> None:
    v = RewardVersion(name, digest, weights)
    assert str(v).startswith(f"r:{name}:{digest}")
    assert RewardVersion.parse(str(v)) == v


@given(st.text(max_size=40))
def test_reward_parse_accepts_only_canonical_text(text: str) -> None:
    try:
        v = RewardVersion.parse(text)
    except LineageError as exc:
        assert repr(text) in str(exc)
    else:
        assert str(v) == text


@pytest.mark.parametrize("bad", [
    "", "r:", "r:name", "r:name:", "r::abc", "r:na me:abc", "r:name:XYZ", "r:name:abc+w",
    "r:name:abc\n", "x:name:abc", "p1-abc", "r:a:b:abc",
])
def test_bad_reward_versions_raise_naming_the_text(bad: str) -> None:
    with pytest.raises(LineageError) as info:
        RewardVersion.parse(bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad_name", ["", "has space", "col:on", "new\nline", "ünï"])
def test_reward_names_are_validated(bad_name: str) -> None:
    with pytest.raises(LineageError) as info:
        RewardVersion(bad_name, "abc")
    assert repr(bad_name) in str(info.value)
    with pytest.raises(LineageError):
        RewardVersion.of(bad_name, config={})


def _len_reward(completions: list[str], **kw: object) -> list[float]:
    return [float(len(c)) for c in completions]


def _len_reward_v2(completions: list[str], **kw: object) -> list[float]:
    return [float(len(c)) / 2 for c in completions]


def _same_body(completions: list[str], **kw: object) -> list[float]:
    return [float(len(c)) for c in completions]


class _Scorer:
    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, completions: list[str]) -> list[float]:
        return [self.scale] * len(completions)


def test_reward_version_of_is_deterministic() -> None:
    a = RewardVersion.of("len", _len_reward, {"target": 8})
    assert a == RewardVersion.of("len", _len_reward, {"target": 8})
    assert RewardVersion.parse(str(a)) == a
    # config dict key order does not matter (canonical JSON)
    assert RewardVersion.of("len", None, {"a": 1, "b": 2}) == RewardVersion.of(
        "len", None, {"b": 2, "a": 1}
    )


def test_reward_version_changes_with_source_or_config() -> None:
    base = RewardVersion.of("len", _len_reward, {"target": 8})
    assert base != RewardVersion.of("len", _len_reward_v2, {"target": 8})   # other code
    assert base != RewardVersion.of("len", _len_reward, {"target": 9})      # other config
    assert base != RewardVersion.of("len", _len_reward, None)               # no config
    assert base != RewardVersion.of("len", None, {"target": 8})             # no function
    assert base.name == "len"
    # identical bodies under different names are different functions (the def line differs)
    assert digest_callable(_len_reward) != digest_callable(_same_body)
    weighted = RewardVersion.of("len", _len_reward, {"target": 8}, weights_digest="ab12")
    assert weighted.digest == base.digest and weighted != base
    assert RewardVersion.parse(str(weighted)) == weighted


def test_reward_version_of_partial_includes_bound_arguments() -> None:
    p1 = functools.partial(_len_reward, scale=1)
    p2 = functools.partial(_len_reward, scale=2)
    assert RewardVersion.of("len", p1) == RewardVersion.of("len", functools.partial(_len_reward,
                                                                                    scale=1))
    assert RewardVersion.of("len", p1) != RewardVersion.of("len", p2)
    assert RewardVersion.of("len", p1) != RewardVersion.of("len", _len_reward)


def test_reward_version_of_callable_object_is_stable() -> None:
    """A callable instance is digested by its class, not by a repr with a memory address."""
    assert digest_callable(_Scorer(1.0)) == digest_callable(_Scorer(1.0))
    assert RewardVersion.of("rm", _Scorer(1.0), {"scale": 1.0}) == RewardVersion.of(
        "rm", _Scorer(1.0), {"scale": 1.0}
    )
    assert RewardVersion.of("rm", _Scorer(1.0), {"scale": 1.0}) != RewardVersion.of(
        "rm", _Scorer(2.0), {"scale": 2.0}
    )


def test_builtin_callables_fall_back_to_their_name() -> None:
    assert digest_callable(len) == digest_callable(len)
    assert digest_callable(len) != digest_callable(max)
