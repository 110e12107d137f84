"""Hostile and extreme completion requests, as `/v1/completions` bodies, shared by the server
test (each must get its 4xx JSON within a second, or complete) and the offline test (the
same request through `LLM.generate` must raise `ValueError`, or complete).

A case is (name, changes to `GOOD`, HTTP status, the error's `param`, offline outcome):
the offline outcome is "error", "ok", or None for a field only the server has (its limits,
`model`, `echo` without logprobs, ...). Where vLLM accepts a value, vjx accepts it too: a
one-token prompt with prompt logprobs, top_k past the vocabulary or int32, many stop ids.
"""

import math

GOOD = {"prompt": "Hello", "max_tokens": 4}
NAN, INF = math.nan, math.inf
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1
MANY_STOP_IDS = list(range(100, 140))
"""Forty valid stop ids: more than the step's min_tokens table holds."""


def completion(**changes) -> dict:
    return {**GOOD, **changes}


# (name, changes, status, param, offline)
SAMPLING_CASES = [
    # Killed the engine before: each must now run (vLLM accepts them).
    ("prompt_logprobs on a one-token prompt", dict(prompt=[1], prompt_logprobs=20), 200, None, "ok"),
    ("echo logprobs=0 on a one-token prompt", dict(prompt=[1], echo=True, logprobs=0), 200, None, "ok"),
    ("top_k of 2^31", dict(top_k=2**31), 200, None, "ok"),
    ("top_k of 2^63 - 1", dict(top_k=INT64_MAX), 200, None, "ok"),
    ("16 stop ids", dict(stop_token_ids=list(range(100, 116))), 200, None, "ok"),
    ("40 stop ids under min_tokens", dict(stop_token_ids=MANY_STOP_IDS, min_tokens=3), 200, None, "ok"),
    ("seed of 2^63 - 1 with n=2", dict(seed=INT64_MAX, n=2), 200, None, "ok"),
    ("min_tokens equal to max_tokens", dict(min_tokens=4, stop_token_ids=MANY_STOP_IDS), 200, None, "ok"),
    ("repetition_penalty 1e30", dict(repetition_penalty=1e30), 200, None, "ok"),
    ("logit_bias at the limits", dict(logit_bias={"5": 100, "6": -100}), 200, None, "ok"),
    # Not finite, or not finite as float32.
    ("temperature NaN", dict(temperature=NAN), 400, "temperature", "error"),
    ("temperature Infinity", dict(temperature=INF), 400, "temperature", "error"),
    ("temperature 1e308", dict(temperature=1e308), 400, "temperature", "error"),
    # Past vLLM's range of [0, 2].
    ("temperature 1e30", dict(temperature=1e30), 400, "temperature", "error"),
    ("repetition_penalty NaN", dict(repetition_penalty=NAN), 400, "repetition_penalty", "error"),
    ("repetition_penalty Infinity", dict(repetition_penalty=INF), 400, "repetition_penalty", "error"),
    ("top_p NaN", dict(top_p=NAN), 400, "top_p", "error"),
    ("min_p NaN", dict(min_p=NAN), 400, "min_p", "error"),
    ("min_p above 1", dict(min_p=1.5), 400, "min_p", "error"),
    ("presence_penalty NaN", dict(presence_penalty=NAN), 400, "presence_penalty", "error"),
    ("frequency_penalty -Infinity", dict(frequency_penalty=-INF), 400, "frequency_penalty", "error"),
    ("logit_bias NaN", dict(logit_bias={"5": NAN}), 400, "logit_bias", "error"),
    # Integers past what the wire or the step can hold.
    ("top_k of 2^64", dict(top_k=2**64), 400, "top_k", "error"),
    ("top_k below -1", dict(top_k=-2), 400, "top_k", "error"),
    ("seed below int64", dict(seed=-(2**63) - 1), 400, "seed", "error"),
    ("priority past int64", dict(priority=2**63), 400, "priority", None),
    ("min_tokens of 2^40", dict(min_tokens=2**40), 400, "min_tokens", "error"),
    ("max_tokens of 2^64", dict(max_tokens=2**64), 400, "max_tokens", None),
    ("logprobs of 2^63", dict(logprobs=2**63), 400, "logprobs", "error"),
    ("prompt_logprobs over max_logprobs", dict(prompt_logprobs=21), 400, "prompt_logprobs", "error"),
    ("truncate_prompt_tokens zero", dict(truncate_prompt_tokens=0), 400, "truncate_prompt_tokens", "error"),
    ("n of 2^63", dict(n=2**63), 400, "n", "error"),
    # Token ids and tables.
    ("stop_token_ids out of the vocabulary", dict(stop_token_ids=[10**9]), 400, "stop_token_ids", "error"),
    ("stop_token_ids negative", dict(stop_token_ids=[-1]), 400, "stop_token_ids", "error"),
    ("allowed_token_ids out of the vocabulary", dict(allowed_token_ids=[2**40]), 400, "allowed_token_ids", "error"),
    ("allowed_token_ids negative", dict(allowed_token_ids=[-7]), 400, "allowed_token_ids", "error"),
    ("logit_bias id out of the vocabulary", dict(logit_bias={"99999999": 1}), 400, "logit_bias", "error"),
    ("prompt token id past int64", dict(prompt=[2**64]), 400, None, "error"),
    ("1000 bad words", dict(bad_words=[f"w{i}" for i in range(1000)]), 400, "bad_words", "error"),
    ("blank bad word", dict(bad_words=["  "]), 400, "bad_words", "error"),
    ("a stop string not a string", dict(stop=["a", 5]), 400, "stop", None),
    # The server's limits (their defaults).
    ("10,000 prompts", dict(prompt=["x"] * 10_000), 400, "prompt", None),
    ("1000 stop strings", dict(stop=[f"s{i}" for i in range(1000)]), 400, "stop", None),
    ("a 5000-character stop string", dict(stop=["y" * 5000]), 400, "stop", None),
    # A constraint that cannot compile.
    ("json_schema without its schema", dict(response_format={"type": "json_schema"}), 400, "response_format", None),
    ("a regex that does not parse", dict(structured_outputs={"regex": "(a"}), 400, "structured_outputs", None),
    # Fields vjx does not honour yet.
    ("guided_json", dict(guided_json={"type": "object"}), 400, "guided_json", None),
    ("functions", dict(functions=[{"name": "f", "parameters": {}}]), 400, "functions", None),
    # Served from outside the engine, so only the server has it.
    ("use_beam_search", dict(use_beam_search=True, n=2, max_tokens=2), 200, None, None),
]


def offline_request(changes: dict):
    """A case as (prompt, SamplingParams keyword arguments) for `LLM.generate`."""
    body = completion(**changes)
    prompt = body.pop("prompt")
    if isinstance(prompt, list):
        prompt = {"prompt_token_ids": prompt}
    if body.pop("echo", False) and body.get("logprobs") is not None:
        body["prompt_logprobs"] = body["logprobs"]
    if "logit_bias" in body:
        body["logit_bias"] = {int(token): float(bias) for token, bias in body["logit_bias"].items()}
    return prompt, body
