"""GRPO-style RL with vjx in one JAX process: the engine samples rollouts, the learner takes a
policy-gradient step on the same params with optax, and `LLM.update_weights` hands the new
params back to the engine in place (no recompilation, no process boundary).

Each iteration: n samples per prompt (with their logprobs), a toy verifiable reward (the
completion contains the sum the prompt asks for), group-normalized advantages, one Adam step
on the GRPO loss, `update_weights`. It prints the mean reward and the time split (generate /
learn / update), and how far the engine's logprobs of its own samples are from the learner's
forward of the same params: ~1e-5 in float32 shows the engine runs the learner's weights.

    python examples/grpo_rollouts.py                       # the default model, on CPU
    python examples/grpo_rollouts.py --model path/to/hf/dir --iterations 10
"""

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from vjx import LLM, SamplingParams
from vjx.training import token_logprobs, trainable_model


@dataclasses.dataclass
class Iteration:
    reward: float
    loss: float
    generate_s: float
    learn_s: float
    update_s: float
    max_logprob_error: float
    """Largest |engine logprob - learner logprob| over the iteration's sampled tokens."""


def make_prompts(num_prompts: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, answer) pairs: small sums whose answer a reward can check."""
    rng = np.random.default_rng(seed)
    pairs = rng.integers(1, 5, (num_prompts, 2))
    return [(f"Question: what is {a} + {b}? Answer with one digit.\nAnswer:", str(a + b)) for a, b in pairs]


def group_advantages(rewards: np.ndarray) -> np.ndarray:
    """GRPO's advantage: each sample's reward against its prompt's group [prompts, n]."""
    return (rewards - rewards.mean(axis=1, keepdims=True)) / (rewards.std(axis=1, keepdims=True) + 1e-4)


def rollout_batch(outputs, pad_id: int, max_tokens: int):
    """Token rows (prompt + completion, right-padded to the longest prompt + max_tokens, one
    shape every iteration: one compile), the completion mask over next-token positions, and
    the engine's logprob of each sampled token at those positions."""
    rows = [(list(o.prompt_token_ids), list(c.token_ids), c.logprobs) for o in outputs for c in o.outputs]
    length = max(len(p) for p, _, _ in rows) + max_tokens
    tokens = np.full((len(rows), length), pad_id, np.int32)
    mask = np.zeros((len(rows), length - 1), np.float32)
    engine_logprobs = np.zeros((len(rows), length - 1), np.float32)
    for i, (prompt, completion, logprobs) in enumerate(rows):
        tokens[i, : len(prompt) + len(completion)] = prompt + completion
        span = slice(len(prompt) - 1, len(prompt) - 1 + len(completion))
        mask[i, span] = 1.0
        engine_logprobs[i, span] = [step[token].logprob for step, token in zip(logprobs, completion)]
    return tokens, mask, engine_logprobs


def make_train_step(graphdef, rest, optimizer):
    """One jitted Adam step on the GRPO loss; `rest`: the model's state that is not params."""

    def loss_fn(params, tokens, mask, advantages):
        logprobs = token_logprobs(nnx.merge(graphdef, params, rest), tokens)
        # On-policy GRPO: the ratio to the sampling policy is exp(0) = 1 in value, with its gradient.
        ratio = jnp.exp(logprobs - jax.lax.stop_gradient(logprobs))
        loss = -(ratio * advantages[:, None] * mask).sum() / mask.sum()
        return loss, logprobs

    @jax.jit
    def train_step(params, opt_state, tokens, mask, advantages):
        (loss, logprobs), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, tokens, mask, advantages)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, logprobs

    return train_step


def run(llm: LLM, args: argparse.Namespace) -> list[Iteration]:
    graphdef, params, rest = nnx.split(trainable_model(llm), nnx.Param, ...)
    optimizer = optax.adam(args.learning_rate)
    opt_state = optimizer.init(params)
    train_step = make_train_step(graphdef, rest, optimizer)
    prompts = make_prompts(args.num_prompts, args.seed)
    pad_id = llm.get_tokenizer().pad_token_id or 0
    history = []
    for iteration in range(args.iterations):
        start = time.perf_counter()
        sampling = SamplingParams(
            n=args.samples, temperature=1.0, max_tokens=args.max_tokens, logprobs=0, seed=iteration
        )
        outputs = llm.generate([p for p, _ in prompts], sampling, use_tqdm=False)
        generated = time.perf_counter()
        rewards = np.array([[float(answer in c.text) for c in o.outputs] for o, (_, answer) in zip(outputs, prompts)])
        tokens, mask, engine_logprobs = rollout_batch(outputs, pad_id, args.max_tokens)
        advantages = group_advantages(rewards).reshape(-1)
        params, opt_state, loss, logprobs = train_step(params, opt_state, tokens, mask, advantages)
        error = float(np.abs((np.asarray(logprobs) - engine_logprobs) * mask).max())
        learned = time.perf_counter()
        llm.update_weights(nnx.to_pure_dict(params))
        updated = time.perf_counter()
        times = (generated - start, learned - generated, updated - learned)
        history.append(h := Iteration(float(rewards.mean()), float(loss), *times, error))
        print(
            f"iteration {iteration}: reward {h.reward:.3f}  loss {h.loss:+.4f}  "
            f"|engine - learner logprob| {h.max_logprob_error:.1e}  "
            f"generate {h.generate_s:.2f} s  learn {h.learn_s:.2f} s  update {h.update_s:.2f} s"
        )
    return history


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="A Hugging Face model directory (default: vjx's default model).")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8, help="Samples per prompt (GRPO's group).")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=256)
    return parser.parse_args(argv)


def main(argv=None) -> list[Iteration]:
    args = parse_args(argv)
    llm = LLM(
        args.model,
        dtype="float32",
        multiprocess=False,
        max_model_len=args.max_model_len,
        max_num_seqs=args.num_prompts * args.samples,
        max_num_batched_tokens=args.max_num_batched_tokens,
        seed=args.seed,
    )
    try:
        history = run(llm, args)
    finally:
        llm.shutdown()
    total = {name: sum(getattr(h, name) for h in history) for name in ("generate_s", "learn_s", "update_s")}
    print("time split: " + ", ".join(f"{name[:-2]} {seconds:.2f} s" for name, seconds in total.items()))
    return history


if __name__ == "__main__":
    main()
