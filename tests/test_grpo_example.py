"""`examples/grpo_rollouts.py` end to end on a tiny random Llama: three iterations of rollouts,
a GRPO step and `update_weights`. In every iteration the engine's logprobs of its own samples
equal the learner's forward of the same params (float32), so from the second one on the engine
runs the weights the learner wrote; the learner's steps change them (the loss is not zero)."""

import importlib.util
import pathlib

from tests.helpers.tiny_llama import save_tiny_llama

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "grpo_rollouts.py"


def test_three_grpo_iterations_run_on_the_updated_weights(tmp_path, capsys):
    save_tiny_llama(tmp_path, 2, seed=3)
    spec = importlib.util.spec_from_file_location("grpo_rollouts", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    history = example.main(
        [
            "--model",
            str(tmp_path),
            "--iterations",
            "3",
            "--num-prompts",
            "2",
            "--samples",
            "4",
            "--learning-rate",
            "0.05",
        ]
        + ["--max-model-len", "64", "--max-num-batched-tokens", "64"]
    )
    assert len(history) == 3
    assert all(h.max_logprob_error < 1e-4 for h in history), [h.max_logprob_error for h in history]
    assert any(abs(h.loss) > 1e-6 for h in history)
    out = capsys.readouterr().out
    assert "iteration 2: reward" in out and "time split: generate" in out
