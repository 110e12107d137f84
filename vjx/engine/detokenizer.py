"""Incremental detokenization of one request's output, with stop-string detection.

Each new token is decoded on a short sliding window of token ids, `[prefix_offset,
read_offset)` for the text already emitted and `[prefix_offset, len)` for the text with the
new tokens, so the cost per token does not grow with the output. The window starts a few
tokens back because decoders that strip a leading space (Metaspace, "first") or join
bytes (ByteLevel) give the right text for a token only in context.

This is what `tokenizers.decoders.DecodeStream` does inside; doing it here costs about 1 us
more per token (the Rust decode is called directly), works the same on every `tokenizers`
version and on Python tokenizers, and lets the end of an output be flushed exactly as
`tokenizer.decode` would show it.
"""

from collections.abc import Callable

from transformers import PreTrainedTokenizerBase

from vjx.engine.messages import EngineCoreRequest, FinishReason

_REPLACEMENT_CHAR = "\ufffd"
"""What a decoder writes for bytes that are not (yet) valid UTF-8."""
_NUM_CONTEXT_TOKENS = 5
"""Prompt tokens the first window starts with, for in-context text of the first output token."""


def _make_decode(tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """The tokenizer's plain decode (no clean-up of spaces): a window's text must not depend
    on where the window starts, and clean-up joins text across window borders."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # The Rust tokenizer directly: the same text as `tokenizer.decode` without its
        # Python overhead, which is most of the per-token cost.
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(
        ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
    )


class IncrementalDetokenizer:
    """The text of one request's output tokens, kept up to date token by token.

    `update` appends the tokens of one step and finds stop strings; `get_next_output_text`
    gives what may be shown now: while streaming, the last `max(len(stop)) - 1` characters
    are held back, so a stop string that is still being generated is never shown.
    With `detokenize=False` it only keeps the token ids and the text stays "".
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, request: EngineCoreRequest):
        params = request.sampling_params
        self.detokenize = params.detokenize
        self.stop: list[str] = list(params.stop)
        self.include_stop_str_in_output = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        self.output_text = ""
        self._decode = _make_decode(tokenizer, params.skip_special_tokens)
        context = list(request.prompt_token_ids[-_NUM_CONTEXT_TOKENS:]) if self.detokenize else []
        if context and self._decode(context).endswith(_REPLACEMENT_CHAR):
            # A prompt cut inside a character would glue its bytes to the first output token.
            context = []
        self._token_ids = context
        self._num_context_tokens = len(context)
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._num_sent_chars = 0
        has_buffer = self.stop and not self.include_stop_str_in_output
        self._stop_buffer_length = max(map(len, self.stop)) - 1 if has_buffer else 0

    @property
    def output_token_ids(self) -> list[int]:
        """A copy of the output token ids so far."""
        return self._token_ids[self._num_context_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self._token_ids) - self._num_context_tokens

    def update(self, new_token_ids: list[int], finish_reason: FinishReason | None) -> str | None:
        """Appends one step's tokens; returns the stop string that ended the request, if any.

        `finish_reason` is EngineCore's. On a stop string, the text is cut at it (after it
        with `include_stop_str_in_output`) and tokens after the one that completed it are
        dropped. A request EngineCore stopped (EOS or a stop token id) keeps that last
        token's id but not its text, unless `include_stop_str_in_output`.
        """
        if not self.detokenize:
            # SamplingParams refuses stop strings without detokenization: nothing to find.
            self._token_ids.extend(new_token_ids)
            return None
        decoded_ids = new_token_ids
        skipped_stop_token_id = None
        if finish_reason == FinishReason.STOP and not self.include_stop_str_in_output and decoded_ids:
            decoded_ids, skipped_stop_token_id = decoded_ids[:-1], decoded_ids[-1]
        for token_id in decoded_ids:
            num_prev_chars = len(self.output_text)
            self._token_ids.append(token_id)
            self.output_text += self._decode_next(is_final=False)
            stop_string = self._check_stop_strings(num_prev_chars)
            if stop_string is not None:
                return stop_string
        if finish_reason is not None:
            # The output ends here: bytes still waiting for the rest of their character
            # are shown as the tokenizer's decode shows them.
            self.output_text += self._decode_next(is_final=True)
        if skipped_stop_token_id is not None:
            self._token_ids.append(skipped_stop_token_id)
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text to show now: all of it, or (`delta`) only what was not shown before."""
        num_chars = len(self.output_text)
        if not finished:
            num_chars = max(num_chars - self._stop_buffer_length, 0)
        if not delta:
            return self.output_text[:num_chars]
        text = self.output_text[self._num_sent_chars : num_chars]
        self._num_sent_chars = max(self._num_sent_chars, num_chars)
        return text

    def _decode_next(self, is_final: bool) -> str:
        """The text that the tokens after `read_offset` add.

        Empty while they end in an incomplete UTF-8 sequence (unless `is_final`) or add no
        text (skipped special tokens); the window then grows until they do.
        """
        token_ids, prefix_offset = self._token_ids, self._prefix_offset
        prefix_text = self._decode(token_ids[prefix_offset : self._read_offset])
        new_text = self._decode(token_ids[prefix_offset:])
        if len(new_text) <= len(prefix_text):
            return ""
        if new_text.endswith(_REPLACEMENT_CHAR) and not is_final:
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        return new_text[len(prefix_text) :]

    def _check_stop_strings(self, num_prev_chars: int) -> str | None:
        """Finds the earliest stop string that ends in the text after `num_prev_chars`
        and cuts the text there."""
        if not self.stop or self.num_output_tokens <= self.min_tokens:
            return None
        match = None
        for stop in self.stop:
            start = self.output_text.find(stop, max(num_prev_chars - len(stop) + 1, 0))
            if start != -1 and (match is None or start < match[0]):
                match = (start, stop)
        if match is None:
            return None
        start, stop = match
        end = start + len(stop) if self.include_stop_str_in_output else start
        self.output_text = self.output_text[:end]
        return stop
