"""vLLM's import paths and argument helpers, as its example scripts use them, with only the
package name changed."""

import pytest

import vjx
from tests.helpers.fake_engine_core import make_llm
from vjx import AsyncEngineArgs, AsyncLLMEngine, EngineArgs, LLMEngine, SamplingParams
from vjx.engine.arg_utils import AsyncEngineArgs as ArgUtilsAsyncEngineArgs
from vjx.engine.arg_utils import EngineArgs as ArgUtilsEngineArgs
from vjx.inputs import TextPrompt, TokensPrompt
from vjx.outputs import CompletionOutput, RequestOutput
from vjx.sampling_params import RequestOutputKind
from vjx.utils.argparse_utils import FlexibleArgumentParser


def test_top_level_names():
    assert AsyncLLMEngine is vjx.AsyncLLM
    assert LLMEngine.__name__ == "LLMEngine"
    assert ArgUtilsEngineArgs is EngineArgs and ArgUtilsAsyncEngineArgs is AsyncEngineArgs
    assert issubclass(AsyncEngineArgs, EngineArgs)
    assert vjx.RequestOutput is RequestOutput and vjx.CompletionOutput is CompletionOutput
    assert RequestOutputKind.FINAL_ONLY in RequestOutputKind
    assert set(vjx.__all__) >= {"LLM", "LLMEngine", "AsyncLLMEngine", "EngineArgs", "AsyncEngineArgs", "TextPrompt"}


def test_add_cli_args_returns_the_parser_and_from_cli_args_reads_it():
    parser = FlexibleArgumentParser()
    assert EngineArgs.add_cli_args(parser) is parser
    args = parser.parse_args(["--max-model-len", "512", "--tensor-parallel-size=2", "--no-enable-prefix-caching"])
    engine_args = EngineArgs.from_cli_args(args)
    assert (engine_args.max_model_len, engine_args.tensor_parallel_size) == (512, 2)
    assert engine_args.enable_prefix_caching is False
    assert type(AsyncEngineArgs.from_cli_args(args)) is AsyncEngineArgs


def test_flags_may_be_spelled_with_underscores():
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--max_model_len", "256", "--block_size=32", "--model", "a_dir_with_underscores"])
    assert (args.max_model_len, args.block_size, args.model) == (256, 32, "a_dir_with_underscores")
    with pytest.raises(SystemExit):
        parser.parse_args(["--no_such_flag", "1"])


def test_typed_prompts_run(tmp_path, monkeypatch):
    llm = make_llm(tmp_path, monkeypatch)
    prompts = [TextPrompt(prompt="Hello world"), TokensPrompt(prompt_token_ids=[0, 5, 6])]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [3, 3]
    assert outputs[0].prompt == "Hello world"
    assert outputs[1].prompt_token_ids == [0, 5, 6]
