"""The OpenAI-compatible HTTP server: a FastAPI app on one AsyncLLM, run by uvicorn.

`build_app` wires the routes to the handlers (serving_*.py) behind `ServerGuard`: the
OpenAI API's, and vLLM's own (/ping, /load, /tokenizer_info, SageMaker's /invocations). A
body that is not `application/json`, or that sets a field vjx does not honour
(serving/unsupported_fields.py), is refused before its handler runs. `run_server` starts
the engine process, then uvicorn, whose SIGTERM handling stops accepting connections and
waits up to `--shutdown-timeout` for requests in flight before the engine is shut down.
"""

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import os
from collections.abc import Awaitable, Callable

import fastapi
import pydantic
import uvicorn
from fastapi import Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving.errors import OpenAIError
from serving.metrics import ServerMetrics
from serving.middleware import ServerGuard
from serving.parser import ParserManager
from serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    LoadLoRAAdapterRequest,
    RequestModel,
    TokenizeRequest,
    UnloadLoRAAdapterRequest,
    parse_request,
)
from serving.server_args import ServerArgs
from serving.server_load import ServerLoad
from serving.serving_chat import OpenAIServingChat
from serving.serving_completion import OpenAIServingCompletion
from serving.serving_models import LoRAModulePath, OpenAIServingModels
from serving.serving_tokenization import OpenAIServingTokenization
from serving.sse import EventStreamResponse, to_openai_error
from serving.tokenizer_pool import TokenizerPool
from serving.unsupported_fields import check_supported_fields
from vjx.chat_utils import load_chat_template
from vjx.engine.async_llm import AsyncLLM
from vjx.engine.exceptions import EngineDeadError
from vjx.engine_args import EngineArgs

logger = logging.getLogger(__name__)

# Closed by the client before the response: nginx's code, seen only in the access log.
_CLIENT_CLOSED = 499


class ServerState:
    """Everything the routes use: the engine, its handlers and the metrics."""

    def __init__(
        self,
        engine: AsyncLLM,
        server_args: ServerArgs,
        served_model_names: list[str],
        log_stats: bool = True,
        reasoning_parser: str = "",
    ):
        """`reasoning_parser`: the engine's `--reasoning-parser` ("" for none)."""
        self.engine = engine
        self.server_args = server_args
        self.log_stats = log_stats
        model_path = engine.config.model_config.model
        self.models = OpenAIServingModels(served_model_names, model_path, engine.max_model_len, engine)
        chat_template = load_chat_template(server_args.chat_template)
        self.tokenizer_pool = TokenizerPool(engine.get_tokenizer())
        self.metrics = ServerMetrics(engine, self.models.model_name, server_args.metrics_prefix)
        engine.stats_listeners.append(self.metrics)
        shared = (engine, self.models, server_args, self.tokenizer_pool)
        self.completion = OpenAIServingCompletion(*shared, metrics=self.metrics)
        tool_call_parser = server_args.tool_call_parser if server_args.enable_auto_tool_choice else None
        parsers = ParserManager(engine.get_tokenizer(), reasoning_parser, tool_call_parser)
        self.chat = OpenAIServingChat(*shared, chat_template, parsers=parsers, metrics=self.metrics)
        self.tokenization = OpenAIServingTokenization(*shared, chat_template)
        self.load = ServerLoad(server_args.enable_server_load_tracking)


def _version() -> str:
    try:
        return importlib.metadata.version("vjx")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _json(model_or_dict, status_code: int = 200) -> Response:
    if isinstance(model_or_dict, pydantic.BaseModel):
        content = model_or_dict.model_dump_json()
    else:
        content = pydantic.TypeAdapter(dict).dump_json(model_or_dict)
    return Response(content=content, status_code=status_code, media_type="application/json")


def _error_response(error: OpenAIError) -> Response:
    return Response(
        content=error.to_json_bytes(),
        status_code=error.status_code,
        headers=error.headers,
        media_type="application/json",
    )


async def _wait_for_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _check_json_body(raw_request: Request) -> None:
    """vLLM's rule and answer: a body must say it is JSON (a missing Content-Type included)."""
    media_type = raw_request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise OpenAIError("1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed", 400)


async def _serve(
    raw_request: Request,
    model_class: type[RequestModel],
    handler: Callable[..., Awaitable],
    load: ServerLoad | None = None,
    body: bytes | None = None,
):
    """Parses the body (`body`, else the request's) into `model_class`, runs `handler` on it
    and answers; a client that leaves first cancels the handler (its `finally`s abort the
    engine requests). `load` counts the request until its response has ended."""
    _check_json_body(raw_request)
    try:
        request = parse_request(model_class, body if body is not None else await raw_request.body())
    except UnicodeDecodeError as e:
        raise OpenAIError(f"The request body is not valid UTF-8: {e.reason} at byte {e.start}.", 400) from None
    except pydantic.ValidationError as e:
        raise OpenAIError.from_validation_error(e) from None
    check_supported_fields(request)
    load = load or ServerLoad(enabled=False)
    load.enter()
    result = None
    try:
        result = await _run_handler(raw_request, handler, request)
    finally:
        if isinstance(result, EventStreamResponse):
            result.on_close.append(load.exit)
        else:
            load.exit()
    return result if isinstance(result, Response) else _json(result)


async def _run_handler(raw_request: Request, handler: Callable[..., Awaitable], request: RequestModel):
    handler_task = asyncio.ensure_future(handler(request))
    disconnect = asyncio.ensure_future(_wait_for_disconnect(raw_request.receive))
    try:
        await asyncio.wait([handler_task, disconnect], return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnect.cancel()
        if not handler_task.done():
            handler_task.cancel()
            await asyncio.gather(handler_task, return_exceptions=True)
    if handler_task.cancelled():
        return Response(status_code=_CLIENT_CLOSED)
    return handler_task.result()


def _add_routes(app: fastapi.FastAPI, state: ServerState) -> None:
    @app.get("/health")
    @app.get("/ping")
    @app.post("/ping")
    async def health() -> Response:
        """/ping is SageMaker's name for it (vLLM's)."""
        try:
            await state.engine.check_health()
        except EngineDeadError as e:
            return _error_response(OpenAIError.engine_dead(e))
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> Response:
        return _json({"version": _version()})

    @app.get("/v1/models")
    async def models() -> Response:
        return _json(state.models.list_models())

    @app.get("/metrics")
    async def metrics() -> Response:
        await state.metrics.update_from_engine(state.engine)
        return Response(content=state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(raw_request: Request):
        return await _serve(raw_request, CompletionRequest, state.completion.create_completion, state.load)

    @app.post("/v1/chat/completions")
    async def chat_completions(raw_request: Request):
        return await _serve(raw_request, ChatCompletionRequest, state.chat.create_chat_completion, state.load)

    @app.post("/tokenize")
    async def tokenize(raw_request: Request):
        return await _serve(raw_request, TokenizeRequest, state.tokenization.create_tokenize)

    @app.post("/detokenize")
    async def detokenize(raw_request: Request):
        return await _serve(raw_request, DetokenizeRequest, state.tokenization.create_detokenize)


def _add_vllm_routes(app: fastapi.FastAPI, state: ServerState) -> None:
    """The routes vLLM's server adds to the OpenAI API's."""

    @app.get("/load")
    async def load() -> Response:
        return _json(state.load.to_dict())

    @app.get("/v1/models/{model:path}")
    async def model_card(model: str) -> Response:
        card = state.models.model_card(model)
        if card is None:
            raise OpenAIError(f"The model `{model}` does not exist.", 404, "model")
        return _json(card)

    if state.server_args.enable_tokenizer_info_endpoint:

        @app.get("/tokenizer_info")
        async def tokenizer_info() -> Response:
            return _json(state.tokenization.tokenizer_info())

    @app.post("/invocations")
    async def invocations(raw_request: Request):
        """SageMaker's one route: a body with `messages` is a chat completion, one with
        `prompt` a completion."""
        _check_json_body(raw_request)
        body = await raw_request.body()
        keys = _top_level_keys(body)
        if "messages" in keys:
            return await _serve(raw_request, ChatCompletionRequest, state.chat.create_chat_completion, state.load, body)
        if "prompt" in keys:
            return await _serve(raw_request, CompletionRequest, state.completion.create_completion, state.load, body)
        raise OpenAIError(
            "Cannot find suitable handler for request. Expected one of: "
            "['ChatCompletionRequest', 'CompletionRequest'] (a body with messages or prompt).",
            400,
        )

    @app.post("/v1/embeddings")
    async def embeddings() -> Response:
        raise OpenAIError("The model does not support embeddings (the Embeddings API); it is a generative model.", 400)

    if state.server_args.allowed_lora_dir is not None:
        _add_lora_routes(app, state)


def _add_lora_routes(app: fastapi.FastAPI, state: ServerState) -> None:
    """vLLM's runtime adapter routes (served with --allowed-lora-dir); a plain-text success."""
    allowed_dir = state.server_args.allowed_lora_dir

    async def load(request: LoadLoRAAdapterRequest) -> Response:
        return Response(await state.models.load_lora_adapter(request, allowed_dir), media_type="text/plain")

    async def unload(request: UnloadLoRAAdapterRequest) -> Response:
        return Response(await state.models.unload_lora_adapter(request), media_type="text/plain")

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(raw_request: Request):
        return await _serve(raw_request, LoadLoRAAdapterRequest, load)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(raw_request: Request):
        return await _serve(raw_request, UnloadLoRAAdapterRequest, unload)


def _top_level_keys(body: bytes) -> set[str]:
    """The keys of a JSON object body (none for anything else); a body that is not JSON is a 400."""
    try:
        content = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise OpenAIError(f"The request body is not valid JSON: {e}.", 400) from None
    return set(content) if isinstance(content, dict) else set()


def _add_error_handlers(app: fastapi.FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def openai_error(_, error: OpenAIError) -> Response:
        return _error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_, error: StarletteHTTPException) -> Response:
        return _error_response(OpenAIError(str(error.detail), error.status_code))

    @app.exception_handler(Exception)
    async def unexpected_error(_, error: Exception) -> Response:
        return _error_response(to_openai_error(error))


def build_app(state: ServerState) -> ServerGuard:
    """The ASGI app: the FastAPI routes behind the guard (sizes, API key, access log)."""

    @contextlib.asynccontextmanager
    async def lifespan(_):
        await state.engine.check_health()
        lora_modules = [LoRAModulePath.parse(entry) for entry in state.server_args.lora_modules or []]
        await state.models.init_static_loras(lora_modules)
        stats_logger = None
        if state.log_stats:
            stats_logger = asyncio.ensure_future(
                state.metrics.log_stats_forever(state.engine, state.server_args.stats_interval)
            )
        try:
            yield
        finally:
            if stats_logger is not None:
                stats_logger.cancel()
            state.tokenizer_pool.shutdown()
            state.engine.shutdown()

    app = fastapi.FastAPI(title="vjx", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.vjx = state
    _add_routes(app, state)
    _add_vllm_routes(app, state)
    _add_error_handlers(app)
    args = state.server_args
    return ServerGuard(app, args.api_key, args.max_header_bytes, args.max_request_body_bytes, args.access_log)


def _check_lora_args(engine_args: EngineArgs, server_args: ServerArgs) -> None:
    for name in ("lora_modules", "allowed_lora_dir"):
        if getattr(server_args, name) and not engine_args.enable_lora:
            raise ValueError(f"{name} needs --enable-lora.")
    if os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true") and (
        server_args.allowed_lora_dir is None
    ):
        logger.warning(
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING is not read: vjx serves the runtime LoRA routes with --allowed-lora-dir."
        )
    if server_args.allowed_lora_dir is not None and server_args.api_key is None:
        logger.warning("--allowed-lora-dir without --api-key: any client may load adapters from under it.")


def run_server(engine_args: EngineArgs, server_args: ServerArgs) -> None:
    """Starts the engine process, then serves until SIGINT/SIGTERM."""
    logging.basicConfig(
        level=server_args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    ParserManager.check_names(engine_args.reasoning_parser)
    _check_lora_args(engine_args, server_args)
    engine = AsyncLLM(engine_args)
    try:
        names = server_args.served_model_name or OpenAIServingModels.default_names(
            engine_args.model, engine.config.model_config.model
        )
        log_stats = not engine_args.disable_log_stats
        state = ServerState(engine, server_args, names, log_stats, engine_args.reasoning_parser)
    except BaseException:
        engine.shutdown()
        raise
    config = uvicorn.Config(
        build_app(state),
        host=server_args.host,
        port=server_args.port,
        log_level=server_args.log_level,
        access_log=False,
        timeout_graceful_shutdown=server_args.shutdown_timeout,
        h11_max_incomplete_event_size=server_args.max_header_bytes * 2,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    try:
        server.run()
    finally:
        engine.shutdown()
