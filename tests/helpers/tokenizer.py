"""The test tokenizer: a 300-token byte-level BPE trained in memory (no download).

Its CJK and emoji characters are split over several byte tokens, which is what the
detokenizer's multi-byte tests need. Every encoded text starts with <bos>.
"""

import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

_CORPUS = [
    "Hello world, hello vjx!",
    "The quick brown fox jumps over the lazy dog.",
    "日本語のテキストです。",
    "emoji 😀 and 🎉 party",
    "Stop here. Then stop there.",
]
BOS, EOS = 0, 1


def make_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A 300-token byte-level BPE with <bos> (added to every encoded text) and <eos>."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>")


def text_ids(tokenizer, text: str) -> list[int]:
    """The text's token ids, without the <bos> that `tokenizer.encode` adds."""
    return tokenizer.encode(text, add_special_tokens=False)
