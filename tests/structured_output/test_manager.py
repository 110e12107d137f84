"""StructuredOutputManager with a real scheduler: a constrained request waits for its
grammar, advances it by each token, stops when it ends, fails alone when it cannot compile,
and with a reasoning parser follows its grammar only after its think block."""

import concurrent.futures

import numpy as np
import pytest

from tests.helpers.scheduler import make_request, make_scheduler, runner_output
from tests.helpers.tokenizer import EOS, make_tokenizer
from vjx.core.request import RequestStatus
from vjx.engine.messages import FinishReason
from vjx.sampling_params import StructuredOutputsParams
from vjx.structured_output import StructuredOutputManager
from vjx.structured_output.request import StructuredOutputRequest

VOCAB_SIZE = 320


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    tokenizer = make_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(tokenizer_dir)


def _scheduler(manager):
    scheduler = make_scheduler()
    scheduler.structured_output_manager = manager
    return scheduler


def _wait_ready(request):
    request.structured_output_request.future.result(timeout=30)


def _mask_rows(bitmask: np.ndarray) -> list[set[int]]:
    bits = (bitmask[:, :, None] >> np.arange(32)) & 1
    return [set(np.flatnonzero(row).tolist()) for row in bits.reshape(len(bitmask), -1)]


def _ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_a_constrained_request_runs_its_grammar_to_the_end(tokenizer_dir, tokenizer):
    manager = StructuredOutputManager(tokenizer_dir, VOCAB_SIZE)
    scheduler = _scheduler(manager)
    free = make_request("free", [1, 2, 3])
    choice = StructuredOutputsParams(choice=["Hello"])
    constrained = make_request("c", [1, 2, 3], eos_token_id=EOS, structured_outputs=choice)
    scheduler.add_request(constrained)
    scheduler.add_request(free)
    _wait_ready(constrained)
    out = scheduler.schedule()
    assert list(out.num_scheduled_tokens) == ["c", "free"]
    scheduler.get_grammar_bitmask(out)
    rows = _mask_rows(out.grammar_bitmask)
    hello = _ids(tokenizer, "Hello")
    assert hello[0] in rows[0] and len(rows[1]) >= 300, "the free row allows everything"
    for token in hello:
        outputs = scheduler.update_from_output(out, runner_output(out, {"c": [token], "free": [7]}))
        out = scheduler.schedule()
        scheduler.get_grammar_bitmask(out)
    assert _mask_rows(out.grammar_bitmask)[0] == {EOS}
    outputs = scheduler.update_from_output(out, runner_output(out, {"c": [EOS], "free": [7]}))
    [finished] = [o for o in outputs.outputs if o.request_id == "c"]
    assert finished.finish_reason is FinishReason.STOP
    assert "c" not in scheduler.requests
    manager.shutdown()


def test_ignore_eos_still_ends_with_the_grammar(tokenizer_dir, tokenizer):
    manager = StructuredOutputManager(tokenizer_dir, VOCAB_SIZE)
    scheduler = _scheduler(manager)
    params = StructuredOutputsParams(regex="")
    request = make_request("c", [1, 2], eos_token_id=EOS, ignore_eos=True, max_tokens=10, structured_outputs=params)
    scheduler.add_request(request)
    _wait_ready(request)
    out = scheduler.schedule()
    scheduler.get_grammar_bitmask(out)
    assert _mask_rows(out.grammar_bitmask)[0] == {EOS}
    outputs = scheduler.update_from_output(out, runner_output(out, {"c": [EOS]}))
    assert outputs.outputs[0].finish_reason is FinishReason.STOP
    manager.shutdown()


class _SlowManager(StructuredOutputManager):
    """Compiles only when the test says so."""

    def grammar_init(self, request):
        request.structured_output_request = StructuredOutputRequest(
            request.sampling_params.structured_outputs, concurrent.futures.Future()
        )


def test_a_request_waits_for_its_grammar_and_keeps_its_place(tokenizer_dir):
    scheduler = _scheduler(_SlowManager(tokenizer_dir, VOCAB_SIZE))
    scheduler.add_request(make_request("c", [1, 2], structured_outputs=StructuredOutputsParams(regex="a")))
    scheduler.add_request(make_request("free", [3, 4]))
    out = scheduler.schedule()
    assert list(out.num_scheduled_tokens) == ["free"]
    assert [r.request_id for r in scheduler.waiting] == ["c"]
    scheduler.update_from_output(out, runner_output(out, {"free": [5]}))
    scheduler.requests["c"].structured_output_request.future.set_exception(ValueError("no such grammar"))
    out = scheduler.schedule()
    outputs = scheduler.update_from_output(out, runner_output(out, {"free": [6]}))
    [failed] = [o for o in outputs.outputs if o.request_id == "c"]
    assert failed.finish_reason is FinishReason.ERROR
    assert "c" not in scheduler.requests and not scheduler.waiting
    assert scheduler.requests["free"].status is RequestStatus.RUNNING


def test_the_grammar_starts_after_the_think_block(tokenizer_dir, tokenizer):
    manager = StructuredOutputManager(tokenizer_dir, VOCAB_SIZE, reasoning_parser="deepseek_r1")
    scheduler = _scheduler(manager)
    think, end_think = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    params = StructuredOutputsParams(choice=["Stop"])
    request = make_request("c", [1, think], eos_token_id=EOS, structured_outputs=params)
    scheduler.add_request(request)
    _wait_ready(request)
    word = _ids(tokenizer, "Hello")
    for token in [*word, end_think]:
        out = scheduler.schedule()
        scheduler.get_grammar_bitmask(out)
        assert out.grammar_bitmask is None, "reasoning is free"
        scheduler.update_from_output(out, runner_output(out, {"c": [token]}))
    out = scheduler.schedule()
    scheduler.get_grammar_bitmask(out)
    assert _ids(tokenizer, "Stop")[0] in _mask_rows(out.grammar_bitmask)[0]
    assert word[0] not in _mask_rows(out.grammar_bitmask)[0]
    manager.shutdown()


def test_a_prompt_that_closes_its_think_block_starts_with_the_grammar(tokenizer_dir, tokenizer):
    manager = StructuredOutputManager(tokenizer_dir, VOCAB_SIZE, reasoning_parser="deepseek_r1")
    think, end_think = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    request = make_request("c", [1, think, 5, end_think], structured_outputs=StructuredOutputsParams(regex="a"))
    manager.grammar_init(request)
    _wait_ready(request)
    assert request.structured_output_request.reasoning_ended
    manager.shutdown()
