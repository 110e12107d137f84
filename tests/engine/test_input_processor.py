"""InputProcessor: tokenization, validation errors, and the caller's params left alone."""

import dataclasses

import pytest

from tests.helpers.tokenizer import BOS, EOS, make_tokenizer
from vjx.config import ModelConfig
from vjx.engine.input_processor import InputProcessor
from vjx.sampling_params import SamplingParams

MAX_MODEL_LEN = 8


@pytest.fixture(scope="module")
def processor():
    model_config = ModelConfig(
        model="m",
        tokenizer="m",
        hf_config=None,
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        seed=0,
        load_format="dummy",
    )
    return InputProcessor(model_config, make_tokenizer())


def test_text_prompt_is_tokenized_with_special_tokens(processor):
    params = SamplingParams(max_tokens=4, stop_token_ids=[7])
    request, prompt = processor.process_inputs("r", "Hello world", params, arrival_time=3.0, priority=2)
    assert prompt == "Hello world"
    assert request.prompt_token_ids == [BOS] + processor.tokenizer.encode("Hello world", add_special_tokens=False)
    assert request.prompt_token_ids == [BOS, 273, 272, 222, 88, 291, 288]
    assert (request.request_id, request.arrival_time, request.priority) == ("r", 3.0, 2)
    assert request.eos_token_id == EOS
    assert request.sampling_params == params and request.sampling_params is not params


def test_dict_prompts(processor):
    request, prompt = processor.process_inputs("r", {"prompt": "Hello"}, SamplingParams())
    assert (prompt, request.prompt_token_ids) == ("Hello", [BOS, 273, 272])
    request, prompt = processor.process_inputs("r", {"prompt_token_ids": [5, 6]}, SamplingParams())
    assert (prompt, request.prompt_token_ids) == (None, [5, 6])
    assert request.arrival_time > 0


def test_max_tokens_is_filled_on_a_copy(processor):
    params = SamplingParams(max_tokens=None, stop=["x"])
    request, _ = processor.process_inputs("r", {"prompt_token_ids": [5, 6, 7]}, params)
    assert request.sampling_params.max_tokens == MAX_MODEL_LEN - 3
    assert params.max_tokens is None
    assert request.sampling_params.stop is not params.stop


def test_longest_prompt_leaves_one_output_token(processor):
    prompt = {"prompt_token_ids": [5] * (MAX_MODEL_LEN - 1)}
    request, _ = processor.process_inputs("r", prompt, SamplingParams(max_tokens=None))
    assert request.sampling_params.max_tokens == 1
    with pytest.raises(ValueError, match=r"prompt \(8 tokens\) is longer than max_model_len=8 allows"):
        processor.process_inputs("r", {"prompt_token_ids": [5] * MAX_MODEL_LEN}, SamplingParams())


@pytest.mark.parametrize(
    "prompt, message",
    [
        ({"prompt_token_ids": []}, r"prompt cannot be empty"),
        ({"prompt_token_ids": [5, -1]}, r"token id -1, out of the vocabulary range \[0, 300\)"),
        ({"prompt_token_ids": [300]}, r"token id 300, out of the vocabulary range \[0, 300\)"),
        ({"prompt_token_ids": [1.5]}, r"prompt_token_ids must be a list of ints"),
        ({"tokens": [5]}, r"prompt must be a str"),
    ],
)
def test_bad_prompts(processor, prompt, message):
    with pytest.raises(ValueError, match=message):
        processor.process_inputs("r", prompt, SamplingParams())


def test_stop_token_ids_out_of_vocabulary(processor):
    with pytest.raises(ValueError, match=r"stop_token_ids contains token id 300, .* \[0, 300\)"):
        processor.process_inputs("r", "Hello", SamplingParams(stop_token_ids=[1, 300]))


def test_eos_token_id_override(processor):
    override = InputProcessor(processor.model_config, processor.tokenizer, eos_token_id=42)
    request, _ = override.process_inputs("r", "Hello", SamplingParams())
    assert request.eos_token_id == 42


def test_truncate_prompt_tokens_keeps_the_last_tokens(processor):
    params = SamplingParams(max_tokens=None, truncate_prompt_tokens=3)
    request, prompt = processor.process_inputs("r", "Hello world", params)
    assert prompt == "Hello world"
    assert request.prompt_token_ids == [88, 291, 288]  # "w", "or", "ld"
    assert request.sampling_params.max_tokens == MAX_MODEL_LEN - 3
    request, _ = processor.process_inputs("r", {"prompt_token_ids": [5, 6]}, params)
    assert request.prompt_token_ids == [5, 6]
    # The prompt's length is checked after truncation.
    long_prompt = {"prompt_token_ids": list(range(2 * MAX_MODEL_LEN))}
    request, _ = processor.process_inputs("r", long_prompt, SamplingParams(truncate_prompt_tokens=MAX_MODEL_LEN - 1))
    assert request.prompt_token_ids == list(range(MAX_MODEL_LEN + 1, 2 * MAX_MODEL_LEN))


def test_n_and_detokenize_pass_through(processor):
    params = SamplingParams(n=3, seed=1, detokenize=False)
    request, _ = processor.process_inputs("r", "Hello", params)
    copy = request.sampling_params
    assert (copy.n, copy.seed, copy.detokenize) == (3, 1, False)


@pytest.mark.parametrize("name", ["logprobs", "prompt_logprobs"])
def test_logprobs_above_the_cap_raise(processor, name):
    assert processor.max_logprobs == 20
    with pytest.raises(ValueError, match=rf"{name}=21 is more than max_logprobs=20 allows: ask for at most 20\."):
        processor.process_inputs("r", "Hello", SamplingParams(**{name: 21}))
    request, _ = processor.process_inputs("r", "Hello", SamplingParams(**{name: 20}))
    assert getattr(request.sampling_params, name) == 20


def test_the_cap_comes_from_the_model_config(processor):
    config = dataclasses.replace(processor.model_config, max_logprobs=2)
    with pytest.raises(ValueError, match=r"logprobs=3 is more than max_logprobs=2"):
        InputProcessor(config, processor.tokenizer).process_inputs("r", "Hello", SamplingParams(logprobs=3))


@pytest.mark.parametrize(
    "params, message",
    [
        ({"logit_bias": {5: 1.0, 300: -1.0}}, r"logit_bias contains token id 300, out of the .* \[0, 300\)"),
        ({"logit_bias": {-1: 1.0}}, r"logit_bias contains token id -1, out of the vocabulary range \[0, 300\)"),
        ({"logit_bias": {-1: 1.0, 7: 0.5, 300: 2.0}}, r"logit_bias contains token ids \[-1, 300\], out of"),
        ({"allowed_token_ids": [1, 2, 300]}, r"allowed_token_ids contains token id 300, .* \[0, 300\)"),
        ({"allowed_token_ids": [-3]}, r"allowed_token_ids contains token id -3, .* \[0, 300\)"),
    ],
)
def test_token_ids_out_of_the_vocabulary_raise(processor, params, message):
    with pytest.raises(ValueError, match=message):
        processor.process_inputs("r", "Hello", SamplingParams(**params))


def test_bad_words_are_tokenized_with_and_without_a_leading_space(processor):
    # "hello" starts with " he" after a space (one token either way): both spellings are banned.
    # "Stop" after a space is " " + "Stop" (one token more): only the plain one.
    assert processor.tokenize_bad_words(["hello", " Stop", "the", "world"]) == [
        [258, 272],
        [269, 272],
        [274],
        [264],
        [270],
        [88, 291, 288],
    ]
    assert processor.tokenize_bad_words([]) == []


def test_blank_bad_words_raise(processor):
    with pytest.raises(ValueError, match=r"bad_words must hold non-blank words, got \['ok', ' '\]"):
        processor.process_inputs("r", "Hello", SamplingParams(bad_words=["ok", " "]))
