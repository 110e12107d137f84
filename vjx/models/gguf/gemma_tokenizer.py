"""Gemma's SentencePiece vocabulary (`tokenizer.ggml.model == "llama"`) as an HF BPE tokenizer.

The GGUF lists pieces, scores and token types but no merges. HF runs Gemma as BPE over text
whose spaces became "\u2581", with byte fallback for what the pieces cannot spell:

    normalizer   " " -> "\u2581"                (no prefix space: add_space_prefix is false)
    model        BPE, merges rebuilt from the vocabulary, byte fallback, fused <unk>
    decoder      "\u2581" -> " ", <0xNN> pieces -> bytes, fused into one string

Two things make the pieces fit that shape. Whitespace-run pieces ("  ", "   ", ...) are
stored with real spaces but the normalized text has none, so they are respelled as runs of
"\u2581". And each merge ranks by the position of the piece it builds, not by its score:
Gemma's scores do not follow its merge order, the vocabulary's order does.
"""

from tokenizers import Tokenizer, decoders, models, normalizers

from vjx.models.gguf.metadata import special_token_ids
from vjx.models.gguf.special_tokens import add_gguf_added_tokens, bos_eos_post_processor

_SPACE = "\u2581"


def build_gemma_tokenizer(metadata: dict) -> Tokenizer:
    """The tokenizer transformers builds for a Gemma GGUF, from the vocabulary alone."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "llama":
        raise ValueError(f"gguf_path: tokenizer model {kind!r} is not supported for Gemma; supported: ['llama']")
    if metadata.get("tokenizer.ggml.add_space_prefix", False):
        raise ValueError("gguf_path: a Gemma vocabulary with add_space_prefix is not supported")
    tokens = [_respell(token) for token in metadata["tokenizer.ggml.tokens"]]
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    unk_id = special_token_ids(metadata).get("unk")
    unk = None if unk_id is None else tokens[unk_id]
    bpe = models.BPE(vocab=vocab, merges=_merges(tokens, vocab), unk_token=unk, fuse_unk=True, byte_fallback=True)
    tokenizer = Tokenizer(bpe)
    tokenizer.normalizer = normalizers.Replace(" ", _SPACE)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    post_processor = bos_eos_post_processor(metadata)
    if post_processor is not None:
        tokenizer.post_processor = post_processor
    # By their file spelling: the whitespace runs are left to the merges, as in transformers.
    add_gguf_added_tokens(tokenizer, metadata["tokenizer.ggml.tokens"], metadata.get("tokenizer.ggml.token_type", []))
    return tokenizer


def _respell(token: str) -> str:
    return _SPACE * len(token) if token and not token.strip(" ") else token


def _merges(tokens: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every (left, right) pair of pieces that joins into a piece, best first.

    Pairs rank by the id of the piece they build; the splits of one piece, longest left part
    first.
    """
    merges = []
    for token in tokens:
        for cut in range(len(token) - 1, 0, -1):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                merges.append((left, right))
    return merges
