"""The checks every value bound for the device passes (vjx/validation.py), and
`SamplingParams` built on them: exact messages, the types accepted, what is normalised."""

import numpy as np
import pytest

from vjx.sampling_params import MAX_N, SamplingParams
from vjx.validation import (
    FLOAT32_MAX,
    INT64_MAX,
    INT64_MIN,
    check_bool,
    check_float,
    check_int,
    check_int_list,
    check_str_list,
)


def test_check_int_takes_python_and_numpy_ints_and_returns_a_python_int():
    value = check_int("top_k", np.int64(7), 0, 10)
    assert value == 7 and type(value) is int
    assert check_int("seed", INT64_MAX) == INT64_MAX and check_int("seed", INT64_MIN) == INT64_MIN


@pytest.mark.parametrize(
    "value, message",
    [
        (True, "top_k must be an integer, got True."),
        (2.0, "top_k must be an integer, got 2.0."),
        ("3", "top_k must be an integer, got '3'."),
        (None, "top_k must be an integer, got None."),
        (-2, "top_k must be in [-1, 9223372036854775807], got -2."),
        (2**63, "top_k must be in [-1, 9223372036854775807], got 9223372036854775808."),
    ],
)
def test_check_int_refusals_name_the_argument_and_range(value, message):
    with pytest.raises(ValueError) as error:
        check_int("top_k", value, -1)
    assert str(error.value) == message


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e308, FLOAT32_MAX * 1.01])
def test_check_float_refuses_what_float32_cannot_hold(value):
    with pytest.raises(ValueError, match=r"^temperature must be a finite number in \[0, 3.40282e\+38\], got "):
        check_float("temperature", value, 0.0)


def test_check_float_bounds_and_types():
    assert check_float("top_p", 1, 0.0, 1.0, low_open=True) == 1.0
    assert check_float("x", FLOAT32_MAX) == FLOAT32_MAX
    with pytest.raises(ValueError, match=r"^top_p must be a finite number in \(0, 1\], got 0.0\.$"):
        check_float("top_p", 0.0, 0.0, 1.0, low_open=True)
    with pytest.raises(ValueError, match="^x must be a number, got False.$"):
        check_float("x", False)
    with pytest.raises(ValueError, match="^x must be a number, got 'hot'.$"):
        check_float("x", "hot")


def test_list_and_bool_checks():
    assert check_int_list("stop_token_ids", (1, np.int32(2))) == [1, 2]
    assert check_str_list("stop", "end") == ["end"]
    with pytest.raises(ValueError, match=r"^stop_token_ids must hold integers in \[0, 9223372036854775807\], got -1"):
        check_int_list("stop_token_ids", [1, -1], 0)
    with pytest.raises(ValueError, match="^stop_token_ids must be a list of integers, got 5.$"):
        check_int_list("stop_token_ids", 5)
    with pytest.raises(ValueError, match="^stop must be a string or a list of strings, got 123.$"):
        check_str_list("stop", 123)
    with pytest.raises(ValueError, match="^stop must hold strings, got 5 in it.$"):
        check_str_list("stop", ["a", 5])
    with pytest.raises(ValueError, match="^stop cannot contain an empty string.$"):
        check_str_list("stop", ["a", ""])
    with pytest.raises(ValueError, match="^ignore_eos must be true or false, got 1.$"):
        check_bool("ignore_eos", 1)


def test_sampling_params_normalises_what_it_accepts():
    """(Arguments of the annotated types: the tests type-check every call into vjx.)"""
    params = SamplingParams(top_k=-1, stop="end", stop_token_ids=[5], logit_bias={3: 250.0, 4: -1e9})
    assert (params.top_k, params.stop, params.stop_token_ids) == (0, ["end"], [5])
    assert params.logit_bias == {3: 100.0, 4: -100.0}
    assert SamplingParams(top_k=INT64_MAX).top_k == INT64_MAX


def test_sampling_params_reads_values_as_vllm_does():
    """True logprobs means 1, seed -1 means no seed, a tiny temperature is raised to 0.01."""
    params = SamplingParams(logprobs=True, prompt_logprobs=True, seed=-1, temperature=1e-3)
    assert (params.logprobs, params.prompt_logprobs, params.seed, params.temperature) == (1, 1, None, 0.01)
    assert SamplingParams(temperature=2.0, n=2).temperature == 2.0


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"temperature": float("nan")}, "temperature must be a finite number in [0, 2], got nan."),
        ({"temperature": 2.5}, "temperature must be a finite number in [0, 2], got 2.5."),
        ({"n": 2, "temperature": 0.0}, "n must be 1 when using greedy sampling (temperature=0), got n=2."),
        ({"logprobs": -1}, "logprobs=-1 (the whole vocabulary) is more than max_logprobs allows."),
        ({"prompt_logprobs": -2}, "prompt_logprobs must be in [0, 9223372036854775807], got -2."),
        ({"stop": ""}, "stop cannot contain an empty string."),
        (
            {"repetition_penalty": float("inf")},
            "repetition_penalty must be a finite number in (0, 3.40282e+38], got inf.",
        ),
        ({"n": MAX_N + 1}, f"n must be in [1, {MAX_N}], got {MAX_N + 1}."),
        ({"max_tokens": 2**64}, "max_tokens must be in [1, 9223372036854775807], got 18446744073709551616."),
        ({"logit_bias": {5: float("nan")}}, "logit_bias values must be finite numbers, got nan for token 5."),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens must be less than or equal to max_tokens=4, got 5."),
    ],
)
def test_sampling_params_refusals(fields, message):
    with pytest.raises(ValueError) as error:
        SamplingParams(**fields)
    assert str(error.value) == message
