"""Check (d): vLLM's basic offline examples (examples/offline_inference), rewritten as short
functions that take the engine module (`vllm` or `vjx`) and return the SHAPE of what they
got (counts, types, finish reasons): the same function runs against both modules and the
two shapes must be equal.

`SHARED` examples use one `LLM` built by the driver; `OWN_ENGINE` ones build their own
engine (the driver frees the shared one first, so one engine is alive at a time).
"""

import asyncio
import importlib
import os
import tempfile

PROMPTS = ["Hello, my name is", "The president of the United States is", "The capital of France is"]
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write one sentence about the sea."},
]

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def completion_shape(outputs) -> list[dict]:
    """Per request: how many completions, and per completion its token count, text type and
    finish reason."""
    return [
        {
            "type": type(out).__name__,
            "has_prompt_token_ids": bool(out.prompt_token_ids),
            "finished": out.finished,
            "completions": [
                {
                    "index": c.index,
                    "num_tokens": len(c.token_ids),
                    "text_is_str": isinstance(c.text, str),
                    "finish_reason": c.finish_reason,
                }
                for c in out.outputs
            ],
        }
        for out in outputs
    ]


def fixed_length(m, max_tokens: int = 6, **kwargs):
    """Sampling that always runs `max_tokens` tokens, so shapes do not depend on where EOS falls."""
    return m.SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kwargs)


def basic_generate(m, llm, model):
    sp = fixed_length(m, temperature=0.8, top_p=0.95, seed=0)
    return completion_shape(llm.generate(PROMPTS, sp))


def chat(m, llm, model):
    return completion_shape(llm.chat(CONVERSATION, fixed_length(m, temperature=0.0), use_tqdm=False))


def chat_list_of_conversations(m, llm, model):
    conversations = [CONVERSATION, CONVERSATION[:1] + [{"role": "user", "content": "Say hi."}]]
    return completion_shape(llm.chat(conversations, fixed_length(m, temperature=0.0), use_tqdm=False))


def generate_sampling_params_list(m, llm, model):
    params = [fixed_length(m, max_tokens=k, temperature=0.0) for k in (2, 4, 6)]
    return completion_shape(llm.generate(PROMPTS, params, use_tqdm=False))


def logprobs(m, llm, model):
    out = llm.generate(PROMPTS[:1], fixed_length(m, temperature=0.0, logprobs=3), use_tqdm=False)[0]
    completion = out.outputs[0]
    return {
        "num_positions": len(completion.logprobs),
        "entries_per_position": [len(d) for d in completion.logprobs],
        "chosen_in_dict": all(t in d for t, d in zip(completion.token_ids, completion.logprobs)),
        "fields": sorted(
            k
            for k in ("logprob", "rank", "decoded_token")
            if hasattr(completion.logprobs[0][completion.token_ids[0]], k)
        ),
        "cumulative_logprob_is_float": isinstance(completion.cumulative_logprob, float),
    }


def prompt_logprobs(m, llm, model):
    out = llm.generate(PROMPTS[:1], fixed_length(m, max_tokens=1, temperature=0.0, prompt_logprobs=2), use_tqdm=False)[
        0
    ]
    return {
        "num_prompt_tokens": len(out.prompt_token_ids),
        "num_positions": len(out.prompt_logprobs),
        "first_is_none": out.prompt_logprobs[0] is None,
        "entries_per_position": [len(d) for d in out.prompt_logprobs[1:]],
    }


def n_completions(m, llm, model):
    return completion_shape(llm.generate(PROMPTS[:2], fixed_length(m, n=3, temperature=0.8, seed=1), use_tqdm=False))


def seed_repeats(m, llm, model):
    sp = fixed_length(m, temperature=1.0, seed=42)
    first, second = (llm.generate(PROMPTS[:1], sp, use_tqdm=False)[0].outputs[0].token_ids for _ in range(2))
    return {"same_tokens": list(first) == list(second), "num_tokens": len(first)}


def stop_strings(m, llm, model):
    sp = m.SamplingParams(temperature=0.0, max_tokens=32, stop=[".", "\n"])
    outs = llm.generate(PROMPTS, sp, use_tqdm=False)
    return [
        {
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
            "stop_in_text": any(s in c.text for s in ".\n"),
        }
        for c in (o.outputs[0] for o in outs)
    ]


def beam_search(m, llm, model):
    module = m if hasattr(m, "BeamSearchParams") else importlib.import_module(f"{m.__name__}.sampling_params")
    params = module.BeamSearchParams(beam_width=2, max_tokens=6, ignore_eos=True)
    outs = llm.beam_search([{"prompt": p} for p in PROMPTS[:2]], params)
    return [
        {
            "num_sequences": len(o.sequences),
            "num_tokens": [len(s.tokens) for s in o.sequences],
            "text_is_str": [isinstance(s.text, str) for s in o.sequences],
        }
        for o in outs
    ]


def tokens_prompts(m, llm, model):
    prompts = [m.TokensPrompt(prompt_token_ids=[1, 2, 3, 4]), {"prompt_token_ids": [5, 6, 7]}]
    return completion_shape(llm.generate(prompts, fixed_length(m, temperature=0.0), use_tqdm=False))


def default_sampling_params(m, llm, model):
    sp = llm.get_default_sampling_params()
    fields = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens")
    return {"type": type(sp).__name__, **{f: getattr(sp, f) for f in fields}}


def cli_args(m, llm, model):
    parser = importlib.import_module(f"{m.__name__}.utils.argparse_utils").FlexibleArgumentParser()
    parser = m.EngineArgs.add_cli_args(parser)
    args = parser.parse_args(["--model", model, "--dtype", "float32", "--max-model-len", "512", "--max_num_seqs", "8"])
    engine_args = m.EngineArgs.from_cli_args(args)
    return {
        "model": engine_args.model == model,
        "dtype": engine_args.dtype,
        "max_model_len": engine_args.max_model_len,
        "max_num_seqs": engine_args.max_num_seqs,
    }


def cli_short_flags(m, llm, model):
    parser = m.EngineArgs.add_cli_args(
        importlib.import_module(f"{m.__name__}.utils.argparse_utils").FlexibleArgumentParser()
    )
    args = parser.parse_args(["--model", model, "-tp", "1", "-q", "fp8"])
    return {"tensor_parallel_size": args.tensor_parallel_size, "quantization": args.quantization}


def harmless_engine_kwargs(m, llm, model):
    engine_args = m.EngineArgs(model=model, enforce_eager=True, trust_remote_code=False, disable_custom_all_reduce=True)
    return {"enforce_eager": engine_args.enforce_eager}


def reset_prefix_cache(m, llm, model):
    return {"result_type": type(llm.reset_prefix_cache()).__name__}


def sleep_wake_up(m, llm, model):
    llm.sleep(level=1)
    llm.wake_up()
    return completion_shape(llm.generate(PROMPTS[:1], fixed_length(m, temperature=0.0), use_tqdm=False))


def chat_content_parts_and_tools(m, llm, model):
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is the weather in Paris?"}]}]
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    return completion_shape(llm.chat(messages, fixed_length(m, temperature=0.0), use_tqdm=False, tools=[tool]))


def chat_template_per_call(m, llm, model):
    outputs = llm.chat(CONVERSATION, fixed_length(m, temperature=0.0), use_tqdm=False, chat_template=TEMPLATE)
    return {"prompt": outputs[0].prompt, "completions": completion_shape(outputs)}


def llm_chat_template_file(m, model, engine_kwargs):
    """`LLM(chat_template=path)`: the file's template renders every chat."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "chat.jinja")
        with open(path, "w") as f:
            f.write(TEMPLATE)
        llm = m.LLM(model=model, chat_template=path, **engine_kwargs)
    outputs = llm.chat(CONVERSATION, fixed_length(m, temperature=0.0), use_tqdm=False)
    shape = {"prompt": outputs[0].prompt, "completions": completion_shape(outputs)}
    del llm
    return shape


def llm_engine_step_loop(m, model, engine_kwargs):
    engine = m.LLMEngine.from_engine_args(m.EngineArgs(model=model, **engine_kwargs))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, fixed_length(m, temperature=0.0))
    finished = []
    while engine.has_unfinished_requests():
        finished.extend(out for out in engine.step() if out.finished)
    shape = completion_shape(sorted(finished, key=lambda out: out.request_id))
    del engine
    return shape


def async_llm_generate(m, model, engine_kwargs):
    async def run():
        engine = m.AsyncLLMEngine.from_engine_args(m.AsyncEngineArgs(model=model, **engine_kwargs))
        try:
            final, num_outputs = None, 0
            async for out in engine.generate(PROMPTS[0], fixed_length(m, temperature=0.0), request_id="r0"):
                final, num_outputs = out, num_outputs + 1
            return {"streamed_more_than_once": num_outputs > 1, "final": completion_shape([final])}
        finally:
            engine.shutdown()

    return asyncio.run(run())


SHARED = [
    basic_generate,
    chat,
    chat_list_of_conversations,
    generate_sampling_params_list,
    logprobs,
    prompt_logprobs,
    n_completions,
    seed_repeats,
    stop_strings,
    beam_search,
    tokens_prompts,
    default_sampling_params,
    cli_args,
    cli_short_flags,
    harmless_engine_kwargs,
    reset_prefix_cache,
    chat_content_parts_and_tools,
    chat_template_per_call,
    sleep_wake_up,
]
OWN_ENGINE = [llm_engine_step_loop, async_llm_generate, llm_chat_template_file]
