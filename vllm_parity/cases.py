"""The SamplingParams table of check (c): each case is built as `SamplingParams(**BASE, **kwargs)`
in vLLM and in vjx, then (when it builds) used for one `generate` on a 1-token prompt, where
the checks that need the model (vocabulary, max_logprobs) run.

`KNOWN_DIFFERENCES` names the cases where vjx differs from vLLM on purpose, with the reason;
the check reports them but does not fail on them.
"""

import math

BASE = {"max_tokens": 2}
"""Every case starts from this, so that a case that builds generates only a token or two."""

CASES: list[tuple[str, dict]] = [
    ("defaults", {}),
    ("temperature_negative", {"temperature": -0.1}),
    ("temperature_above_2", {"temperature": 2.5}),
    ("temperature_2", {"temperature": 2.0}),
    ("temperature_tiny", {"temperature": 1e-3}),
    ("temperature_nan", {"temperature": math.nan}),
    ("temperature_inf", {"temperature": math.inf}),
    ("temperature_str", {"temperature": "1.0"}),
    ("top_p_0", {"top_p": 0.0}),
    ("top_p_above_1", {"top_p": 1.5}),
    ("top_p_half", {"top_p": 0.5}),
    ("top_k_minus_2", {"top_k": -2}),
    ("top_k_minus_1", {"top_k": -1}),
    ("top_k_float", {"top_k": 2.5}),
    ("top_k_above_vocab", {"top_k": 10**6}),
    ("min_p_negative", {"min_p": -0.1}),
    ("min_p_above_1", {"min_p": 1.1}),
    ("min_p_half", {"min_p": 0.5}),
    ("presence_penalty_above_2", {"presence_penalty": 2.5}),
    ("presence_penalty_below_minus_2", {"presence_penalty": -3.0}),
    ("frequency_penalty_above_2", {"frequency_penalty": 3.0}),
    ("frequency_penalty_ok", {"frequency_penalty": -1.5}),
    ("repetition_penalty_0", {"repetition_penalty": 0.0}),
    ("repetition_penalty_negative", {"repetition_penalty": -1.0}),
    ("repetition_penalty_inf", {"repetition_penalty": math.inf}),
    ("repetition_penalty_ok", {"repetition_penalty": 1.5}),
    ("n_0", {"n": 0}),
    ("n_negative", {"n": -1}),
    ("n_float", {"n": 2.0}),
    ("n_2_greedy", {"n": 2, "temperature": 0.0}),
    ("n_2_sampled", {"n": 2, "temperature": 1.0}),
    ("best_of", {"best_of": 2}),
    ("logprobs_minus_1", {"logprobs": -1}),
    ("logprobs_minus_2", {"logprobs": -2}),
    ("logprobs_above_max", {"logprobs": 21}),
    ("logprobs_max", {"logprobs": 20}),
    ("logprobs_true", {"logprobs": True}),
    ("prompt_logprobs_above_max", {"prompt_logprobs": 21}),
    ("prompt_logprobs_minus_1", {"prompt_logprobs": -1}),
    ("prompt_logprobs_ok", {"prompt_logprobs": 5}),
    ("stop_empty_str", {"stop": ""}),
    ("stop_list_with_empty", {"stop": ["a", ""]}),
    ("stop_int", {"stop": 123}),
    ("stop_ok", {"stop": ["\n", "."]}),
    ("stop_without_detokenize", {"stop": ["."], "detokenize": False}),
    ("stop_token_ids_negative", {"stop_token_ids": [-1]}),
    ("stop_token_ids_out_of_vocab", {"stop_token_ids": [10**6]}),
    ("stop_token_ids_str", {"stop_token_ids": ["a"]}),
    ("stop_token_ids_ok", {"stop_token_ids": [5, 5]}),
    ("max_tokens_0", {"max_tokens": 0}),
    ("max_tokens_minus_1", {"max_tokens": -1}),
    ("min_tokens_above_max_tokens", {"min_tokens": 5}),
    ("min_tokens_negative", {"min_tokens": -1}),
    ("min_tokens_ok", {"min_tokens": 1}),
    ("seed_minus_1", {"seed": -1}),
    ("seed_ok", {"seed": 1234}),
    ("seed_float", {"seed": 1.5}),
    ("seed_str", {"seed": "abc"}),
    ("logit_bias_clamped", {"logit_bias": {5: 200.0}}),
    ("logit_bias_out_of_vocab", {"logit_bias": {10**6: 1.0}}),
    ("logit_bias_negative_id", {"logit_bias": {-1: 1.0}}),
    ("logit_bias_str_key", {"logit_bias": {"5": 1.0}}),
    ("bad_words_empty_str", {"bad_words": [""]}),
    ("bad_words_ok", {"bad_words": ["hello", "world"]}),
    ("allowed_token_ids_empty", {"allowed_token_ids": []}),
    ("allowed_token_ids_out_of_vocab", {"allowed_token_ids": [10**6]}),
    ("allowed_token_ids_negative", {"allowed_token_ids": [-1]}),
    ("allowed_token_ids_ok", {"allowed_token_ids": [5, 6]}),
    ("truncate_prompt_tokens", {"truncate_prompt_tokens": 5}),
    ("stream_interval_0", {"stream_interval": 0}),
    ("unknown_field", {"no_such_param": 1}),
]

KNOWN_DIFFERENCES: dict[str, str] = {
    "truncate_prompt_tokens": "vjx keeps truncate_prompt_tokens on SamplingParams; vLLM 0.32 moved it to "
    "tokenization_kwargs, so its SamplingParams has no such field.",
    "stream_interval_0": "vjx has no stream_interval (it streams every token): the unknown keyword is a TypeError.",
}
