"""The tokenizer pieces every GGUF vocabulary shares: added tokens, BOS/EOS and
tokenizer_config.json. The vocabulary models themselves live in `bpe_tokenizer` and
`gemma_tokenizer`."""

from tokenizers import AddedToken, Tokenizer, processors

from vjx.models.gguf.metadata import special_token_ids

# llama.cpp's token types (`llama_token_type`): which entries are added tokens.
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


def add_gguf_added_tokens(tokenizer: Tokenizer, tokens: list[str], token_types: list[int]) -> None:
    """Makes the GGUF's control and user-defined tokens match whole, before the model runs.

    Control tokens are also "special" (dropped by skip_special_tokens), user-defined ones are
    not. A user-defined token the vocabulary spells differently is left to the model.
    """
    vocab = tokenizer.get_vocab()
    control = [tokens[i] for i, kind in enumerate(token_types) if kind == TOKEN_TYPE_CONTROL]
    user_defined = [tokens[i] for i, kind in enumerate(token_types) if kind == TOKEN_TYPE_USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in control])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user_defined if t in vocab])


def bos_eos_post_processor(metadata: dict) -> processors.TemplateProcessing | None:
    """Adds BOS/EOS around each sequence where the GGUF asks llama.cpp to; None if it asks neither."""
    tokens = metadata["tokenizer.ggml.tokens"]
    special_ids = special_token_ids(metadata)
    edges = {}
    for edge in ("bos", "eos"):
        if metadata.get(f"tokenizer.ggml.add_{edge}_token", False):
            edges[edge] = (tokens[special_ids[edge]], special_ids[edge])
    if not edges:
        return None
    head = [edges["bos"][0]] if "bos" in edges else []
    tail = [edges["eos"][0]] if "eos" in edges else []
    return processors.TemplateProcessing(
        single=" ".join([*head, "$A", *tail]),
        pair=" ".join([*head, "$A", *tail, *[f"{t}:1" for t in head], "$B:1", *[f"{t}:1" for t in tail]]),
        special_tokens=sorted(set(edges.values())),
    )


def tokenizer_config_json(metadata: dict, default_chat_template: str | None) -> dict:
    """Special tokens, add_bos/add_eos, the length limit and the chat template.

    The GGUF's own chat template wins; `default_chat_template` stands in when it has none.
    """
    tokens = metadata["tokenizer.ggml.tokens"]
    arch = metadata["general.architecture"]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(metadata[f"{arch}.context_length"]),
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        # llama.cpp detokenizes without tidying spaces around punctuation; so does HF here.
        "clean_up_tokenization_spaces": False,
    }
    for name, token_id in special_token_ids(metadata).items():
        config[f"{name}_token"] = tokens[token_id]
    chat_template = metadata.get("tokenizer.chat_template", default_chat_template)
    if chat_template is not None:
        config["chat_template"] = chat_template
    return config
