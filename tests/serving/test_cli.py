"""The `vjx generate` command, run in-process the way the console script runs it."""

from serving.cli import main
from tests.helpers.large_engine import LARGE_FLAGS

# The large engine's flags, so the compile cache hits.


def test_generate_prints_the_completion(capsys):
    code = main(["generate", "--prompt", "The capital of France is", "--max-tokens", "8", *LARGE_FLAGS])
    out, err = capsys.readouterr()
    assert code == 0
    prompt_line, completion = out.split("\n", 1)
    assert prompt_line == "The capital of France is"
    assert "Paris" in completion
    assert "8 tokens" in err and "finish_reason=length" in err


def test_bad_argument_exits_with_a_message(capsys):
    code = main(["generate", "--prompt", "Hi", "--block-size", "7"])
    assert code == 2
    assert "block_size must be one of" in capsys.readouterr().err
