"""OpenAIServingTokenization: vLLM's `POST /tokenize` and `POST /detokenize`."""

from serving.chat_utils import apply_chat_template
from serving.errors import OpenAIError
from serving.protocol import DetokenizeRequest, TokenizeRequest
from serving.serving_engine import OpenAIServing
from serving.serving_models import OpenAIServingModels
from vjx.engine.async_llm import AsyncLLM


class OpenAIServingTokenization(OpenAIServing):
    def __init__(self, engine: AsyncLLM, models: OpenAIServingModels, chat_template: str | None):
        super().__init__(engine, models)
        self.chat_template = chat_template

    def create_tokenize(self, request: TokenizeRequest) -> dict:
        """`{"count", "max_model_len", "tokens"}` (and `"token_strs"` when asked for) of a text,
        or of a chat through the chat template."""
        self.check_model(request)
        if request.messages is not None:
            text = apply_chat_template(
                self.tokenizer, request.messages, self.chat_template, request.add_generation_prompt
            )
            token_ids = self.tokenizer.encode(text, add_special_tokens=False)
        else:
            token_ids = self.tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        response = {"count": len(token_ids), "max_model_len": self.max_model_len, "tokens": token_ids}
        if request.return_token_strs:
            response["token_strs"] = self.tokenizer.convert_ids_to_tokens(token_ids)
        return response

    def create_detokenize(self, request: DetokenizeRequest) -> dict:
        self.check_model(request)
        vocab_size = len(self.tokenizer)
        bad_ids = [t for t in request.tokens if not 0 <= t < vocab_size]
        if bad_ids:
            raise OpenAIError(
                f"tokens contains token id {bad_ids[0]}, out of the vocabulary range [0, {vocab_size}).", 400, "tokens"
            )
        return {"prompt": self.tokenizer.decode(request.tokens)}
