"""A GGUF's byte-level BPE vocabulary (`tokenizer.ggml.model == "gpt2"`) as an HF tokenizer."""

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from vjx.models.gguf.special_tokens import add_gguf_added_tokens, bos_eos_post_processor

# The GPT-2 split (`'s|'t|...| ?\p{L}+| ?\p{N}+|...`) is ByteLevel's built-in regex.
_ISOLATE_DIGITS = r"\p{N}"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> the regexes llama.cpp splits with, applied in order; None stands
# for the GPT-2 split.
_PRE_TOKENIZER_SPLITS = {
    "gpt2": (None,),
    "mpt": (None,),
    "olmo": (None,),
    "smollm": (_ISOLATE_DIGITS, None),
    "starcoder": (_ISOLATE_DIGITS, None),
    "refact": (_ISOLATE_DIGITS, None),
    "codeshell": (_ISOLATE_DIGITS, None),
    "llama-bpe": (_LLAMA3_SPLIT,),
    "llama3": (_LLAMA3_SPLIT,),
}


def build_bpe_tokenizer(metadata: dict) -> Tokenizer:
    """Vocabulary and merges as the file lists them, split the way llama.cpp splits."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"gguf_path: tokenizer model {kind!r} is not supported; supported: ['gpt2']")
    tokens = metadata["tokenizer.ggml.tokens"]
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    merges = [tuple(merge.split(" ")) for merge in metadata["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(metadata.get("tokenizer.ggml.pre", "gpt2"))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = bos_eos_post_processor(metadata) or processors.ByteLevel(trim_offsets=False)
    add_gguf_added_tokens(tokenizer, tokens, metadata.get("tokenizer.ggml.token_type", []))
    return tokenizer


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre not in _PRE_TOKENIZER_SPLITS:
        raise ValueError(
            f"gguf_path: pre-tokenizer {pre!r} is not supported; supported: {sorted(_PRE_TOKENIZER_SPLITS)}"
        )
    splits = _PRE_TOKENIZER_SPLITS[pre]
    steps = [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in splits if split is not None]
    # ByteLevel maps bytes to the vocabulary's alphabet; it also runs the GPT-2 split where
    # the table asks for it.
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=None in splits))
    return pre_tokenizers.Sequence(steps)
