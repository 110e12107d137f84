"""benchmarks/parallel.py on CPU: a tiny dummy-weight Llama at TP 1 and TP 2, one size per
run and then `--compare`, as the GPU runs do; and the greedy comparison rule itself."""

import json

from benchmarks import parallel
from tests.helpers.tiny_llama import save_tiny_llama

SMALL = [
    "--load-format",
    "dummy",
    "--max-model-len",
    "64",
    "--max-num-seqs",
    "4",
    "--max-num-batched-tokens",
    "16",
    "--num-gpu-blocks-override",
    "32",
    "--no-async-scheduling",
    "--num-greedy-prompts",
    "2",
    "--greedy-input-len",
    "8",
    "--greedy-output-len",
    "6",
    "--batch-sizes",
    "1",
    "2",
    "--latency-input-len",
    "8",
    "--latency-output-len",
    "4",
    "--num-iters",
    "1",
    "--num-prompts",
    "3",
    "--input-len",
    "8",
    "--output-len",
    "4",
]


def test_tp1_and_tp2_runs_compare(tmp_path, capsys):
    save_tiny_llama(tmp_path / "model", 2)
    common = ["--model", str(tmp_path / "model"), *SMALL]
    for size in (1, 2):
        parallel.main([*common, "--tp-sizes", str(size), "--output-json", str(tmp_path / f"tp{size}.json")])
    result = parallel.main(
        [
            "--compare",
            str(tmp_path / "tp1.json"),
            str(tmp_path / "tp2.json"),
            "--output-json",
            str(tmp_path / "tp.json"),
        ]
    )
    assert json.loads((tmp_path / "tp.json").read_text())["runs"][1]["tensor_parallel_size"] == 2
    comparison = result["runs"][1]["greedy_vs_first"]
    assert comparison == {"num_prompts": 2, "num_exact": 2, "first_differences": [], "within_top5_rule": True}
    assert [row["batch_size"] for row in result["runs"][0]["latency"]] == [1, 2]
    table = capsys.readouterr().out
    assert "| | TP 1 | TP 2 |" in table and "2/2 exact, top-5 rule holds" in table


def test_greedy_rule_checks_the_first_difference_only():
    ref = [{"token_ids": [1, 2, 3], "top_ids": [[1], [2, 7], [3]]}]
    near = [{"token_ids": [1, 7, 9], "top_ids": [[1], [2, 7], [9]]}]
    far = [{"token_ids": [1, 8, 3], "top_ids": [[1], [2, 8], [3]]}]
    assert parallel.compare_greedy(ref, near)["within_top5_rule"] is True
    assert parallel.compare_greedy(ref, far) == {
        "num_prompts": 1,
        "num_exact": 0,
        "first_differences": [{"prompt": 0, "position": 1}],
        "within_top5_rule": False,
    }
