"""OpenAIServingTokenization: vLLM's `POST /tokenize`, `POST /detokenize` and
`GET /tokenizer_info`.

Neither checks max_model_len (as vLLM's): a 15 MB text is tokenized whole. So each
response is built in the TokenizerPool, JSON included (serving/json_body.py), and the
event loop only sends the bytes.
"""

import functools

from starlette.responses import Response

from serving.errors import OpenAIError
from serving.json_body import dump_json
from serving.protocol import DetokenizeRequest, TokenizeRequest
from serving.serving_engine import OpenAIServing


def _json_response(body: bytes) -> Response:
    return Response(content=body, media_type="application/json")


class OpenAIServingTokenization(OpenAIServing):
    @functools.cached_property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    async def create_tokenize(self, request: TokenizeRequest) -> Response:
        """`{"count", "max_model_len", "tokens"}` (and `"token_strs"` when asked for) of a text,
        or of a chat through the chat template."""
        self.check_model(request)
        if request.messages is not None:
            text = await self.render_chat(request.messages, request.add_generation_prompt, tools=request.tools)
            add_special_tokens = False
        else:
            text, add_special_tokens = request.prompt, request.add_special_tokens
        body = await self.tokenizer_pool.run(
            len(text), self._tokenize_body, text, add_special_tokens, request.return_token_strs
        )
        return _json_response(body)

    def _tokenize_body(self, text: str, add_special_tokens: bool, return_token_strs: bool) -> bytes:
        token_ids = self.tokenizer_pool.encode_sync(text, add_special_tokens)
        content = {"count": len(token_ids), "max_model_len": self.max_model_len, "tokens": token_ids}
        if return_token_strs:
            content["token_strs"] = self.tokenizer.convert_ids_to_tokens(token_ids)
        return dump_json(content)

    def tokenizer_info(self) -> dict:
        """vLLM's /tokenizer_info: the tokenizer's init arguments (tokenizer_config.json
        without its file paths), its class, and the chat template the server uses."""
        config = {
            key: _jsonable(value)
            for key, value in (getattr(self.tokenizer, "init_kwargs", None) or {}).items()
            if key not in ("vocab_file", "merges_file")
        }
        config["tokenizer_class"] = type(self.tokenizer).__name__
        chat_template = self.chat_template or getattr(self.tokenizer, "chat_template", None)
        if chat_template:
            config["chat_template"] = chat_template
        return config

    async def create_detokenize(self, request: DetokenizeRequest) -> Response:
        self.check_model(request)
        body = await self.tokenizer_pool.run(len(request.tokens), self._detokenize_body, request.tokens)
        return _json_response(body)

    def _detokenize_body(self, token_ids: list[int]) -> bytes:
        if token_ids and not (min(token_ids) >= 0 and max(token_ids) < self.vocab_size):
            bad_id = next(t for t in token_ids if not 0 <= t < self.vocab_size)
            raise OpenAIError(
                f"tokens contains token id {bad_id}, out of the vocabulary range [0, {self.vocab_size}).",
                400,
                "tokens",
            )
        return dump_json({"prompt": self.tokenizer_pool.decode_sync(token_ids)})


def _jsonable(value):
    """Init arguments as JSON: an AddedToken as its text, containers item by item."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value
