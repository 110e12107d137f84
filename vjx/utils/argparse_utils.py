"""`FlexibleArgumentParser`, the parser vLLM's example scripts build their flags with.

As vLLM's, it takes a flag spelled with underscores (`--max_model_len 512`) as the dashed
flag it names (`--max-model-len`); values are left as they are.
"""

import argparse
import sys
from collections.abc import Sequence


class FlexibleArgumentParser(argparse.ArgumentParser):
    """An `ArgumentParser` that reads `--a_b` (and `--a_b=v`) as `--a-b`."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace=None):
        args = sys.argv[1:] if args is None else args
        return super().parse_known_args([_dashed(arg) for arg in args], namespace)


def _dashed(arg: str) -> str:
    if not arg.startswith("--"):
        return arg
    flag, sep, value = arg.partition("=")
    return flag.replace("_", "-") + sep + value
