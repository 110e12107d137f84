r"""One engine of the CPU side by side (benchmarks/cpu_side_by_side.py), in a process of its own.

    python -m benchmarks.cpu_engines ENGINE MODEL_DIR DTYPE   # from the repository's root

ENGINE is vjx, vllm or transformers. The process builds the engine, then prints one JSON
line `REPLY {"ready_s": ...}` (seconds from the interpreter's start, imports included) and answers
each JSON line on stdin, `{"prompts": [[token ids]...], "max_tokens": n}`, with
`REPLY {"elapsed_s": ..., "output_tokens": ...}`: the whole batch generated greedily, exactly
`max_tokens` tokens a prompt (EOS ignored). An empty line ends it. Replies carry the
`REPLY` mark because engines log to stdout too.

It imports nothing of vjx's at the top, so vLLM's own virtual environment runs it too: only
the standard library, then the engine's package. (As a module from the root, not as a
script: a script's folder, benchmarks/, would shadow the `kernels` package vLLM imports.)
"""

import json
import sys
import time

START = time.perf_counter()
REPLY = "CPU_BENCH_REPLY "


class VjxEngine:
    def __init__(self, model: str, dtype: str):
        from vjx import LLM, SamplingParams

        self.llm = LLM(model=model, dtype=dtype, enable_prefix_caching=False, seed=0)
        self.params = SamplingParams

    def generate(self, prompts: list[list[int]], max_tokens: int) -> int:
        params = self.params(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)


class VllmEngine(VjxEngine):
    def __init__(self, model: str, dtype: str):
        from vllm import LLM, SamplingParams

        self.llm = LLM(model=model, dtype=dtype, enable_prefix_caching=False, seed=0)
        self.params = SamplingParams


class TransformersEngine:
    """transformers' `generate` on the whole batch (prompts of one length: no padding)."""

    def __init__(self, model: str, dtype: str):
        import torch
        import transformers

        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype))
        self.model.eval()

    def generate(self, prompts: list[list[int]], max_tokens: int) -> int:
        input_ids = self.torch.tensor(prompts)
        with self.torch.inference_mode():
            out = self.model.generate(
                input_ids,
                attention_mask=self.torch.ones_like(input_ids),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        return int(out.shape[0] * (out.shape[1] - input_ids.shape[1]))


ENGINES = {"vjx": VjxEngine, "vllm": VllmEngine, "transformers": TransformersEngine}


def _reply(message: dict) -> None:
    sys.stdout.write(REPLY + json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    name, model, dtype = sys.argv[1:4]
    engine = ENGINES[name](model, dtype)
    _reply({"ready_s": time.perf_counter() - START})
    for line in sys.stdin:
        if not line.strip():
            break
        request = json.loads(line)
        start = time.perf_counter()
        output_tokens = engine.generate(request["prompts"], request["max_tokens"])
        _reply({"elapsed_s": time.perf_counter() - start, "output_tokens": output_tokens})


if __name__ == "__main__":
    main()
