"""A random EAGLE-1 head in the published checkpoint layout (yuhuili/EAGLE-LLaMA3-Instruct-8B's
names): `fc.weight` [D, 2D], `layers.0.*` without the first layer's input norm, and a copy of
the target's embedding (`embed_tokens.weight`), which the engine skips; config.json a Llama's."""

import json
import pathlib

import torch
import transformers
from safetensors.torch import save_file


def save_eagle_head(path: pathlib.Path, target: str, seed: int = 0) -> str:
    """Writes a one-layer head for the model in `target` (its hidden size and vocabulary)."""
    fields = json.loads((pathlib.Path(target) / "config.json").read_text(encoding="utf-8"))
    config = transformers.LlamaConfig(**{**fields, "num_hidden_layers": 1})
    torch.manual_seed(seed)
    layer = transformers.LlamaForCausalLM(config).model
    hidden = config.hidden_size
    tensors = {
        name: value.detach().clone().contiguous()
        for name, value in layer.state_dict().items()
        if name.startswith("layers.0.") and "input_layernorm" not in name
    }
    tensors["fc.weight"] = torch.randn(hidden, 2 * hidden) * 0.05
    tensors["embed_tokens.weight"] = layer.embed_tokens.weight.detach().clone()
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    config.save_pretrained(path)
    return str(path)
