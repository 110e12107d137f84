"""Quantized checkpoints of a random HF model, each beside the same model dequantized.

`write_checkpoint(name, hf_model, quantized_dir, reference_dir, group_size)` writes the model
in format `name` and, as the reference (unless `reference_dir` is None), an unquantized
checkpoint whose weights are the quantized ones dequantized, computed here from the quantized values (not by vjx). The
compressed-tensors formats are written by the `compressed-tensors` package (scales from each
weight's range, static input scales from a calibration forward); AWQ, GPTQ and block-wise FP8
are packed by hand from their published layouts, with round-to-nearest values (no calibration:
what is measured is the format, not the quantizer). `group_size` is the INT4 formats' group and
block-wise FP8's block edge; it must divide the model's hidden and MLP sizes.

The tests (tests/quantization/test_checkpoints.py) and benchmarks/quantization.py both use it;
it needs the test extras (torch, compressed-tensors).
"""

import copy
import json
import pathlib

import safetensors.torch
import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
from compressed_tensors.quantization.lifecycle.forward import fake_quantize
from compressed_tensors.quantization.lifecycle.helpers import disable_quantization, enable_quantization
from compressed_tensors.quantization.utils import calculate_qparams

CALIBRATION_TOKENS = 64
COMPRESSED_TENSORS = {
    "ct_fp8_static": ("FP8", "float-quantized"),
    "ct_fp8_dynamic": ("FP8_DYNAMIC", "float-quantized"),
    "ct_int8": ("W8A8", "int-quantized"),
    "ct_fp8_block": ("FP8_BLOCK", "float-quantized"),
    "ct_w4a16": ("W4A16", "pack-quantized"),
}
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
FORMATS = (*COMPRESSED_TENSORS, "fp8_block", "awq", "gptq", "gptq_act_order")
WEIGHT_ONLY = ("ct_w4a16", "fp8_block", "ct_fp8_block", "awq", "gptq", "gptq_act_order")
"""Formats whose activations stay unquantized: vjx's logits match the reference closely."""


def write_checkpoint(name: str, hf_model: torch.nn.Module, quantized_dir, reference_dir, group_size: int) -> None:
    quantized_dir = pathlib.Path(quantized_dir)
    if name in COMPRESSED_TENSORS:
        preset, fmt = COMPRESSED_TENSORS[name]
        dequantized = _write_compressed_tensors(preset, fmt, copy.deepcopy(hf_model), quantized_dir, group_size)
    else:
        tensors, dequantized, config = _HAND_PACKED[name](_linear_weights(hf_model), group_size)
        tied = {"lm_head.weight"} if hf_model.config.get_text_config().tie_word_embeddings else set()
        state = {
            k: v
            for k, v in hf_model.state_dict().items()
            if k.removesuffix(".weight") not in dequantized and k not in tied
        }
        safetensors.torch.save_file({**state, **tensors}, quantized_dir / "model.safetensors")
        hf_model.config.save_pretrained(quantized_dir)
        config_path = quantized_dir / "config.json"
        config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "quantization_config": config}))
    if reference_dir is None:
        return
    reference = copy.deepcopy(hf_model)
    with torch.no_grad():
        for module_name, weight in dequantized.items():
            reference.get_submodule(module_name).weight.copy_(weight)
    reference.save_pretrained(pathlib.Path(reference_dir))


def _linear_weights(hf_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every linear weight [out, in] but the LM head's, in float32."""
    return {
        name: module.weight.detach().float()
        for name, module in hf_model.named_modules()
        if isinstance(module, torch.nn.Linear) and name != "lm_head"
    }


def _write_compressed_tensors(
    preset: str, fmt: str, model: torch.nn.Module, directory: pathlib.Path, group_size: int
) -> dict:
    scheme = preset_name_to_scheme(preset, ["Linear"])
    for args in (scheme.weights, scheme.input_activations):
        if args is not None and args.group_size:
            args.group_size = group_size
        if args is not None and args.block_structure:
            args.block_structure = [group_size, group_size]
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    _calibrate_input_scales(model)
    dequantized = {}
    for name, module in model.named_modules():
        if getattr(module, "quantization_scheme", None) is None:
            continue
        args = module.quantization_scheme.weights
        weight = module.weight.detach().float()
        low, high = _ranges(weight, args)
        scale, zero_point = calculate_qparams(low, high, args)
        module.weight_scale.data = scale.reshape(module.weight_scale.shape).to(module.weight_scale.dtype)
        module.weight_zero_point.data = zero_point.reshape(module.weight_zero_point.shape).to(
            module.weight_zero_point.dtype
        )
        dequantized[name] = fake_quantize(weight, module.weight_scale, module.weight_zero_point, args)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    model.save_pretrained(directory)
    compressor.update_config(directory)
    return dequantized


def _ranges(weight: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    """The min and max of each of the weight's quantization units (tensor, row, group, block)."""
    strategy = str(getattr(args.strategy, "value", args.strategy))
    out_features, in_features = weight.shape
    if strategy == "tensor":
        units = weight.reshape(1, 1, -1)
    elif strategy == "channel":
        units = weight.reshape(out_features, 1, -1)
    elif strategy == "group":
        units = weight.reshape(out_features, -1, args.group_size)
    else:
        rows, cols = args.block_structure
        units = weight.reshape(out_features // rows, rows, in_features // cols, cols).transpose(1, 2)
        units = units.reshape(out_features // rows, in_features // cols, -1)
    return units.amin(-1), units.amax(-1)


def _calibrate_input_scales(model: torch.nn.Module) -> None:
    """Static input scales from the largest input each layer sees on random tokens."""
    absmax = {}

    def record(module, args):
        absmax[module] = max(absmax.get(module, 0.0), args[0].abs().max().item())

    modules = [m for m in model.modules() if hasattr(m, "input_scale")]
    hooks = [m.register_forward_pre_hook(record) for m in modules]
    model.apply(disable_quantization)
    with torch.no_grad():
        model(torch.randint(2, model.config.vocab_size, (1, CALIBRATION_TOKENS), generator=_generator()))
    model.apply(enable_quantization)
    for hook in hooks:
        hook.remove()
    for module in modules:
        bound = torch.tensor([absmax[module]])
        scale, _ = calculate_qparams(-bound, bound, module.quantization_scheme.input_activations)
        module.input_scale.data = scale.reshape(module.input_scale.shape).to(module.input_scale.dtype)


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _asymmetric_int4(weight: torch.Tensor, rows_of_group: list[torch.Tensor]):
    """Round-to-nearest 4-bit values with a scale (float16) and zero point per group of input
    columns: (q [in, out], scales [groups, out], zeros [groups, out], dequantized [out, in])."""
    w = weight.T  # [in, out]
    q = torch.empty(w.shape, dtype=torch.int32)
    scales, zeros = [], []
    for rows in rows_of_group:
        low, high = w[rows].amin(0).clamp(max=0), w[rows].amax(0).clamp(min=0)
        scale = ((high - low) / 15).clamp(min=1e-8).half()
        zero = torch.round(-low / scale.float()).clamp(1, 15).to(torch.int32)
        q[rows] = torch.clamp(torch.round(w[rows] / scale.float()).to(torch.int32) + zero, 0, 15)
        scales.append(scale)
        zeros.append(zero)
    scales, zeros = torch.stack(scales), torch.stack(zeros)
    dequantized = torch.empty_like(w)
    for group, rows in enumerate(rows_of_group):
        dequantized[rows] = (q[rows] - zeros[group]).float() * scales[group].float()
    return q, scales, zeros, dequantized.T


def _pack(values: torch.Tensor, order=tuple(range(8))) -> torch.Tensor:
    """4-bit values [..., 8n] -> int32 words [..., n]: nibble i of word c holds value 8c + order[i]."""
    values = values.reshape(*values.shape[:-1], -1, 8).to(torch.int64) & 0xF
    words = sum(values[..., order[i]] << (4 * i) for i in range(8))
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _awq(weights: dict, group_size: int) -> tuple[dict, dict, dict]:
    tensors, dequantized = {}, {}
    for name, weight in weights.items():
        in_features = weight.shape[1]
        groups = [torch.arange(start, start + group_size) for start in range(0, in_features, group_size)]
        q, scales, zeros, dequantized[name] = _asymmetric_int4(weight, groups)
        tensors[f"{name}.qweight"] = _pack(q, AWQ_ORDER)
        tensors[f"{name}.qzeros"] = _pack(zeros, AWQ_ORDER)
        tensors[f"{name}.scales"] = scales
    config = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm"}
    return tensors, dequantized, config


def _gptq(weights: dict, group_size: int, act_order: bool = False) -> tuple[dict, dict, dict]:
    """GPTQ v1 tensors; with act-order, the input columns of each group are a random set, the
    same for every layer of one input (as GPTQ's order comes from the input's statistics)."""
    tensors, dequantized, orders = {}, {}, {}
    gen = _generator()
    for name, weight in weights.items():
        in_features = weight.shape[1]
        key = _input_of(name)
        if key not in orders:
            orders[key] = torch.randperm(in_features, generator=gen) if act_order else torch.arange(in_features)
        order = orders[key]
        groups = [order[start : start + group_size] for start in range(0, in_features, group_size)]
        q, scales, zeros, dequantized[name] = _asymmetric_int4(weight, groups)
        g_idx = torch.empty(in_features, dtype=torch.int32)
        for group, rows in enumerate(groups):
            g_idx[rows] = group
        tensors[f"{name}.qweight"] = _pack(q.T).T.contiguous()
        tensors[f"{name}.qzeros"] = _pack(zeros - 1)
        tensors[f"{name}.scales"] = scales
        tensors[f"{name}.g_idx"] = g_idx
    config = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": group_size,
        "desc_act": act_order,
        "sym": False,
        "checkpoint_format": "gptq",
    }
    return tensors, dequantized, config


def _input_of(name: str) -> str:
    """Layers that read the same input share a key (q, k and v; gate and up)."""
    parent, _, leaf = name.rpartition(".")
    return f"{parent}.{_SHARED_INPUTS.get(leaf, leaf)}"


_SHARED_INPUTS = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


def _fp8_block(weights: dict, group_size: int) -> tuple[dict, dict, dict]:
    """DeepSeek / Qwen FP8 layout: `weight` float8_e4m3fn, `weight_scale_inv` per block."""
    tensors, dequantized = {}, {}
    for name, weight in weights.items():
        out_features, in_features = weight.shape
        blocks = weight.reshape(out_features // group_size, group_size, in_features // group_size, group_size)
        scale = blocks.abs().amax((1, 3)).clamp(min=1e-8) / torch.finfo(torch.float8_e4m3fn).max
        full_scale = scale.repeat_interleave(group_size, 0).repeat_interleave(group_size, 1)
        q = (weight / full_scale).to(torch.float8_e4m3fn)
        tensors[f"{name}.weight"] = q
        tensors[f"{name}.weight_scale_inv"] = scale
        dequantized[name] = q.float() * full_scale
    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [group_size, group_size]}
    return tensors, dequantized, config


_HAND_PACKED = {
    "awq": _awq,
    "gptq": _gptq,
    "gptq_act_order": lambda weights, group_size: _gptq(weights, group_size, act_order=True),
    "fp8_block": _fp8_block,
}
