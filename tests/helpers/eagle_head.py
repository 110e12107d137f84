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


EAGLE3_AUX_LAYERS = [0, 1, 2]
"""The stand-in target's embedding output, its first layer's and its last layer's (of 2)."""
EAGLE3_DRAFT_VOCAB = 4096


def save_eagle3_head(path: pathlib.Path, target: str, seed: int = 0, layer_ids: list[int] = EAGLE3_AUX_LAYERS) -> str:
    """An EAGLE-3 head for the model in `target`, in yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's
    layout: `midlayer.*` (its attention reads [2D]), `midlayer.hidden_norm`, `norm`, `fc`
    [D, 3D], its own `lm_head` over a draft vocabulary of `EAGLE3_DRAFT_VOCAB` target ids
    (`d2t` offsets, `t2d` membership), a copy of the embedding the engine skips; it reads the
    target layers `layer_ids`."""
    fields = json.loads((pathlib.Path(target) / "config.json").read_text(encoding="utf-8"))
    config = transformers.LlamaConfig(**{**fields, "num_hidden_layers": 1, "tie_word_embeddings": False})
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).model
    hidden, vocab = config.hidden_size, config.vocab_size
    tensors = {
        name.replace("layers.0.", "midlayer."): value.detach().clone().contiguous()
        for name, value in model.state_dict().items()
        if name.startswith("layers.0.")
    }
    for name in ("q_proj", "k_proj", "v_proj"):
        weight = tensors[f"midlayer.self_attn.{name}.weight"]
        tensors[f"midlayer.self_attn.{name}.weight"] = torch.randn(weight.shape[0], 2 * hidden) * 0.05
    for name in ("midlayer.input_layernorm", "midlayer.hidden_norm", "norm"):
        tensors[f"{name}.weight"] = 1 + 0.1 * torch.randn(hidden)
    tensors["fc.weight"] = torch.randn(hidden, len(layer_ids) * hidden) * 0.05
    tensors["lm_head.weight"] = torch.randn(EAGLE3_DRAFT_VOCAB, hidden) * 0.05
    target_ids = torch.sort(torch.randperm(vocab)[:EAGLE3_DRAFT_VOCAB]).values
    tensors["d2t"] = target_ids - torch.arange(EAGLE3_DRAFT_VOCAB)
    tensors["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill(0, target_ids, True)
    tensors["embed_tokens.weight"] = model.embed_tokens.weight.detach().clone()
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    config.architectures = ["LlamaForCausalLMEagle3"]
    config.draft_vocab_size = EAGLE3_DRAFT_VOCAB
    config.eagle_aux_hidden_state_layer_ids = layer_ids
    config.save_pretrained(path)
    return str(path)
