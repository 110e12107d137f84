"""`vjx serve --config FILE.yaml`: flags from a YAML mapping, as vLLM's FlexibleArgumentParser
reads its config file.

Keys are long flag names without the dashes, spelled with dashes or underscores
(`max-model-len` or `max_model_len`, `device-memory-utilization` for its alias); a value is read
as the same text on the command line would be: `true`/`false` turn an on/off flag on or off, a
list gives a flag of several values its values, a mapping is a JSON flag's object (e.g.
`compilation-config: {mode: 3}`), anything else is the flag's value. Flags given on the
command line win over the file, the file over the defaults.
"""

import argparse
import json

import yaml

_EXTENSIONS = ("yaml", "yml")


def _flag_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's flags by their long names (without dashes; `--no-x` left out)."""
    return {
        option[2:]: action
        for option, action in parser._option_string_actions.items()
        if option.startswith("--") and not option.startswith("--no-") and option != "--help"
    }


def _parse(key: str, text: str, action: argparse.Action):
    try:
        return action.type(text) if action.type else text
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        value_type = getattr(action.type, "value_type", action.type)
        raise ValueError(f"config key {key!r} must be of type {value_type.__name__}, got {text!r}.") from None


def _convert(key: str, value, action: argparse.Action):
    if isinstance(action, argparse.BooleanOptionalAction):
        if not isinstance(value, bool):
            raise ValueError(f"config key {key!r} must be true or false, got {value!r}.")
        return value
    if action.nargs in ("+", "*"):
        values = value if isinstance(value, list) else [value]
        return [_parse(key, str(v), action) for v in values]
    if isinstance(value, bool) and action.nargs == "?":
        return action.const if value else action.default
    if value is None and action.default is None:
        return None
    if value is None or isinstance(value, (bool, list)):
        raise ValueError(f"config key {key!r} must be a single value, got {value!r}.")
    return _parse(key, json.dumps(value) if isinstance(value, dict) else str(value), action)


def _read(path: str):
    if path.rpartition(".")[2] not in _EXTENSIONS:
        raise ValueError(f"config file {path!r} must be a .yaml or .yml file (vLLM's rule).")
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"config file {path!r} cannot be read: {e.strerror}.") from None
    except yaml.YAMLError as e:
        raise ValueError(f"config file {path!r} is not valid YAML: {e}") from None


def load_config_file(path: str, parser: argparse.ArgumentParser) -> dict:
    """The file's settings as {dest: value} for `parser.set_defaults`; an unknown key, or a
    value the flag cannot take, raises ValueError naming it."""
    config = _read(path)
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError(
            f"config file {path!r} must hold a mapping of flag names to values, got a {type(config).__name__}."
        )
    actions = _flag_actions(parser)
    defaults = {}
    for key, value in config.items():
        name = str(key).replace("_", "-")
        if name == "config" or name not in actions:
            raise ValueError(f"config key {key!r} is not a flag of `vjx serve` (see vjx serve --help).")
        defaults[actions[name].dest] = _convert(str(key), value, actions[name])
    return defaults
