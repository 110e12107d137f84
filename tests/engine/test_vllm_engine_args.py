"""Every vLLM 0.32 engine argument is accepted by name: implemented ones as before, no-effect
ones with one info line, unsupported ones with a ValueError naming them. No engine starts."""

import dataclasses
import logging
import pathlib

import pytest

import vjx
from vjx.engine import serial
from vjx.engine.vllm_args import (
    NO_EFFECT,
    NO_EFFECT_VALUES,
    SERVER,
    UNSUPPORTED,
    VJX,
    VLLM_ARG_BY_NAME,
    VLLM_ARGS,
    VllmCompatArgs,
)

VLLM_NAMES = [
    line.strip()
    for line in (pathlib.Path(__file__).parent / "vllm_0_32_engine_args.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]
LOGGER = "vjx.engine.vllm_args"


def _other_value(arg):
    """A value other than vLLM's default, of the kind the argument's flag parses."""
    if isinstance(arg.default, bool) or arg.flag == "bool":
        return not arg.default
    if isinstance(arg.default, (int, float)):
        return arg.default + 7
    if arg.flag in ("json", "json_or_str") or isinstance(arg.default, dict):
        return {"some_key": 1}
    if arg.flag in ("strs", "ints") or isinstance(arg.default, list):
        return ["some-item"]
    if arg.flag in ("int", "hint"):
        return 7
    if arg.flag == "float":
        return 0.5
    return "some-value"


def test_the_table_has_every_vllm_field_once():
    assert len(VLLM_NAMES) == 257
    assert [arg.name for arg in VLLM_ARGS] == VLLM_NAMES
    assert {arg.kind for arg in VLLM_ARGS} == {VJX, SERVER, NO_EFFECT, UNSUPPORTED}
    assert all(arg.reason for arg in VLLM_ARGS if arg.kind != VJX)


def test_every_vllm_field_is_a_field_of_both_arg_classes():
    for cls in (vjx.EngineArgs, vjx.AsyncEngineArgs):
        assert set(VLLM_NAMES) <= {f.name for f in dataclasses.fields(cls)}


def test_implemented_fields_are_vjxs_own_documented_fields():
    compat = {f.name for f in dataclasses.fields(VllmCompatArgs)}
    own = {f.name: f for f in dataclasses.fields(vjx.EngineArgs) if f.name not in compat}
    implemented = {arg.name for arg in VLLM_ARGS if arg.kind == VJX}
    assert implemented <= set(own)
    assert all(own[name].metadata["help"] for name in implemented)
    assert compat == {arg.name for arg in VLLM_ARGS if arg.kind != VJX}


def test_every_field_at_vllms_default_is_accepted_silently(caplog):
    defaults = {arg.name: arg.default for arg in VLLM_ARGS if arg.kind != VJX}
    with caplog.at_level(logging.INFO, logger=LOGGER):
        args = vjx.AsyncEngineArgs(model="org/name", **defaults)
    assert caplog.records == []
    assert args.compilation_config is None and args.ignore_patterns == ["original/**/*"]


def test_the_first_field_is_the_model_positionally():
    assert vjx.EngineArgs("org/name", enforce_eager=True).model == "org/name"


@pytest.mark.parametrize("name", [arg.name for arg in VLLM_ARGS if arg.kind in (NO_EFFECT, SERVER)])
def test_no_effect_fields_log_one_info_line(caplog, name):
    value = _other_value(VLLM_ARG_BY_NAME[name])
    with caplog.at_level(logging.INFO, logger=LOGGER):
        args = vjx.EngineArgs(**{name: value})
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert lines == [f"{name}={value!r} has no effect in vjx: {VLLM_ARG_BY_NAME[name].reason}."]
    assert getattr(args, name) == value


# skip_mm_profiling's one other value, True, asks for what vjx does anyway.
@pytest.mark.parametrize(
    "name", [arg.name for arg in VLLM_ARGS if arg.kind == UNSUPPORTED and arg.name != "skip_mm_profiling"]
)
def test_unsupported_fields_raise_naming_the_field(name):
    value = _other_value(VLLM_ARG_BY_NAME[name])
    with pytest.raises(ValueError, match=rf"^{name}=.* is not supported by vjx: "):
        vjx.EngineArgs(**{name: value})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"decode_context_parallel_size": 2}, "decode_context_parallel_size=2 is not supported by vjx"),
        ({"quantization": "bitsandbytes"}, "quantization='bitsandbytes' is not supported by vjx"),
        ({"fully_sharded_loras": True}, "fully_sharded_loras=True is not supported by vjx"),
        ({"enable_lora": True, "max_lora_rank": 0}, r"max_lora_rank must be in \[1, 512\], got 0"),
        ({"enable_lora": True, "max_loras": 4, "max_cpu_loras": 2}, r"max_cpu_loras \(2\) must be >= max_loras \(4\)"),
        (
            {"speculative_config": {"method": "mtp", "model": "x", "num_speculative_tokens": 2}},
            "speculative_config method='mtp' is not built yet",
        ),
        ({"kv_transfer_config": {"kv_connector": "x"}}, "kv_transfer_config={'kv_connector': 'x'} is not supported"),
        (
            {"distributed_executor_backend": "external_launcher"},
            "distributed_executor_backend='external_launcher' is not supported",
        ),
    ],
)
def test_well_known_unsupported_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        vjx.AsyncEngineArgs(**kwargs)


def test_the_llm_refuses_an_unsupported_argument_before_starting_an_engine():
    with pytest.raises(ValueError, match="^quantization='bitsandbytes' is not supported by vjx"):
        vjx.LLM("org/name", quantization="bitsandbytes")


@pytest.mark.parametrize("name, values", sorted(NO_EFFECT_VALUES.items()))
def test_values_that_ask_for_what_vjx_does_are_logged_not_refused(caplog, name, values):
    for value in values:
        with caplog.at_level(logging.INFO, logger=LOGGER):
            vjx.EngineArgs(**{name: value})
    assert len(caplog.records) == len(values)


def test_empty_containers_stand_for_vllms_default(caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        vjx.EngineArgs(compilation_config={}, speculative_config={}, cpu_offload_params=set(), lora_target_modules=[])
    assert caplog.records == []


def test_none_takes_vjxs_default_where_vllm_leaves_it_to_the_platform():
    args = vjx.EngineArgs(block_size=None, max_num_seqs=None, enable_prefix_caching=None, enable_chunked_prefill=None)
    assert (args.block_size, args.max_num_seqs, args.enable_prefix_caching, args.enable_chunked_prefill) == (
        16,
        256,
        True,
        True,
    )


def test_arguments_cross_to_the_engine_process(caplog):
    args = vjx.EngineArgs("org/name", enforce_eager=True, hf_overrides={}, tensor_parallel_size=2)
    decoded = serial.decode_dataclass(serial.encode_dataclass(args), vjx.EngineArgs)
    assert decoded == args
