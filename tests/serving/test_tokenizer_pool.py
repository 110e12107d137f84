"""TokenizerPool gives exactly the tokenizer's own ids and texts, on the event loop for small
inputs and in its threads for large ones; json_body gives exactly json.dumps's bytes. No
engine runs."""

import asyncio
import json
import threading
import time

import pytest
import transformers

from serving.chat_utils import apply_chat_template
from serving.json_body import SLICE_LEN, dump_json
from serving.protocol import ChatMessage
from serving.tokenizer_pool import CHILD_MIN_CHARS, INLINE_MAX_SIZE, TokenizerPool
from tests.helpers.tokenizer import make_tokenizer
from vjx.models.default_model import get_default_model_path

pytestmark = pytest.mark.serial

TEXTS = [
    "",
    "Hello world",
    "  two  spaces\n\nand\ttabs ",
    "<|im_start|>user\nHi<|im_end|>",
    "日本語のテキストです。 emoji 😀🎉 and 12345 digits",
    "The quick brown fox jumps over the lazy dog. " * 200,
]


@pytest.fixture(scope="module")
def smollm2():
    return transformers.AutoTokenizer.from_pretrained(get_default_model_path())


@pytest.fixture(scope="module", params=["smollm2", "bos_tokenizer"])
def tokenizer(request, smollm2):
    """The default model's tokenizer, and one whose post-processor adds a BOS."""
    return smollm2 if request.param == "smollm2" else make_tokenizer()


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_gives_the_tokenizers_ids(tokenizer, add_special_tokens):
    pool = TokenizerPool(tokenizer)
    assert pool.fast_encoder is tokenizer.backend_tokenizer
    for text in TEXTS:
        assert pool.encode_sync(text, add_special_tokens) == tokenizer.encode(
            text, add_special_tokens=add_special_tokens
        ), text


def test_a_huge_text_is_tokenized_in_a_child_process_to_the_same_ids(tokenizer):
    text = ("Hello world, 日本語 😀 <bos> and <|im_end|>.\n" * (CHILD_MIN_CHARS // 40 + 1))[:CHILD_MIN_CHARS]
    pool = TokenizerPool(tokenizer)
    for add_special_tokens in (True, False):
        expected = tokenizer.encode(text, add_special_tokens=add_special_tokens)
        assert pool.encode_sync(text, add_special_tokens) == expected


def test_chat_template_prompt_gives_the_tokenizers_ids(smollm2):
    pool = TokenizerPool(smollm2)
    messages = [
        ChatMessage(role="system", content="You are terse."),
        ChatMessage(role="user", content="What is 2+2? " * 50),
        ChatMessage(role="assistant", content="4"),
        ChatMessage(role="user", content="And <|im_end|> 3+3?"),
    ]
    text = apply_chat_template(smollm2, messages, None)
    assert pool.encode_sync(text, False) == smollm2.encode(text, add_special_tokens=False)
    assert smollm2.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages], tokenize=True, add_generation_prompt=True
    )["input_ids"] == pool.encode_sync(text, False)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_gives_the_tokenizers_text(tokenizer, skip_special_tokens):
    pool = TokenizerPool(tokenizer)
    for text in TEXTS:
        token_ids = tokenizer.encode(text)
        assert pool.decode_sync(token_ids, skip_special_tokens) == tokenizer.decode(
            token_ids, skip_special_tokens=skip_special_tokens
        )


def test_small_inputs_run_inline_and_large_ones_in_a_thread(smollm2):
    pool = TokenizerPool(smollm2)
    threads = []

    def where(_):
        threads.append(threading.current_thread().name)

    async def run():
        await pool.run(INLINE_MAX_SIZE, where, None)
        await pool.run(INLINE_MAX_SIZE + 1, where, None)
        large = "Hello there, " * 10_000
        assert await pool.encode(large, True) == smollm2.encode(large)
        assert await pool.decode(smollm2.encode(large)) == large

    asyncio.run(run())
    pool.shutdown()
    assert threads[0] == threading.main_thread().name and threads[1].startswith("vjx-tokenizer")


def test_a_large_encode_leaves_the_gil_to_other_threads(smollm2):
    """A ticker thread keeps running while 2 MB are tokenized (a plain tokenizer.encode
    holds the GIL for tens of ms at a time on this much)."""
    pool = TokenizerPool(smollm2)
    text = "The quick brown fox jumps over the lazy dog. " * 45_000
    gaps, done = [], threading.Event()

    def tick():
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    token_ids = pool.encode_sync(text, True)
    done.set()
    ticker.join()
    assert len(token_ids) == 450_001  # ten per sentence, and the last space
    assert max(gaps) < 0.05, f"the ticker waited {max(gaps) * 1000:.0f} ms"


def test_dump_json_matches_json_dumps():
    content = {
        "count": 3,
        "tokens": list(range(2 * SLICE_LEN + 7)),
        "token_strs": ['a"b', "é", "\n"] * SLICE_LEN,
        "nested": {"empty": [], "exact": list(range(SLICE_LEN)), "text": "日本"},
    }
    assert json.loads(dump_json(content)) == content
    assert dump_json(content) == json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode()
