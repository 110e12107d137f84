"""The llguidance backend: a request's constraint as an llguidance grammar, and its matcher.

llguidance computes each step's allowed tokens as a bitmask, one bit per vocabulary entry
in int32 words ([rows, ceil(V / 32)]), with its NumPy API (no torch at run time). The
grammar is built from the request's `StructuredOutputsParams` alone, so the front end can
refuse a bad one before it reaches the engine, and the engine compiles it against the
tokenizer once per distinct constraint.
"""

import copy
import dataclasses
import json
import logging

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np

from vjx.sampling_params import StructuredOutputsParams

logger = logging.getLogger(__name__)

_BOUNDED_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,32}"
"""Whitespace between JSON tokens by default: enough for any pretty-printing, but a bounded
run, so that a model cannot fill its budget with blank lines (llguidance's flexible
whitespace, which vLLM uses, allows any run)."""
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = ("items", "prefixItems", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "contains")


def _close_objects(schema):
    """`schema` with `additionalProperties: false` on every object schema that does not say
    otherwise (`disable_additional_properties`), as vLLM does."""
    if isinstance(schema, list):
        return [_close_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(closed.get(key), dict):
            closed[key] = {name: _close_objects(sub) for name, sub in closed[key].items()}
    for key in (*_SUBSCHEMAS, "additionalProperties"):
        if isinstance(closed.get(key), (dict, list)):
            closed[key] = _close_objects(closed[key])
    if "additionalProperties" not in closed and isinstance(closed.get("properties"), dict):
        closed["additionalProperties"] = False
    return closed


def _json_grammar(schema: str | dict, params: StructuredOutputsParams) -> str:
    if params.disable_additional_properties:
        schema = _close_objects(json.loads(schema) if isinstance(schema, str) else copy.deepcopy(schema))
    defaults = {"whitespace_flexible": not params.disable_any_whitespace}
    if params.whitespace_pattern is not None:
        defaults["whitespace_pattern"] = params.whitespace_pattern
    elif not params.disable_any_whitespace:
        defaults["whitespace_pattern"] = _BOUNDED_WHITESPACE
    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=defaults)


def _structural_tag_grammar(spec: str, params: StructuredOutputsParams) -> str:
    """vLLM's structural tag: `{"triggers": [...], "structures": [{"begin", "schema", "end"}]}`."""
    tag = json.loads(spec)
    tags = []
    for structure in tag["structures"]:
        trigger = next((t for t in tag["triggers"] if structure["begin"].startswith(t)), None)
        if trigger is None:
            raise ValueError(f"structural_tag: begin {structure['begin']!r} starts with none of {tag['triggers']}.")
        grammar = _json_grammar(structure["schema"], params)
        tags.append(
            llguidance.StructTag(trigger=trigger, begin=structure["begin"], grammar=grammar, end=structure["end"])
        )
    if not tags:
        raise ValueError("structural_tag has no structures.")
    return llguidance.StructTag.to_grammar(tags)


def serialize_grammar(params: StructuredOutputsParams) -> str:
    """The llguidance grammar of `params` (ValueError, KeyError or TypeError when malformed)."""
    if params.json is not None:
        return _json_grammar(params.json, params)
    if params.json_object:
        return _json_grammar({"type": "object"}, params)
    if params.regex is not None:
        return llguidance.grammar_from("regex", params.regex)
    if params.choice is not None:
        return llguidance.grammar_from("choice", json.dumps(params.choice))
    if params.grammar is not None:
        return llguidance.grammar_from("grammar", params.grammar)
    if params.structural_tag is not None:
        return _structural_tag_grammar(params.structural_tag, params)
    raise ValueError("structured_outputs.json_object=False constrains nothing; leave structured_outputs unset.")


def validate_structured_outputs(params: StructuredOutputsParams) -> None:
    """ValueError naming what is wrong with the constraint (a bad schema, regex or grammar),
    before the request reaches the engine."""
    try:
        grammar = serialize_grammar(params)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"structured_outputs: invalid specification: {e}") from None
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise ValueError(f"structured_outputs: grammar error: {error}")


class GuidanceBackend:
    """Compiles grammars against one tokenizer, whose vocabulary the model's rows cover."""

    def __init__(self, tokenizer, vocab_size: int):
        """`vocab_size`: the model's logits width; ids past the tokenizer's are never allowed."""
        self.vocab_size = vocab_size
        self.ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, max(vocab_size, len(tokenizer)))

    def compile_grammar(self, params: StructuredOutputsParams) -> "GuidanceGrammar":
        matcher = llguidance.LLMatcher(self.ll_tokenizer, serialize_grammar(params), log_level=0)
        if matcher.is_error():
            raise ValueError(f"structured_outputs: grammar error: {matcher.get_error()}")
        return GuidanceGrammar(matcher, self.ll_tokenizer.eos_token)

    def allocate_token_bitmask(self, num_rows: int) -> np.ndarray:
        """All bits set: every token allowed (a row without a grammar)."""
        return llguidance.numpy.allocate_token_bitmask(num_rows, self.vocab_size)


@dataclasses.dataclass
class GuidanceGrammar:
    """One request's matcher: advanced by the tokens it samples, asked for the next mask."""

    matcher: llguidance.LLMatcher
    eos_token_id: int
    is_terminated: bool = False
    """The grammar is complete and ended (its EOS taken), or can take no token at all."""

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Advances the matcher; False when a token does not fit the grammar (the matcher
        is then in its error state)."""
        if self.eos_token_id in token_ids or self.matcher.is_stopped():
            self.is_terminated = True
        if self.matcher.is_stopped():
            return True
        is_accepted = self.matcher.consume_tokens(token_ids)
        if not is_accepted:
            self.is_terminated = True
            logger.warning("A token left its grammar: %s", self.matcher.get_error())
        return is_accepted

    def fill_draft_bitmasks(self, bitmask: np.ndarray, row: int, drafts: list[int]) -> bool:
        """Rows `row` to `row + len(drafts)`: the mask before each draft and after the last, as
        if the drafts before it were accepted (the matcher is rolled back after). From the
        first draft the grammar refuses on, the rows keep all tokens allowed: the step rejects
        that draft (its own row bans it), so no token after it is kept. False as
        `fill_bitmask` for the first row."""
        if not self.fill_bitmask(bitmask, row):
            return False
        num_valid = self.matcher.validate_tokens(drafts) if drafts and not self.matcher.is_stopped() else 0
        if num_valid:
            self.matcher.consume_tokens(drafts[:num_valid])
        # Latest state first: the row after drafts[:j], then one token back.
        for j in range(num_valid, 0, -1):
            llguidance.numpy.fill_next_token_bitmask(self.matcher, bitmask, row + j)
            self.matcher.rollback(1)
        return True

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> bool:
        """Writes the next token's mask into `bitmask[row]`; False when no token is allowed
        (the matcher failed), which ends the request."""
        llguidance.numpy.fill_next_token_bitmask(self.matcher, bitmask, row)
        return not self.matcher.is_error() and bool(bitmask[row].any())
