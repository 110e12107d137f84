"""Quantization methods by vLLM's `quantization=` names (see base.py for the interface)."""

from vjx.quantization.awq import AWQConfig
from vjx.quantization.base import LinearMethod, QuantizationConfig, UnquantizedLinearMethod
from vjx.quantization.compressed_tensors import CompressedTensorsConfig
from vjx.quantization.fp8 import Fp8Config, PtpcFp8Config
from vjx.quantization.gptq import GPTQConfig
from vjx.quantization.mxfp4 import Mxfp4Config

QUANTIZATION_METHODS: dict[str, type[QuantizationConfig]] = {
    cls.get_name(): cls
    for cls in (Fp8Config, PtpcFp8Config, CompressedTensorsConfig, AWQConfig, GPTQConfig, Mxfp4Config)
}
"""`quantization=` value (or a checkpoint's `quant_method`) -> its config class."""
ONLINE_METHODS = ("fp8", "ptpc_fp8")
"""The methods that quantize an unquantized checkpoint at load."""

__all__ = [
    "ONLINE_METHODS",
    "QUANTIZATION_METHODS",
    "LinearMethod",
    "QuantizationConfig",
    "UnquantizedLinearMethod",
    "get_quantization_config",
]


def get_quantization_config(quantization: str | None, hf_config) -> QuantizationConfig | None:
    """The config of a quantized checkpoint (its `quantization_config`; `quantization`, if
    given, must name its method), or of `quantization` applied at load; None: unquantized."""
    checkpoint_config = getattr(hf_config, "quantization_config", None)
    if checkpoint_config:
        checkpoint_config = dict(checkpoint_config)
        method = checkpoint_config.get("quant_method")
        if quantization is not None and quantization != method:
            raise ValueError(f"quantization={quantization!r} does not match the checkpoint's quant_method {method!r}.")
        if method not in QUANTIZATION_METHODS or method not in _CHECKPOINT_METHODS:
            raise ValueError(
                f"the checkpoint is quantized with quant_method {method!r}; vjx loads {sorted(_CHECKPOINT_METHODS)}."
            )
        return QUANTIZATION_METHODS[method].from_config(checkpoint_config)
    if quantization is None:
        return None
    if quantization not in ONLINE_METHODS:
        raise ValueError(
            f"quantization={quantization!r} is not supported by vjx on an unquantized checkpoint: "
            f"only {list(ONLINE_METHODS)} (a quantized checkpoint brings its own method)."
        )
    return QUANTIZATION_METHODS[quantization]()


_CHECKPOINT_METHODS = ("fp8", "compressed-tensors", "awq", "gptq", "mxfp4")
