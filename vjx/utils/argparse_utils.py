"""`FlexibleArgumentParser`, the parser vLLM's example scripts build their flags with, and the
value types of vLLM's engine flags.

As vLLM's, the parser takes a flag spelled with underscores (`--max_model_len 512`) as the
dashed flag it names (`--max-model-len`), `-O3` (or `-O 3`, `-O=3`) as `--optimization-level 3`,
and a JSON flag's keys one by one: `--compilation-config.mode 3 -cc.backend=eager` is
`--compilation-config '{"mode": 3, "backend": "eager"}'` (`--flag.key+ a,b` appends a list).
"""

import argparse
import json
import re
import sys
from collections.abc import Sequence

_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_OPTIMIZATION_LEVELS = ("0", "1", "2", "3")


def human_readable_int(text: str) -> int:
    """An int, or a number with a decimal (`25.6k` = 25600) or binary (`2K` = 2048) suffix."""
    text = text.strip()
    match = _HUMAN_INT.fullmatch(text)
    if match is None:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer such as 2048, 32k or 1M, got {text!r}") from None
    number, suffix = match.groups()
    if suffix.isupper() and "." in number:
        raise argparse.ArgumentTypeError(f"a binary suffix takes a whole number, got {text!r}")
    return int(float(number) * _SUFFIXES[suffix])


def human_readable_int_or_auto(text: str) -> int:
    """`human_readable_int`, or -1 for `auto` / `-1` (vLLM's "choose for me")."""
    return -1 if text.strip().lower() in ("auto", "-1") else human_readable_int(text)


def json_object(text: str) -> dict:
    """A command-line JSON object (the type of dict and config-object flags)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r} ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def json_object_or_str(text: str) -> dict | str:
    """A JSON object when the text looks like one (`{...}`), else the text itself."""
    return json_object(text) if re.fullmatch(r"(?s)\s*\{.*\}\s*", text) else text


def _optional(parse):
    """`parse`, except that '' and 'None' mean None (vLLM's flags whose default is None)."""

    def parse_optional(text: str):
        return None if text in ("", "None") else parse(text)

    parse_optional.value_type = getattr(parse, "value_type", parse)
    return parse_optional


human_readable_int.value_type = int
human_readable_int_or_auto.value_type = int
json_object.value_type = dict
json_object_or_str.value_type = dict

FLAG_TYPES = {
    "str": str,
    "int": int,
    "float": float,
    "hint": human_readable_int,
    "hint_auto": human_readable_int_or_auto,
    "json": json_object,
    "json_or_str": json_object_or_str,
}
"""The value types of the single-value flags of vjx.engine.vllm_args, by their name there."""


def flag_kwargs(flag: str, default) -> dict:
    """`add_argument` keywords of a flag of kind `flag`: `bool` is `--x/--no-x`, `strs`/`ints` take
    one or more values, `token` may stand alone (True) or take a string; the rest take one value."""
    if flag == "bool":
        return {"action": argparse.BooleanOptionalAction, "default": default}
    if flag in ("strs", "ints"):
        return {"type": str if flag == "strs" else int, "nargs": "+", "default": default}
    if flag == "token":
        return {"type": str, "nargs": "?", "const": True, "default": default}
    parse = FLAG_TYPES[flag]
    return {"type": _optional(parse) if default is None else parse, "default": default}


class FlexibleArgumentParser(argparse.ArgumentParser):
    """An `ArgumentParser` that reads vLLM's spellings of its flags (see the module doc)."""

    def parse_known_args(self, args: Sequence[str] | None = None, namespace=None):
        args = sys.argv[1:] if args is None else args
        return super().parse_known_args(self._json_keys_joined(_optimization_level(args)), namespace)

    def _json_keys_joined(self, args: list[str]) -> list[str]:
        """`--flag.key value` and `--flag.key=value` of this parser's flags folded into one JSON
        object per flag, placed where the flag's first key was."""
        objects: dict[str, dict] = {}
        value_positions: dict[str, int] = {}
        joined = []
        index = 0
        while index < len(args):
            arg = _dashed(args[index])
            name, dot, rest = arg.partition("=")[0].partition(".")
            if not dot or not arg.startswith("-") or name not in self._option_string_actions:
                joined.append(arg)
                index += 1
                continue
            if "=" in arg:
                value, index = arg.partition("=")[2], index + 1
            elif index + 1 < len(args):
                value, index = args[index + 1], index + 2
            else:
                raise ValueError(f"{arg} needs a value.")
            dest = self._option_string_actions[name].dest
            if dest not in objects:
                objects[dest] = {}
                value_positions[dest] = len(joined) + 1
                joined += [name, ""]
            _set_key(objects[dest], rest, value)
        for dest, position in value_positions.items():
            joined[position] = json.dumps(objects[dest])
        return joined


def _set_key(target: dict, path: str, text: str) -> None:
    """Sets `target[a][b]...` for the path `a.b...` to the JSON value of `text` (its text when it
    is not JSON); a path ending in `+` appends the comma-separated items of `text`."""
    keys = path.removesuffix("+").split(".")
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    if path.endswith("+"):
        target.setdefault(keys[-1], []).extend(text.split(","))
        return
    try:
        target[keys[-1]] = json.loads(text)
    except json.JSONDecodeError:
        target[keys[-1]] = text


def _optimization_level(args: Sequence[str]) -> list[str]:
    """`-O3`, `-O=3` and `-O 3` as `--optimization-level 3`."""
    spelled = []
    for index, arg in enumerate(args):
        if arg.startswith("-O") and arg != "-O" and not arg.startswith("-O."):
            spelled += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
        elif arg == "-O" and index + 1 < len(args) and args[index + 1] in _OPTIMIZATION_LEVELS:
            spelled.append("--optimization-level")
        else:
            spelled.append(arg)
    return spelled


def _dashed(arg: str) -> str:
    """`--a_b.c_d=v` as `--a-b.c_d=v`: underscores of the flag name only, not of its keys or value."""
    if not arg.startswith("--"):
        return arg
    flag, sep, value = arg.partition("=")
    name, dot, keys = flag.partition(".")
    return name.replace("_", "-") + dot + keys + sep + value
