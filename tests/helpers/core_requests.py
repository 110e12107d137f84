"""`EngineCoreRequest`s for the front-end tests, encoded with the test tokenizer."""

from tests.helpers.tokenizer import EOS
from vjx.engine.messages import EngineCoreRequest
from vjx.sampling_params import SamplingParams


def core_request(tokenizer, request_id: str = "r", prompt: str = "The", **params) -> EngineCoreRequest:
    """The prompt encoded with <bos>, EOS as the stop token, arrival time 0; `params` go to
    SamplingParams."""
    return EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=tokenizer.encode(prompt),
        sampling_params=SamplingParams(**params),
        eos_token_id=EOS,
        arrival_time=0.0,
    )
