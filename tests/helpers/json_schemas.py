"""Random JSON schemas for structured-output tests: objects, arrays, enums, nesting, string
formats and bounds, each small enough that a tiny model's constrained answer ends well
inside a 256-token context (bounded strings and arrays, closed objects, every key required)."""

import random

_FORMATS = ("date", "uuid", "ipv4")
_WORDS = ("red", "green", "blue", "alpha", "beta", "north", "south", "yes", "no", "maybe")


def random_schema(seed: int) -> dict:
    rng = random.Random(seed)
    return _object(rng, depth=0)


def _object(rng: random.Random, depth: int) -> dict:
    names = rng.sample(("name", "age", "city", "tags", "score", "kind", "when", "id", "ok", "info"), rng.randint(1, 3))
    properties = {name: _value(rng, depth) for name in names}
    return {"type": "object", "properties": properties, "required": names, "additionalProperties": False}


def _value(rng: random.Random, depth: int) -> dict:
    kinds = ["string", "integer", "boolean", "enum", "format"]
    if depth < 1:
        kinds += ["array", "object"]
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(3, 12)}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 100)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(_WORDS, rng.randint(1, 4))}
    if kind == "format":
        return {"type": "string", "format": rng.choice(_FORMATS)}
    if kind == "array":
        return {"type": "array", "items": _value(rng, depth + 1), "minItems": 1, "maxItems": rng.randint(1, 3)}
    return _object(rng, depth + 1)
