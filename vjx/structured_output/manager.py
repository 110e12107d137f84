"""StructuredOutputManager: the engine core's side of structured outputs, as vLLM's.

- `grammar_init` (when a request arrives) starts compiling its grammar in a thread pool;
  the scheduler admits the request once `is_ready` says the grammar is there.
- `accept_tokens` (in `update_from_output`) advances the request's matcher by its new tokens.
- `grammar_bitmask` (before a step is dispatched) fills one row of allowed tokens per
  constrained request that samples in the step.

The tokenizer (and llguidance's view of it) is loaded with the first grammar, so an engine
that never sees one never pays for it. Compiled grammars are kept by constraint: a repeated
schema costs a matcher copy. With a reasoning parser, a request's tokens follow its grammar
only once its reasoning has ended (the think-end token is in its tokens).
"""

import collections
import concurrent.futures
import dataclasses
import json
import threading

import numpy as np

from vjx.config import VjxConfig
from vjx.core.request import Request
from vjx.structured_output.backend_guidance import GuidanceBackend, GuidanceGrammar
from vjx.structured_output.request import StructuredOutputRequest

_MAX_CACHED_GRAMMARS = 256
_NUM_COMPILE_THREADS = 2


class StructuredOutputManager:
    def __init__(self, tokenizer_name: str, vocab_size: int, reasoning_parser: str = ""):
        """`vocab_size`: the model's logits width; `reasoning_parser`: a name in
        vjx/reasoning's registry, or "" for none."""
        self.vocab_size = vocab_size
        self.tokenizer_name = tokenizer_name
        self.reasoning_parser_name = reasoning_parser
        self._executor = concurrent.futures.ThreadPoolExecutor(_NUM_COMPILE_THREADS, "vjx-grammar")
        self._lock = threading.Lock()
        self._backend: GuidanceBackend | None = None
        self._reasoner = None
        self._grammars: collections.OrderedDict[str, GuidanceGrammar] = collections.OrderedDict()

    @classmethod
    def from_config(cls, config: VjxConfig) -> "StructuredOutputManager":
        model_config = config.model_config
        reasoning_parser = config.structured_outputs_config.reasoning_parser
        return cls(model_config.tokenizer, model_config.hf_text_config.vocab_size, reasoning_parser)

    def grammar_init(self, request: Request) -> None:
        """Starts compiling the request's grammar, when it has one."""
        params = request.sampling_params.structured_outputs
        if params is None:
            return
        so_request = StructuredOutputRequest(params, concurrent.futures.Future())
        so_request.future = self._executor.submit(self._compile, so_request, request.prompt_token_ids)
        request.structured_output_request = so_request

    def _compile(self, so_request: StructuredOutputRequest, prompt_token_ids: list[int]) -> GuidanceGrammar:
        """The request's own matcher; notes whether its reasoning is over before it starts
        (a prompt that closes the think block)."""
        backend = self._get_backend()
        params = so_request.params
        key = json.dumps(dataclasses.asdict(params), sort_keys=True)
        with self._lock:
            template = self._grammars.get(key)
        if template is None:
            template = backend.compile_grammar(params)
            with self._lock:
                self._grammars[key] = template
                while len(self._grammars) > _MAX_CACHED_GRAMMARS:
                    self._grammars.popitem(last=False)
        so_request.reasoning_ended = self._reasoner is None or self._reasoner.is_reasoning_end(prompt_token_ids)
        return GuidanceGrammar(template.matcher.deep_copy(), template.eos_token_id)

    def _get_backend(self) -> GuidanceBackend:
        with self._lock:
            if self._backend is None:
                import transformers

                tokenizer = transformers.AutoTokenizer.from_pretrained(self.tokenizer_name)
                self._reasoner = self._make_reasoner(tokenizer)
                self._backend = GuidanceBackend(tokenizer, self.vocab_size)
            return self._backend

    def _make_reasoner(self, tokenizer):
        if not self.reasoning_parser_name:
            return None
        from vjx.reasoning import ReasoningParserManager

        return ReasoningParserManager.get_reasoning_parser(self.reasoning_parser_name)(tokenizer)

    @staticmethod
    def is_ready(request: Request) -> bool:
        """Whether the request may be scheduled: it has no grammar, or its grammar is done
        compiling (or failed to: `compile_error` says so)."""
        so_request = request.structured_output_request
        return so_request is None or so_request.is_ready

    @staticmethod
    def compile_error(request: Request) -> str | None:
        so_request = request.structured_output_request
        return None if so_request is None else so_request.error

    def accept_tokens(self, request: Request, new_token_ids: list[int]) -> bool:
        """Advances the request's matcher; True when its grammar has ended (it accepted EOS,
        or a token broke it), which ends the request."""
        so_request = request.structured_output_request
        grammar = so_request.grammar
        if not so_request.reasoning_ended:
            # The tokens up to the think-end token are reasoning; the grammar starts after them.
            so_request.reasoning_ended = self._reasoner.is_reasoning_end(request.all_token_ids)
            return False
        grammar.accept_tokens(new_token_ids)
        return grammar.is_terminated

    def grammar_bitmask(
        self, requests: list[Request | None], drafts: list[list[int]] | None = None
    ) -> np.ndarray | None:
        """One row per entry of `requests` (None, or a request without a grammar: all tokens
        allowed), and with `drafts` (speculative decoding) one more row per draft of the
        entry, each the mask after the drafts before it; None when no row is constrained. A
        grammar that allows no token at all ends: its row allows only EOS, and the request
        stops there."""
        drafts = drafts or [[] for _ in requests]
        starts = np.cumsum([0] + [1 + len(d) for d in drafts])
        rows = [
            (i, request.structured_output_request)
            for i, request in enumerate(requests)
            if request is not None
            and request.structured_output_request is not None
            and request.structured_output_request.reasoning_ended
        ]
        if not rows:
            return None
        bitmask = self._backend.allocate_token_bitmask(int(starts[-1]))
        for i, so_request in rows:
            grammar, row = so_request.grammar, int(starts[i])
            if grammar.is_terminated or not grammar.fill_draft_bitmasks(bitmask, row, drafts[i]):
                grammar.is_terminated = True
                _allow_only(bitmask, row, grammar.eos_token_id)
        return bitmask

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _allow_only(bitmask: np.ndarray, row: int, token_id: int) -> None:
    bitmask[row] = 0
    bitmask[row, token_id // 32] = np.int32(np.uint32(1 << (token_id % 32)).view(np.int32))
