"""LLM: offline generation with vLLM's interface (`from vjx import LLM`)."""

import dataclasses
import itertools
from collections.abc import Sequence

from tqdm.auto import tqdm

from vjx.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from vjx.engine.llm_engine import LLMEngine
from vjx.engine_args import EngineArgs
from vjx.outputs import RequestOutput
from vjx.sampling_params import RequestOutputKind, SamplingParams


class LLM:
    """Loads a model once and generates completions for batches of prompts.

    `model` is a model directory, a Hugging Face Hub model id (downloaded at `revision`) or
    None for the embedded default model, SmolLM2-135M-Instruct. The keyword arguments are
    vLLM's engine arguments, documented on `EngineArgs`; the ones not listed (e.g.
    `download_dir`, `generation_config`, `scheduling_policy`) pass through `**kwargs`.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        tokenizer: str | None = None,
        revision: str | None = None,
        tokenizer_revision: str | None = None,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
        block_size: int = 16,
        gpu_memory_utilization: float = 0.9,
        num_gpu_blocks_override: int | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int | None = None,
        enable_prefix_caching: bool = True,
        enable_chunked_prefill: bool = True,
        tensor_parallel_size: int = 1,
        load_format: str = "auto",
        attention_backend: str | None = None,
        disable_log_stats: bool = True,
        **kwargs,
    ):
        explicit = {k: v for k, v in locals().items() if k not in ("self", "kwargs")}
        engine_args = EngineArgs(**explicit, **kwargs)
        self.llm_engine = LLMEngine.from_engine_args(engine_args)
        self.request_counter = itertools.count()
        self.default_sampling_params: dict | None = None

    def shutdown(self) -> None:
        """Stops the engine core process, if the engine runs one."""
        self.llm_engine.shutdown()

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` and `chat` use without `sampling_params`: `SamplingParams()` with the
        model's generation-config defaults (`temperature`, `top_p`, `top_k`, `min_p`,
        `repetition_penalty`, `max_tokens` from `max_new_tokens`) set, unless the engine was
        built with `generation_config="vllm"`."""
        if self.default_sampling_params is None:
            self.default_sampling_params = self.llm_engine.config.model_config.get_diff_sampling_param()
        return SamplingParams(**self.default_sampling_params)

    def generate(
        self,
        prompts,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Completes each prompt; outputs come back in the order of `prompts`.

        A prompt is a string, `{"prompt": str}` or `{"prompt_token_ids": [int, ...]}`;
        `sampling_params=None` means `get_default_sampling_params()` for every prompt.
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params = self._params_per_prompt(len(prompts), sampling_params)
        # Only the finished outputs are returned, as in vLLM: building the others would cost
        # per token (the caller's params are copied, not changed).
        params = [dataclasses.replace(sp, output_kind=RequestOutputKind.FINAL_ONLY) for sp in params]
        request_ids = self._add_requests(prompts, params)
        return self._run_engine(request_ids, use_tqdm)

    def chat(
        self,
        messages,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Generates replies to one conversation (a list of messages) or a list of them."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tokenizer = self.get_tokenizer()
        prompts = []
        for conversation in conversations:
            text = tokenizer.apply_chat_template(
                conversation,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
            )
            prompts.append({"prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm)

    def beam_search(self, prompts, params: BeamSearchParams) -> list[BeamSearchOutput]:
        """Beam search over each prompt (vLLM's `LLM.beam_search`); outputs in prompt order.

        Each step runs one `generate` of a single token per live beam, asking for
        `2 * beam_width` logprobs, so `beam_width` may be at most half the engine's
        `max_logprobs`.
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        engine = self.llm_engine
        search = BeamSearch(
            generate=lambda beams, sp: self.generate(beams, sp, use_tqdm=False),
            tokenizer=self.get_tokenizer(),
            eos_token_id=engine.input_processor.eos_token_id,
            max_model_len=engine.config.model_config.max_model_len,
        )
        return search.run(list(prompts), params)

    def _params_per_prompt(self, num_prompts: int, sampling_params) -> list[SamplingParams]:
        if sampling_params is None:
            return [self.get_default_sampling_params()] * num_prompts
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * num_prompts
        if len(sampling_params) != num_prompts:
            raise ValueError(
                f"sampling_params must be one SamplingParams or a list of {num_prompts} "
                f"(one per prompt), got a list of {len(sampling_params)}."
            )
        return list(sampling_params)

    def _add_requests(self, prompts, params: list[SamplingParams]) -> list[str]:
        """Adds every request, or none: a bad prompt aborts the ones already added."""
        request_ids = []
        try:
            for prompt, sp in zip(prompts, params):
                request_id = str(next(self.request_counter))
                self.llm_engine.add_request(request_id, prompt, sp)
                request_ids.append(request_id)
        except Exception:
            self.llm_engine.abort_request(request_ids)
            raise
        return request_ids

    def _run_engine(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        progress = tqdm(total=len(request_ids), desc="Processed prompts", disable=not use_tqdm)
        num_output_tokens = 0
        with progress:
            while self.llm_engine.has_unfinished_requests():
                for output in self.llm_engine.step():
                    if not output.finished:
                        continue
                    finished[output.request_id] = output
                    num_output_tokens += sum(len(c.token_ids) for c in output.outputs)
                    progress.update(1)
                    elapsed = progress.format_dict["elapsed"] or 1e-9
                    progress.set_postfix_str(f"output: {num_output_tokens / elapsed:.1f} toks/s")
        return [finished[request_id] for request_id in request_ids]

    def get_metrics(self) -> list:
        """vLLM's `LLM.get_metrics()`: a snapshot of this engine's metrics as
        `vjx.metrics.reader` objects (Counter, Gauge, Histogram), named `vjx:...`. Needs
        `disable_log_stats=False`; raises ValueError otherwise."""
        return self.llm_engine.get_metrics()
