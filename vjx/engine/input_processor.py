"""Turns a user's prompt and sampling parameters into a validated `EngineCoreRequest`.

The front-end half before EngineCore: everything that can be wrong with a request is found
here, as a `ValueError` naming the argument, so EngineCore only ever sees valid requests.
"""

import dataclasses
import operator
import os
import time
from typing import Any

from transformers import PreTrainedTokenizerBase

from vjx.config import ModelConfig
from vjx.engine.messages import EngineCoreRequest
from vjx.lora.config import LoRAConfig
from vjx.lora.request import LoRARequest
from vjx.models.generation_config import extra_eos_token_ids
from vjx.sampling_params import MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS, SamplingParams
from vjx.structured_output.backend_guidance import validate_structured_outputs
from vjx.validation import check_int

PromptType = str | dict[str, Any]
"""A text, `{"prompt": text}`, or `{"prompt_token_ids": [ids]}`; a dict may add `"cache_salt"`."""


class InputProcessor:
    """Tokenizes and validates requests for one model."""

    def __init__(
        self,
        model_config: ModelConfig,
        tokenizer: PreTrainedTokenizerBase,
        eos_token_id: int | None = None,
        *,
        lora_config: LoRAConfig | None = None,
    ):
        """`eos_token_id` overrides the tokenizer's. The generation config's other EOS ids
        become stop token ids of every request (unless `ignore_eos`), as in vLLM.
        `model_config.max_logprobs` caps `logprobs` and `prompt_logprobs`."""
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        generation_config = model_config.try_get_generation_config()
        self.extra_eos_token_ids = extra_eos_token_ids(generation_config, self.eos_token_id)
        self.vocab_size = len(tokenizer)
        self.max_logprobs = model_config.max_logprobs
        self.lora_config = lora_config

    def process_inputs(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> tuple[EngineCoreRequest, str | None]:
        """Returns the request for EngineCore and the prompt's text (None for token prompts).

        The request owns a copy of `params` (with `max_tokens` filled in when it is None),
        so the caller may reuse or change theirs. With `truncate_prompt_tokens=k` only the
        prompt's last k tokens run; the text returned is still the whole prompt.
        """
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}.")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}.")
        priority = check_int("priority", priority)
        if lora_request is not None:
            self.check_lora_request(lora_request)
        cache_salt = None
        if isinstance(prompt, dict) and "cache_salt" in prompt:
            prompt = dict(prompt)
            cache_salt = prompt.pop("cache_salt")
            if not isinstance(cache_salt, str) or not cache_salt:
                raise ValueError(f"cache_salt must be a non-empty string, got {cache_salt!r}.")
        prompt_text, prompt_token_ids = self._tokenize(prompt)
        if params.truncate_prompt_tokens is not None:
            prompt_token_ids = prompt_token_ids[-params.truncate_prompt_tokens :]
        self._validate_prompt(prompt_token_ids)
        params = self._validate_params(params, len(prompt_token_ids))
        request = EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            eos_token_id=self.eos_token_id,
            arrival_time=time.time() if arrival_time is None else arrival_time,
            priority=priority,
            cache_salt=cache_salt,
            lora_request=lora_request,
        )
        return request, prompt_text

    def check_lora_request(self, lora_request: LoRARequest) -> None:
        """A LoRARequest, on an engine with LoRA, naming a PEFT adapter directory."""
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request must be a vjx LoRARequest, got {type(lora_request).__name__}.")
        if self.lora_config is None:
            raise ValueError(f"lora_request {lora_request.lora_name!r} needs an engine started with enable_lora=True.")
        if not os.path.isfile(os.path.join(lora_request.lora_path, "adapter_config.json")):
            raise ValueError(
                f"lora_request {lora_request.lora_name!r}: lora_path {lora_request.lora_path!r} is not a PEFT "
                "adapter directory (no adapter_config.json)."
            )

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """The prompt's text (None for token prompts) and its token ids."""
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and len(prompt) == 1 and "prompt" in prompt:
            return self._tokenize(prompt["prompt"])
        if isinstance(prompt, dict) and len(prompt) == 1 and "prompt_token_ids" in prompt:
            try:
                return None, [operator.index(token_id) for token_id in prompt["prompt_token_ids"]]
            except TypeError:
                raise ValueError(
                    f"prompt_token_ids must be a list of ints, got {prompt['prompt_token_ids']!r}."
                ) from None
        raise ValueError(
            f'prompt must be a str, {{"prompt": str}} or {{"prompt_token_ids": list[int]}}, got {prompt!r}.'
        )

    def _validate_prompt(self, prompt_token_ids: list[int]) -> None:
        if not prompt_token_ids:
            raise ValueError("prompt cannot be empty: it must have at least 1 token.")
        self._check_token_ids("prompt_token_ids", prompt_token_ids)
        max_model_len = self.model_config.max_model_len
        if len(prompt_token_ids) >= max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_token_ids)} tokens) is longer than max_model_len={max_model_len} "
                f"allows: it must have at most {max_model_len - 1} tokens, to leave room for "
                "at least 1 output token."
            )

    def _validate_params(self, params: SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        """A copy of `params`, checked against the vocabulary and the logprobs cap, with
        `max_tokens` set and the extra EOS ids added to `stop_token_ids`."""
        self._check_token_ids("stop_token_ids", params.stop_token_ids)
        self._check_token_ids("logit_bias", list(params.logit_bias or {}))
        self._check_token_ids("allowed_token_ids", params.allowed_token_ids or [])
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > self.max_logprobs:
                raise ValueError(
                    f"{name}={value} is more than max_logprobs={self.max_logprobs} allows: "
                    f"ask for at most {self.max_logprobs}."
                )
        if params.structured_outputs is not None:
            validate_structured_outputs(params.structured_outputs)
        bad_words_token_ids = self.tokenize_bad_words(params.bad_words)
        max_tokens = params.max_tokens
        if max_tokens is None:
            max_tokens = self.model_config.max_model_len - num_prompt_tokens
        stop_token_ids = list(params.stop_token_ids)
        if not params.ignore_eos:
            stop_token_ids += [t for t in self.extra_eos_token_ids if t not in stop_token_ids]
        params = dataclasses.replace(
            params,
            stop=list(params.stop),
            stop_token_ids=stop_token_ids,
            max_tokens=max_tokens,
        )
        params.bad_words_token_ids = bad_words_token_ids or None
        return params

    def _check_token_ids(self, name: str, token_ids: list[int]) -> None:
        bad_ids = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad_ids:
            named = f"token id {bad_ids[0]}" if len(bad_ids) == 1 else f"token ids {bad_ids}"
            raise ValueError(f"{name} contains {named}, out of the vocabulary range [0, {self.vocab_size}).")

    def tokenize_bad_words(self, bad_words: list[str]) -> list[list[int]]:
        """The token ids of each bad word, as vLLM bans them: the word as it would start the
        text, and also after a space when that gives a different first token but as many
        tokens (a leading-space variant of the same word)."""
        token_ids: list[list[int]] = []
        for word in bad_words:
            word = word.lstrip()
            if not word:
                raise ValueError(f"bad_words must hold non-blank words, got {bad_words!r}.")
            plain = self.tokenizer.encode(word, add_special_tokens=False)
            token_ids.append(plain)
            spaced = self.tokenizer.encode(" " + word, add_special_tokens=False)
            if spaced[0] != plain[0] and len(spaced) == len(plain):
                token_ids.append(spaced)
        for ids in token_ids:
            self._check_token_ids("bad_words", ids)
        if len(token_ids) > MAX_BAD_WORDS or any(len(ids) > MAX_BAD_WORD_TOKENS for ids in token_ids):
            raise ValueError(
                f"bad_words must tokenize to at most {MAX_BAD_WORDS} sequences (each word with and "
                f"without a leading space) of at most {MAX_BAD_WORD_TOKENS} tokens, got "
                f"{[len(ids) for ids in token_ids]}."
            )
        return token_ids
