"""A stand-in for EngineCore with a tiny deterministic "model", for front-end tests.

`FakeModel` gives every token sequence a fixed log-softmax over the 300-token test
vocabulary (a seeded function of its last two tokens, all values distinct, EOS likely
after a few contexts). `FakeEngineCore` runs requests one token per step on it, as the real
engine core would: logprobs rows (sampled token, then the best candidates), prompt logprobs
with the first token, EOS / stop tokens / max_tokens. `make_llm` builds a real `LLM` (real
config, tokenizer, input and output processors) on top of it, with no weights and no XLA.
"""

import json
import pathlib

import numpy as np

import vjx.engine.llm_engine
from tests.helpers.tokenizer import BOS, EOS, make_tokenizer
from vjx import LLM
from vjx.engine.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
from vjx.outputs import LogprobsLists

VOCAB_SIZE = 300
MAX_MODEL_LEN = 64


class FakeModel:
    """Log probabilities of the next token given all tokens so far."""

    def logprobs(self, token_ids: list[int]) -> np.ndarray:
        context = token_ids[-2:]
        rng = np.random.default_rng([7, *context])
        logits = rng.normal(size=VOCAB_SIZE) * 2.0
        if sum(context) % 3 == 0:
            logits[EOS] += 4.0
        shifted = logits - logits.max()
        return shifted - np.log(np.exp(shifted).sum())

    def row(self, token_ids: list[int], chosen: int, num_candidates: int) -> tuple[list[int], list[float], int]:
        """One LogprobsLists row: the chosen token, then the best `num_candidates`; its rank."""
        logprobs = self.logprobs(token_ids)
        order = np.argsort(-logprobs, kind="stable")
        ids = [chosen, *order[:num_candidates].tolist()]
        rank = int(np.flatnonzero(order == chosen)[0]) + 1
        return ids, logprobs[ids].tolist(), rank

    def sample(self, token_ids: list[int], temperature: float, seed: int | None) -> int:
        logprobs = self.logprobs(token_ids)
        if temperature == 0.0:
            return int(np.argmax(logprobs))
        probs = np.exp(logprobs / temperature)
        rng = np.random.default_rng([seed or 0, len(token_ids)])
        return int(rng.choice(VOCAB_SIZE, p=probs / probs.sum()))


def _lists(rows: list[tuple[list[int], list[float], int]]) -> LogprobsLists:
    return LogprobsLists([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])


class FakeEngineCore:
    """Runs every request one token per step on `FakeModel` (in place of InprocClient)."""

    def __init__(self, config):
        self.config = config
        self.model = FakeModel()
        self.added: list[EngineCoreRequest] = []
        self.aborted: list[str] = []
        self.running: dict[str, list[int]] = {}
        self.requests: dict[str, EngineCoreRequest] = {}

    def add_request(self, request: EngineCoreRequest) -> None:
        self.added.append(request)
        self.requests[request.request_id] = request
        self.running[request.request_id] = []

    def abort_requests(self, request_ids: list[str]) -> None:
        self.aborted += request_ids
        for request_id in request_ids:
            self.running.pop(request_id, None)

    def is_sleeping(self) -> bool:
        """Never: it has no device memory to free."""
        return False

    def get_output(self) -> EngineCoreOutputs:
        outputs = [self._step(request_id) for request_id in list(self.running)]
        return EngineCoreOutputs(outputs=outputs)

    def _step(self, request_id: str) -> EngineCoreOutput:
        request, output_ids = self.requests[request_id], self.running[request_id]
        params, prompt = request.sampling_params, request.prompt_token_ids
        tokens = prompt + output_ids
        token_id = self.model.sample(tokens, params.temperature, params.seed)
        output = EngineCoreOutput(request_id, [token_id])
        if params.logprobs is not None:
            output.new_logprobs = _lists([self.model.row(tokens, token_id, params.logprobs)])
        if params.prompt_logprobs is not None and not output_ids:
            rows = [self.model.row(prompt[:i], prompt[i], params.prompt_logprobs) for i in range(1, len(prompt))]
            output.new_prompt_logprobs = _lists(rows)
        output_ids.append(token_id)
        if token_id == request.eos_token_id and not params.ignore_eos:
            output.finish_reason = FinishReason.STOP
        elif token_id in params.stop_token_ids:
            output.finish_reason, output.stop_reason = FinishReason.STOP, token_id
        elif len(output_ids) == params.max_tokens or len(tokens) + 1 == MAX_MODEL_LEN:
            output.finish_reason = FinishReason.LENGTH
        if output.finish_reason is not None:
            del self.running[request_id]
        return output


def write_model_dir(path: pathlib.Path) -> str:
    """A model directory with a tiny Llama config.json and the test tokenizer (no weights)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": MAX_MODEL_LEN,
        "dtype": "float32",
        # The tokenizer's, or the config's default (2) would be a second EOS id.
        "bos_token_id": BOS,
        "eos_token_id": EOS,
    }
    (path / "config.json").write_text(json.dumps(config))
    make_tokenizer().save_pretrained(path)
    return str(path)


def make_llm(path: pathlib.Path, monkeypatch, **kwargs) -> LLM:
    """An `LLM` whose engine core is a `FakeEngineCore`."""
    monkeypatch.setattr(vjx.engine.llm_engine, "InprocClient", FakeEngineCore)
    return LLM(write_model_dir(path), **kwargs)
