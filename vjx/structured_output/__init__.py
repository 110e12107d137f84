"""Structured outputs in the engine core: grammars compiled off the step's path, advanced by
each sampled token, and a bitmask of allowed tokens for the rows of the next step."""

from vjx.structured_output.manager import StructuredOutputManager

__all__ = ["StructuredOutputManager"]
