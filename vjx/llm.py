"""LLM: offline generation with vLLM's interface (`from vjx import LLM`)."""

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from vjx import chat_utils
from vjx.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from vjx.engine.llm_engine import LLMEngine
from vjx.engine_args import EngineArgs
from vjx.lora.request import LoRARequest
from vjx.outputs import RequestOutput
from vjx.sampling_params import RequestOutputKind, SamplingParams


class LLM:
    """Loads a model once and generates completions for batches of prompts.

    `model` is a model directory, a Hugging Face Hub model id (downloaded at `revision`) or
    None for the embedded default model, SmolLM2-135M-Instruct. The keyword arguments are
    vLLM's engine arguments, documented on `EngineArgs`; the ones not listed (e.g.
    `download_dir`, `generation_config`, `scheduling_policy`) pass through `**kwargs`.
    `chat_template` (a file's path or the Jinja template itself) is `chat`'s default template
    instead of the tokenizer's.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        tokenizer: str | None = None,
        revision: str | None = None,
        tokenizer_revision: str | None = None,
        chat_template: Path | str | None = None,
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
        explicit = {k: v for k, v in locals().items() if k not in ("self", "kwargs", "chat_template")}
        self.chat_template = chat_utils.load_chat_template(chat_template)
        engine_args = EngineArgs(**explicit, **kwargs)
        self.llm_engine = LLMEngine.from_engine_args(engine_args)
        self.request_counter = itertools.count()
        self.default_sampling_params: dict | None = None

    def shutdown(self) -> None:
        """Stops the engine core process, if the engine runs one."""
        self.llm_engine.shutdown()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLM":
        return cls(**vars(engine_args))

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def get_world_size(self, include_dp: bool = True) -> int:
        """Devices one replica spans (tensor parallel), times the replicas with `include_dp`."""
        parallel_config = self.llm_engine.config.parallel_config
        world_size = parallel_config.tensor_parallel_size
        return world_size * parallel_config.data_parallel_size if include_dp else world_size

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
        *,
        use_tqdm: bool = True,
        lora_request=None,
        priority: int | Sequence[int] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Completes each prompt; outputs come back in the order of `prompts`.

        A prompt is a string, `{"prompt": str}` or `{"prompt_token_ids": [int, ...]}`;
        `sampling_params=None` means `get_default_sampling_params()` for every prompt.
        `priority` (one int, or one per prompt) orders requests under
        `scheduling_policy="priority"` (lower first). `tokenization_kwargs` overrides
        `tokenizer.encode`'s arguments for text prompts (`TOKENIZATION_KWARGS`). `lora_request`
        (one `LoRARequest` for every prompt, or one per prompt; needs `enable_lora`) runs a
        prompt with that adapter. vjx has no multimodal inputs: `mm_processor_kwargs` must be None.
        As in vLLM, requests queued earlier by `enqueue` finish here too and are returned with
        these. Raises RuntimeError while the engine sleeps.
        """
        self._check_awake()
        self.enqueue(
            prompts, sampling_params, lora_request, priority, use_tqdm, tokenization_kwargs, mm_processor_kwargs
        )
        return self.wait_for_completion(use_tqdm=use_tqdm)

    def enqueue(
        self,
        prompts,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        lora_request=None,
        priority: int | Sequence[int] | None = None,
        use_tqdm: bool = True,
        tokenization_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[str]:
        """Adds `generate`'s requests without running the engine and returns their ids;
        `wait_for_completion` runs them. Works while asleep at level 0 (`sleep(level=0)`
        first guarantees every request is queued before any is scheduled)."""
        _check_unsupported(mm_processor_kwargs=mm_processor_kwargs)
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        texts = [_prompt_text(prompt) for prompt in prompts]
        if tokenization_kwargs:
            encode_kwargs = _encode_kwargs(tokenization_kwargs, add_special_tokens=True)
            tokenizer = self.get_tokenizer()
            prompts = [
                prompt if text is None else {"prompt_token_ids": tokenizer.encode(text, **encode_kwargs)}
                for prompt, text in zip(prompts, texts)
            ]
        return self._enqueue(prompts, sampling_params, priority, texts, lora_request)

    def wait_for_completion(self, output_type: type | tuple[type, ...] | None = None, *, use_tqdm: bool = True):
        """Runs the engine until every queued request finishes; returns their outputs in the
        order they were added. `output_type` is what the caller expects (vjx makes only
        `RequestOutput`s). Raises RuntimeError while the engine sleeps."""
        if output_type is not None and not issubclass(RequestOutput, output_type):
            raise ValueError(
                f"output_type must include RequestOutput (vjx has no pooling models), got {output_type!r}."
            )
        self._check_awake()
        return self._run_engine(use_tqdm)

    def _check_awake(self) -> None:
        if self.llm_engine.is_sleeping():
            raise RuntimeError("The engine is asleep: call wake_up() before generating.")

    def _enqueue(
        self, prompts: list, sampling_params, priority, prompt_texts: list[str | None], lora_request=None
    ) -> list[str]:
        params = self._params_per_prompt(len(prompts), sampling_params)
        priorities = _priority_per_prompt(len(prompts), priority)
        loras = _lora_per_prompt(len(prompts), lora_request)
        # Only the finished outputs are returned, as in vLLM: building the others would cost
        # per token (the caller's params are copied, not changed).
        params = [dataclasses.replace(sp, output_kind=RequestOutputKind.FINAL_ONLY) for sp in params]
        return self._add_requests(prompts, params, priorities, prompt_texts, loras)

    def chat(
        self,
        messages,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request=None,
        priority: int | Sequence[int] | None = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generates replies to one conversation (a list of messages) or a list of them.

        Each conversation is rendered by the chat template (vjx/chat_utils.py) with `tools`
        and `chat_template_kwargs`, then tokenized without special tokens (unless
        `tokenization_kwargs` says otherwise); the outputs' `prompt` is the rendered text.
        """
        self._check_awake()
        self.enqueue_chat(
            messages,
            sampling_params,
            use_tqdm,
            lora_request,
            priority,
            chat_template,
            chat_template_content_format,
            add_generation_prompt,
            continue_final_message,
            tools,
            chat_template_kwargs,
            tokenization_kwargs,
            mm_processor_kwargs,
        )
        return self.wait_for_completion(use_tqdm=use_tqdm)

    def enqueue_chat(
        self,
        messages,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request=None,
        priority: int | Sequence[int] | None = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[str]:
        """`chat`'s requests added without running the engine (see `enqueue`); returns their ids."""
        _check_unsupported(mm_processor_kwargs=mm_processor_kwargs)
        template_kwargs = {
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message,
            **(chat_template_kwargs or {}),
        }
        tokenizer = self.get_tokenizer()
        texts = [
            chat_utils.render_chat(
                tokenizer,
                conversation,
                chat_template=self.chat_template if chat_template is None else chat_template,
                content_format=chat_template_content_format,
                tools=tools,
                chat_template_kwargs=template_kwargs,
            )
            for conversation in chat_utils.to_conversations(messages)
        ]
        encode_kwargs = _encode_kwargs(tokenization_kwargs or {}, add_special_tokens=False)
        prompts = [{"prompt_token_ids": tokenizer.encode(text, **encode_kwargs)} for text in texts]
        return self._enqueue(prompts, sampling_params, priority, texts, lora_request)

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

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        """Forgets every cached prefix block; False (nothing changed) while requests hold
        blocks. vjx neither preempts running requests for it nor has a KV connector: both
        arguments must be False."""
        for name, value in (("reset_running_requests", reset_running_requests), ("reset_connector", reset_connector)):
            if value:
                raise ValueError(f"{name}=True is not supported by vjx; pass False.")
        return self.llm_engine.reset_prefix_cache()

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """vLLM's sleep: level 0 pauses scheduling; levels 1 and 2 also reset the prefix cache,
        free the KV cache's device buffers and move the weights to host memory (vLLM's level 2
        discards the weights; vjx keeps the host copy, so the same tokens come after
        `wake_up` at either level). `mode="abort"` aborts unfinished requests; "keep" (level 0
        only) keeps them waiting."""
        self.llm_engine.sleep(level, mode)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """Puts back the memory `tags` name ("weights", "kv_cache"; "scheduling" for level 0),
        all of it for None; returns whether the engine is fully awake."""
        return self.llm_engine.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.llm_engine.is_sleeping()

    def start_profile(
        self,
        profile_prefix: str | None = None,
        *,
        profile_dir: str | None = None,
        delay_iterations: int | None = None,
        max_iterations: int | None = None,
    ) -> None:
        """Starts a JAX profiler trace (`jax.profiler.start_trace`) in the process that runs
        the model, written to `profile_dir` or $VLLM_TORCH_PROFILER_DIR (a `profile_prefix`
        folder under it when given) at `stop_profile`. vjx has no iteration bounds: the two
        last arguments must be None."""
        self.llm_engine.start_profile(
            profile_prefix, profile_dir=profile_dir, delay_iterations=delay_iterations, max_iterations=max_iterations
        )

    def stop_profile(self) -> None:
        self.llm_engine.stop_profile()

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Runs a worker method by name, or `method(worker, *args, **kwargs)`, on every worker
        (one per data-parallel replica); returns their results in a list. With the engine in
        its own process (`multiprocess`) the call and results are pickled: cloudpickle when
        installed, else pickle (then `method` must be a module-level function). `timeout`
        (seconds; TimeoutError) applies with the engine in its own process."""
        return self.llm_engine.collective_rpc(method, timeout, args, kwargs)

    def get_weights(self) -> dict:
        """The model's params as a nested dict of arrays (vjx's layout: module path -> array,
        the LoRA slots left out); in process, the engine's own device arrays."""
        return self.collective_rpc("get_weights")[0]

    def update_weights(self, weights, reset_prefix_cache: bool = True) -> None:
        """New params for the model, with no recompilation: `get_weights()`'s layout (any
        subset of it; jax arrays already on the devices move device to device) or a mapping of
        Hugging Face tensor names to arrays (laid out on the host, as at load). Arrays of
        another dtype are cast to the model's; each is placed in its param's sharding on every
        data-parallel replica. `reset_prefix_cache` drops the KV the old weights computed."""
        self._check_idle("update_weights")
        self.collective_rpc("update_weights", args=(weights,))
        if reset_prefix_cache:
            self.llm_engine.reset_prefix_cache()

    def reload_weights(self, path: str, reset_prefix_cache: bool = True) -> None:
        """Every param again from the safetensors files of directory `path` (a checkpoint of
        the same architecture and shapes), with no recompilation."""
        self._check_idle("reload_weights")
        self.collective_rpc("reload_weights", args=(str(path),))
        if reset_prefix_cache:
            self.llm_engine.reset_prefix_cache()

    def save_weights(self, path: str) -> None:
        """Writes the params as an Orbax checkpoint under `path`/params, beside the model's
        config and tokenizer: `LLM(path, load_format="orbax")` restores them straight into its
        shardings, without the Hugging Face conversion."""
        self.collective_rpc("save_weights", args=(str(path),))

    def _check_idle(self, method: str) -> None:
        if self.llm_engine.has_unfinished_requests():
            raise RuntimeError(f"{method} needs an idle engine: requests are still unfinished.")

    def apply_model(self, func: Callable[[Any], Any]) -> list[Any]:
        """`func(model)` on each worker's Flax NNX model; keep what it returns small (host data)."""
        return self.llm_engine.apply_model(func)

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

    def _add_requests(
        self,
        prompts,
        params: list[SamplingParams],
        priorities: list[int],
        prompt_texts: list[str | None],
        loras: list[LoRARequest | None],
    ) -> list[str]:
        """Adds every request, or none: a bad prompt aborts the ones already added."""
        request_ids = []
        try:
            for prompt, sp, priority, text, lora in zip(prompts, params, priorities, prompt_texts, loras):
                request_id = str(next(self.request_counter))
                self.llm_engine.add_request(request_id, prompt, sp, priority, prompt_text=text, lora_request=lora)
                request_ids.append(request_id)
        except Exception:
            self.llm_engine.abort_request(request_ids)
            raise
        return request_ids

    def _run_engine(self, use_tqdm: bool) -> list[RequestOutput]:
        """Steps until no request is unfinished; the finished outputs in the order added."""
        finished: dict[str, RequestOutput] = {}
        total = self.llm_engine.get_num_unfinished_requests()
        progress = tqdm(total=total, desc="Processed prompts", disable=not use_tqdm)
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
        return sorted(finished.values(), key=lambda output: int(output.request_id))

    def get_metrics(self) -> list:
        """vLLM's `LLM.get_metrics()`: a snapshot of this engine's metrics as
        `vjx.metrics.reader` objects (Counter, Gauge, Histogram), named `vjx:...`. Needs
        `disable_log_stats=False`; raises ValueError otherwise."""
        return self.llm_engine.get_metrics()


TOKENIZATION_KWARGS = ("add_special_tokens", "truncation", "max_length")
"""The `tokenizer.encode` arguments `tokenization_kwargs` may set."""


def _encode_kwargs(tokenization_kwargs: dict[str, Any], add_special_tokens: bool) -> dict[str, Any]:
    unknown = sorted(set(tokenization_kwargs) - set(TOKENIZATION_KWARGS))
    if unknown:
        raise ValueError(f"tokenization_kwargs {unknown} are not supported by vjx; allowed: {TOKENIZATION_KWARGS}.")
    return {"add_special_tokens": add_special_tokens, **tokenization_kwargs}


def _prompt_text(prompt) -> str | None:
    """A text prompt's text (`str` or `{"prompt": str}`); None for anything else."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt"), str):
        return prompt["prompt"]
    return None


def _check_unsupported(**arguments) -> None:
    for name, value in arguments.items():
        if value is not None and value != {}:
            what = "vjx serves text models" if name == "mm_processor_kwargs" else "vjx has no such feature"
            raise ValueError(f"{name} is not supported by vjx ({what}); pass None, got {value!r}.")


def _lora_per_prompt(num_prompts: int, lora_request) -> list[LoRARequest | None]:
    """vLLM's rule: one LoRARequest (or None) applies to every prompt, a list pairs up."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    if not isinstance(lora_request, Sequence) or isinstance(lora_request, str):
        raise ValueError(
            f"lora_request must be a LoRARequest, one per prompt, or None; got {type(lora_request).__name__}."
        )
    loras = list(lora_request)
    if len(loras) != num_prompts:
        raise ValueError(f"lora_request must be one LoRARequest or {num_prompts} (one per prompt), got {len(loras)}.")
    for lora in loras:
        if lora is not None and not isinstance(lora, LoRARequest):
            raise ValueError(f"lora_request must be a vjx LoRARequest or None, got {type(lora).__name__}.")
    return loras


def _priority_per_prompt(num_prompts: int, priority) -> list[int]:
    """vLLM's rule: None is 0 for every prompt, an int applies to all, a list pairs up."""
    if priority is None:
        return [0] * num_prompts
    if isinstance(priority, Sequence) and not isinstance(priority, str):
        if len(priority) != num_prompts:
            raise ValueError(f"The lengths of prompts ({num_prompts}) and priority ({len(priority)}) must be the same.")
        return list(priority)
    return [priority] * num_prompts
