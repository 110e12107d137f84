"""`vjx serve --config FILE`: flags from a YAML mapping, as vLLM reads its config file.

Keys are flag names without the dashes (`max-model-len` or `max_model_len`); values are
what the flag takes (`true`/`false` for on/off flags, a list for a flag of several values).
Flags given on the command line win over the file.
"""

import argparse

import yaml


def _flag_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {action.dest: action for action in parser._actions if action.option_strings}


def _convert(key: str, value, action: argparse.Action):
    if isinstance(action, argparse.BooleanOptionalAction):
        if not isinstance(value, bool):
            raise ValueError(f"config key {key!r} must be true or false, got {value!r}.")
        return value
    if action.nargs in ("+", "*"):
        values = value if isinstance(value, list) else [value]
        return [action.type(v) if action.type else str(v) for v in values]
    if value is None or isinstance(value, (dict, list)):
        raise ValueError(f"config key {key!r} must be a single value, got {value!r}.")
    try:
        return action.type(value) if action.type else str(value)
    except (TypeError, ValueError):
        raise ValueError(f"config key {key!r} must be of type {action.type.__name__}, got {value!r}.") from None


def load_config_file(path: str, parser: argparse.ArgumentParser) -> dict:
    """The file's settings as {dest: value} for `parser.set_defaults`; an unknown key, or a
    value the flag cannot take, raises ValueError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"config file {path!r} cannot be read: {e.strerror}.") from None
    except yaml.YAMLError as e:
        raise ValueError(f"config file {path!r} is not valid YAML: {e}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError(
            f"config file {path!r} must hold a mapping of flag names to values, got a {type(config).__name__}."
        )
    actions = _flag_actions(parser)
    defaults = {}
    for key, value in config.items():
        dest = str(key).replace("-", "_")
        if dest == "config" or dest not in actions or dest == "help":
            raise ValueError(f"config key {key!r} is not a flag of `vjx serve` (see vjx serve --help).")
        defaults[dest] = _convert(str(key), value, actions[dest])
    return defaults
