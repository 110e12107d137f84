"""The front end's request processors, built one way for `LLMEngine` and `AsyncLLM`.

One tokenizer serves both halves around EngineCore: the `InputProcessor` (tokenize and
validate a request) and the `OutputProcessor` (detokenize, stop strings, RequestOutputs), so
what the engine is given and what it returns read the same vocabulary.
"""

from typing import NamedTuple

import transformers
from transformers import PreTrainedTokenizerBase

from vjx.config import ModelConfig
from vjx.engine.input_processor import InputProcessor
from vjx.engine.output_processor import OutputProcessor
from vjx.lora.config import LoRAConfig


class Processors(NamedTuple):
    tokenizer: PreTrainedTokenizerBase
    input_processor: InputProcessor
    output_processor: OutputProcessor


def make_processors(model_config: ModelConfig, lora_config: LoRAConfig | None = None) -> Processors:
    """The model's tokenizer and the input and output processors that share it."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_config.tokenizer)
    input_processor = InputProcessor(model_config, tokenizer, lora_config=lora_config)
    return Processors(tokenizer, input_processor, OutputProcessor(tokenizer))
