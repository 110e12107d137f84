"""The llguidance backend on the in-memory test tokenizer: grammars of each kind, their
masks token by token, termination, and the refusals the front end sends as 400s."""

import json

import numpy as np
import pytest

from tests.helpers.tokenizer import EOS, make_tokenizer
from vjx.sampling_params import StructuredOutputsParams
from vjx.structured_output.backend_guidance import GuidanceBackend, validate_structured_outputs

VOCAB_SIZE = 320
"""Wider than the tokenizer's 300 tokens, as a model's padded vocabulary is."""


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="module")
def backend(tokenizer):
    return GuidanceBackend(tokenizer, VOCAB_SIZE)


def _allowed(backend, grammar) -> set[int]:
    bitmask = backend.allocate_token_bitmask(1)
    assert grammar.fill_bitmask(bitmask, 0)
    bits = (bitmask[0][:, None] >> np.arange(32)) & 1
    return set(np.flatnonzero(bits.reshape(-1)).tolist())


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_a_choice_allows_its_words_then_only_eos(backend, tokenizer):
    grammar = backend.compile_grammar(StructuredOutputsParams(choice=["Hello", "Stop"]))
    allowed = _allowed(backend, grammar)
    assert _ids(tokenizer, "Hello")[0] in allowed and _ids(tokenizer, "Stop")[0] in allowed
    assert _ids(tokenizer, "world")[0] not in allowed
    assert not any(token >= 300 for token in allowed), "ids past the tokenizer's are never allowed"
    assert grammar.accept_tokens(_ids(tokenizer, "Hello"))
    assert _allowed(backend, grammar) == {EOS}
    assert not grammar.is_terminated
    assert grammar.accept_tokens([EOS])
    assert grammar.is_terminated


def test_a_token_outside_the_grammar_terminates_it(backend, tokenizer):
    grammar = backend.compile_grammar(StructuredOutputsParams(regex="[0-9]+"))
    assert not grammar.accept_tokens(_ids(tokenizer, "Hello"))
    assert grammar.is_terminated


def test_json_schema_masks_follow_the_schema(backend, tokenizer):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    grammar = backend.compile_grammar(StructuredOutputsParams(json=schema, disable_any_whitespace=True))
    text = '{"ok":true}'
    for token in _ids(tokenizer, text):
        assert token in _allowed(backend, grammar)
        assert grammar.accept_tokens([token])
    assert _allowed(backend, grammar) == {EOS}


def test_whitespace_runs_are_bounded_unless_a_pattern_is_given(backend, tokenizer):
    space = _ids(tokenizer, " ")[0]
    grammar = backend.compile_grammar(StructuredOutputsParams(json_object=True))
    assert grammar.accept_tokens(_ids(tokenizer, "{"))
    for _ in range(32):
        assert space in _allowed(backend, grammar)
        assert grammar.accept_tokens([space])
    assert space not in _allowed(backend, grammar), "a 33rd space in one run"
    unbounded = backend.compile_grammar(StructuredOutputsParams(json_object=True, whitespace_pattern=" *"))
    assert unbounded.accept_tokens(_ids(tokenizer, "{") + [space] * 40)


def test_disable_additional_properties_closes_objects(backend, tokenizer):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    params = dict(json=schema, disable_any_whitespace=True)
    open_grammar = backend.compile_grammar(StructuredOutputsParams(**params))
    closed = backend.compile_grammar(StructuredOutputsParams(**params, disable_additional_properties=True))
    extra = _ids(tokenizer, '{"a":1,"b"')
    assert open_grammar.accept_tokens(extra)
    assert not closed.accept_tokens(extra)


def test_an_empty_regex_allows_only_eos_at_once(backend):
    grammar = backend.compile_grammar(StructuredOutputsParams(regex=""))
    assert _allowed(backend, grammar) == {EOS}


def test_a_grammar_and_a_structural_tag_compile(backend, tokenizer):
    lark = backend.compile_grammar(StructuredOutputsParams(grammar='start: "Hello" | "Stop"'))
    assert lark.accept_tokens(_ids(tokenizer, "Stop"))
    tag = {
        "triggers": ["<tool"],
        "structures": [{"begin": "<tool>", "schema": {"type": "object"}, "end": "</tool>"}],
    }
    assert backend.compile_grammar(StructuredOutputsParams(structural_tag=json.dumps(tag)))


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(regex="(unclosed"), "regex"),
        (dict(grammar="start: undefined_rule"), "undefined_rule"),
        (dict(json={"type": "frobnicate"}), "frobnicate"),
        (dict(json="{not json"), "invalid specification"),
        (dict(json_object=False), "constrains nothing"),
        (dict(structural_tag=json.dumps({"triggers": ["<a"], "structures": []})), "no structures"),
    ],
)
def test_bad_constraints_are_refused_before_the_engine(params, message):
    with pytest.raises(ValueError, match=message):
        validate_structured_outputs(StructuredOutputsParams(**params))


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(), "one kind of constraint"),
        (dict(regex="a", choice=["a"]), "only one kind"),
        (dict(choice=[]), "at least one"),
    ],
)
def test_params_check_their_fields(params, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**params)
