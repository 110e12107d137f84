"""TokenizerPool: tokenization, detokenization and chat templates off the event loop.

A 15 MB prompt takes seconds to tokenize; on the event loop that would stall every other
request, /health included. Large inputs therefore run in a few worker threads, and only
through calls that let the loop run meanwhile: a fast tokenizer's own `tokenizer.encode`
holds the GIL for long stretches of Python-side work (~0.3 s on 15 MB), while its Rust
backend's batch calls release the GIL for the whole tokenization and give the same ids.
What the backend cannot do without the GIL is hand the ids over: `Encoding.ids` builds
every Python int in one call (~30 ns a token, 0.1 s for 15 MB of English). So a huge text
is tokenized by the same backend in a child process (`python -m serving.tokenizer_pool`),
whose ids come back as bytes that become ints a slice at a time; the child runs at a lower
CPU priority, so on a machine of few cores the server's own threads keep theirs. Small
inputs run inline: a millisecond of work is cheaper than a thread hop, and they never queue
behind a huge one.
"""

import array
import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

NUM_THREADS = 4
INLINE_MAX_SIZE = 4096
"""Characters (or token ids) up to which work runs on the event loop."""
CHILD_MIN_CHARS = 1 << 20
"""Texts from this long are tokenized in a child process (~250k tokens: ~10 ms of ints)."""
SLICE_LEN = 65536
"""Token ids turned into Python ints per call (~2 ms)."""
CHILD_NICENESS = 10
"""How much the tokenizer process lowers its CPU priority (`os.nice`)."""
_ID_TYPECODE = "I"
"""uint32: how the child writes the ids."""

ResultT = TypeVar("ResultT")


class TokenizerPool:
    def __init__(self, tokenizer, num_threads: int = NUM_THREADS):
        self.tokenizer = tokenizer
        self.executor = ThreadPoolExecutor(num_threads, thread_name_prefix="vjx-tokenizer")
        backend = getattr(tokenizer, "backend_tokenizer", None)
        # The backend gives exactly tokenizer.encode's ids unless the tokenizer changes how
        # special tokens in the text are read (`split_special_tokens`), and exactly its text
        # unless `clean_up_tokenization_spaces` edits the decoded text afterwards.
        splits_special_tokens = getattr(tokenizer, "split_special_tokens", False)
        is_plain_encode = backend is not None and backend.encode_special_tokens == splits_special_tokens
        is_plain_decode = backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self.fast_encoder = backend if is_plain_encode else None
        self.fast_decoder = backend if is_plain_decode else None
        self.backend_json = backend.to_str().encode() if is_plain_encode else b""

    async def run(self, size: int, fn: Callable[..., ResultT], *args) -> ResultT:
        """`fn(*args)`: inline when `size` (the input's characters or token ids) is small,
        else in a worker thread."""
        if size <= INLINE_MAX_SIZE:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return await self.run(len(text), self.encode_sync, text, add_special_tokens)

    async def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return await self.run(len(token_ids), self.decode_sync, token_ids, skip_special_tokens)

    def encode_sync(self, text: str, add_special_tokens: bool) -> list[int]:
        """`tokenizer.encode(text)`'s ids, through the GIL-releasing backend when there is one
        (in a child process for a huge text)."""
        if self.fast_encoder is None:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        if len(text) >= CHILD_MIN_CHARS:
            return self._encode_in_child(text, add_special_tokens)
        return self.fast_encoder.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def _encode_in_child(self, text: str, add_special_tokens: bool) -> list[int]:
        flags = [str(int(add_special_tokens)), str(int(self.fast_encoder.encode_special_tokens))]
        command = [sys.executable, "-m", __name__, str(len(self.backend_json)), *flags]
        child = subprocess.run(command, input=self.backend_json + text.encode(), capture_output=True, check=False)
        if child.returncode != 0:
            raise RuntimeError(f"The tokenizer process failed: {child.stderr.decode(errors='replace')[-2000:]}")
        packed = array.array(_ID_TYPECODE)
        packed.frombytes(child.stdout)
        token_ids: list[int] = []
        for start in range(0, len(packed), SLICE_LEN):
            token_ids.extend(packed[start : start + SLICE_LEN].tolist())
        return token_ids

    def decode_sync(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        """`tokenizer.decode(token_ids)`'s text, through the GIL-releasing backend when it
        gives the same."""
        if self.fast_decoder is None:
            return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)
        return self.fast_decoder.decode_batch([token_ids], skip_special_tokens=skip_special_tokens)[0]

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def _child_main(backend_json_len: int, add_special_tokens: bool, encode_special_tokens: bool) -> None:
    """The child process: stdin holds the backend's JSON, then the text (UTF-8); stdout gets
    the text's ids as uint32s."""
    from tokenizers import Tokenizer

    os.nice(CHILD_NICENESS)
    data = sys.stdin.buffer.read()
    backend = Tokenizer.from_str(data[:backend_json_len].decode())
    backend.encode_special_tokens = encode_special_tokens
    text = data[backend_json_len:].decode()
    token_ids = backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
    sys.stdout.buffer.write(array.array(_ID_TYPECODE, token_ids).tobytes())


if __name__ == "__main__":
    _child_main(int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1")
