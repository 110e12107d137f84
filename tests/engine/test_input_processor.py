"""InputProcessor: tokenization, validation errors, and the caller's params left alone."""

import pytest

from tests.engine.test_output_processor import BOS, EOS, make_tokenizer
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
