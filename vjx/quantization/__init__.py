"""Quantization methods by vLLM's `quantization=` names (see base.py for the interface)."""

from vjx.quantization.base import LinearMethod, QuantizationConfig, UnquantizedLinearMethod
from vjx.quantization.fp8 import Fp8Config

QUANTIZATION_METHODS: dict[str, type[QuantizationConfig]] = {cls.get_name(): cls for cls in (Fp8Config,)}
"""`quantization=` value -> its config class."""

__all__ = [
    "QUANTIZATION_METHODS",
    "LinearMethod",
    "QuantizationConfig",
    "UnquantizedLinearMethod",
    "get_quantization_config",
]


def get_quantization_config(quantization: str | None, hf_config) -> QuantizationConfig | None:
    """The config of `quantization` (None: none). A checkpoint that is already quantized (its
    config holds a `quantization_config`) is refused: its formats are not built yet."""
    checkpoint_config = getattr(hf_config, "quantization_config", None)
    if checkpoint_config:
        method = dict(checkpoint_config).get("quant_method", "unknown")
        raise ValueError(
            f"the checkpoint is quantized ({method!r}); vjx loads only unquantized checkpoints so far "
            f"(quantization={sorted(QUANTIZATION_METHODS)} quantizes one at load)."
        )
    if quantization is None:
        return None
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization={quantization!r} is not supported by vjx: only {sorted(QUANTIZATION_METHODS)}.")
    return QUANTIZATION_METHODS[quantization]()
