"""Compares the vLLM and vjx reports of driver.py and prints one summary table.

Exit status 0 when every check passes (known differences are listed, not failed).
"""

import json
import sys

import cases

GREEDY_LOGPROB_GAP = 1e-3
TOP_LOGPROB_TOLERANCE = 1e-3


def load(path) -> dict:
    with open(path) as f:
        return json.load(f)


def dump(report: dict, path) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def near_tie(top_a: list, top_b: list, token_a: int, token_b: int) -> bool:
    """At a first difference: each side's token is in the other's top-2 and, on each side, the
    two tokens' logprobs differ by less than GREEDY_LOGPROB_GAP."""
    for top in (top_a, top_b):
        by_token = dict((t, lp) for t, lp in top[:2])
        if token_a not in by_token or token_b not in by_token:
            return False
        if abs(by_token[token_a] - by_token[token_b]) >= GREEDY_LOGPROB_GAP:
            return False
    return True


def compare_greedy(ref: list[dict], got: list[dict]) -> dict:
    """Checks (a) and (b) over all prompts."""
    num_exact, num_near_tie, failures, max_error, num_positions = 0, 0, [], 0.0, 0
    for i, (r, g) in enumerate(zip(ref, got)):
        diff = first_difference(r["token_ids"], g["token_ids"])
        if diff is None:
            num_exact += 1
        elif diff < len(r["top"]) and near_tie(
            r["top"][diff], g["top"][diff], r["token_ids"][diff], g["token_ids"][diff]
        ):
            num_near_tie += 1
        else:
            failures.append(f"prompt {i}: tokens differ at position {diff}")
        shared = len(r["top"]) if diff is None else diff
        for position in range(shared):
            r_top, g_top = dict(map(tuple, r["top"][position])), dict(map(tuple, g["top"][position]))
            num_positions += 1
            for token in set(r_top) & set(g_top):
                max_error = max(max_error, abs(r_top[token] - g_top[token]))
            r_values, g_values = sorted(r_top.values()), sorted(g_top.values())
            max_error = max(max_error, max(abs(x - y) for x, y in zip(r_values, g_values)))
    return {
        "num_prompts": len(ref),
        "num_exact": num_exact,
        "num_near_tie": num_near_tie,
        "token_failures": failures,
        "num_logprob_positions": num_positions,
        "max_top5_logprob_error": max_error,
        "logprobs_ok": max_error < TOP_LOGPROB_TOLERANCE,
    }


def compare_cases(ref: dict, got: dict) -> tuple[list[list[str]], list[str], list[str]]:
    """Check (c): rows of (case, vLLM verdict, vjx verdict, status), failures and known ones."""
    rows, failures, known = [], [], []
    kwargs_of = dict(cases.CASES)
    for name, r in ref.items():
        g = got[name]
        status = "ok"
        if (r["rejected_at"] is None) != (g["rejected_at"] is None):
            status = "DIFF"
        elif g["error"] and r["error"]["type"] != "TypeError":
            error = g["error"]
            if not error["is_value_error"] or not any(key in error["message"] for key in kwargs_of[name]):
                status = "UNCLEAR"
        if status != "ok" and name in cases.KNOWN_DIFFERENCES:
            status = "KNOWN"
        (known if status == "KNOWN" else failures if status != "ok" else []).append(name)
        rows.append([name, verdict(r), verdict(g), status])
    return rows, failures, known


def verdict(result: dict) -> str:
    if result["rejected_at"] is None:
        return "accepted"
    return f"{result['rejected_at']}: {result['error']['type']}"


def compare_examples(ref: dict, got: dict) -> list[list[str]]:
    rows = []
    for name, r in ref.items():
        g = got.get(name, {"ok": False, "error": {"type": "missing"}})
        if r["ok"] and g["ok"]:
            status = "ok" if r["shape"] == g["shape"] else "SHAPE"
        elif not r["ok"] and not g["ok"]:
            status = "both fail"
        else:
            status = "vjx fails" if r["ok"] else "vLLM fails"
        note = "" if g["ok"] else f"{g['error']['type']}: {g['error'].get('message', '')[:70]}"
        rows.append([name, status, f"{r['seconds']}s / {g.get('seconds', '-')}s", note])
    return rows


def timings(report: dict) -> str:
    return ", ".join(f"{key} {value}" for key, value in report.get("timings", {}).items())


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    print(f"\n{title}")
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))


def main(vllm_path: str, vjx_path: str) -> int:
    ref, got = load(vllm_path), load(vjx_path)
    greedy = compare_greedy(ref["greedy"], got["greedy"])
    case_rows, case_failures, known = compare_cases(ref["cases"], got["cases"])
    example_rows = compare_examples(ref["examples"], got["examples"])
    print_table("(c) SamplingParams: rejected where", ["case", "vLLM", "vjx", "status"], case_rows)
    print_table("(d) offline examples", ["example", "status", "time vLLM / vjx", "vjx error"], example_rows)
    greedy_ok = not greedy["token_failures"]
    example_ok = sum(row[1] == "ok" for row in example_rows)
    summary = [
        [
            "(a) greedy tokens",
            f"{greedy['num_exact']} exact + {greedy['num_near_tie']} near-tie of {greedy['num_prompts']}",
            "PASS" if greedy_ok else "FAIL",
        ],
        [
            "(b) top-5 logprobs",
            f"max error {greedy['max_top5_logprob_error']:.2e} over {greedy['num_logprob_positions']} positions",
            "PASS" if greedy["logprobs_ok"] else "FAIL",
        ],
        [
            "(c) SamplingParams",
            f"{len(case_rows) - len(case_failures) - len(known)} agree, {len(known)} known, "
            f"{len(case_failures)} differ of {len(case_rows)}",
            "PASS" if not case_failures else "FAIL",
        ],
        [
            "(d) examples",
            f"{example_ok} same shape of {len(example_rows)}",
            "PASS" if example_ok == len(example_rows) else "FAIL",
        ],
        ["vLLM time (s)", timings(ref), ""],
        ["vjx time (s)", timings(got), ""],
    ]
    print_table("Summary", ["check", "result", ""], summary)
    for failure in greedy["token_failures"]:
        print("  (a)", failure)
    for name in known:
        print(f"  known difference {name}: {cases.KNOWN_DIFFERENCES[name]}")
    return 0 if all(row[2] != "FAIL" for row in summary) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
