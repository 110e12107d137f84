"""An EAGLE-3 head's greedy drafts by full forwards in PyTorch (transformers' Llama blocks),
written from the published head's definition, for comparison with the engine's proposer."""

import torch
import transformers
from safetensors.torch import load_file
from transformers.models.llama import modeling_llama


def _target_aux_hidden_states(target: str, token_ids: list[int], layer_ids: list[int]) -> torch.Tensor:
    """The residual stream entering each of `layer_ids` (the last layer's output for the
    number of layers), concatenated, at every position of `token_ids`."""
    model = transformers.LlamaForCausalLM.from_pretrained(target, attn_implementation="eager").eval()
    layers, captured = model.model.layers, {}

    def keep_input(index):
        def hook(module, args, kwargs):
            captured[index] = args[0] if args else kwargs["hidden_states"]

        return hook

    def keep_output(module, args, output):
        captured[len(layers)] = output[0] if isinstance(output, tuple) else output

    hooks = [layer.register_forward_pre_hook(keep_input(i), with_kwargs=True) for i, layer in enumerate(layers)]
    hooks.append(layers[-1].register_forward_hook(keep_output))
    with torch.no_grad():
        model(torch.tensor([token_ids]))
    for hook in hooks:
        hook.remove()
    return torch.cat([captured[i][0] for i in layer_ids], dim=-1), model.model.embed_tokens


class _Head(torch.nn.Module):
    """The head's one layer: attention over [input_layernorm(embedding); hidden_norm(hidden)]
    with the hidden state as the residual, the MLP, the final norm and LM head apart."""

    def __init__(self, head: str):
        super().__init__()
        config = transformers.LlamaConfig.from_pretrained(head)
        config._attn_implementation = "eager"
        self.weights = load_file(f"{head}/model.safetensors")
        hidden = config.hidden_size
        self.layer = modeling_llama.LlamaDecoderLayer(config, 0)
        for name in ("q_proj", "k_proj", "v_proj"):
            rows = self.weights[f"midlayer.self_attn.{name}.weight"].shape[0]
            setattr(self.layer.self_attn, name, torch.nn.Linear(2 * hidden, rows, bias=False))
        self.layer.load_state_dict(
            {
                k[len("midlayer.") :]: v
                for k, v in self.weights.items()
                if k.startswith("midlayer.") and "hidden_norm" not in k
            }
        )
        self.hidden_norm = modeling_llama.LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.hidden_norm.weight.data = self.weights["midlayer.hidden_norm.weight"]
        self.norm = modeling_llama.LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.norm.weight.data = self.weights["norm.weight"]
        self.rotary = modeling_llama.LlamaRotaryEmbedding(config)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        n = len(embeds)
        x = torch.cat([self.layer.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)[None]
        position_embeddings = self.rotary(hidden[None], torch.arange(n)[None])
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        attn, _ = self.layer.self_attn(x, position_embeddings=position_embeddings, attention_mask=mask)
        x = hidden + attn[0]
        return x + self.layer.mlp(self.layer.post_attention_layernorm(x))

    def draft(self, last: torch.Tensor) -> int:
        draft_id = int(torch.argmax(self.weights["lm_head.weight"] @ self.norm(last)))
        return draft_id + int(self.weights["d2t"][draft_id])


def eagle3_reference_proposal(target: str, head: str, token_ids: list[int], k: int) -> list[int]:
    """The head's k greedy drafts after `token_ids` (the last one newly drawn): position p
    reads (token p + 1, fc of the target's states at p), then the head's own states."""
    layer_ids = transformers.LlamaConfig.from_pretrained(head).eagle_aux_hidden_state_layer_ids
    aux, embed = _target_aux_hidden_states(target, token_ids[:-1], layer_ids)
    model = _Head(head)
    drafts = []
    with torch.no_grad():
        hidden = aux @ model.weights["fc.weight"].T
        embeds = embed(torch.tensor(token_ids[1:]))
        for _ in range(k):
            last = model(embeds, hidden)[-1]
            drafts.append(model.draft(last))
            embeds = torch.cat([embeds, embed(torch.tensor([drafts[-1]]))])
            hidden = torch.cat([hidden, last[None]])
    return drafts
