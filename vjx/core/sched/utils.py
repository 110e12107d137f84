"""Stop checks of the scheduler: what ends a request without looking at its text."""

from vjx.core.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    """Finish the request if its last token ends it (stop strings are the front end's job).

    EOS and stop tokens count only once `min_tokens` are out, and are checked before the
    length limits, so an EOS that is also the last allowed token reports "stop".
    """
    params = request.sampling_params
    output_token_ids = request.output_token_ids
    num_output_tokens = len(output_token_ids)
    if num_output_tokens >= params.min_tokens:
        last_token_id = output_token_ids[-1]
        if not params.ignore_eos and last_token_id == request.eos_token_id:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if last_token_id in params.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last_token_id
            return True
    max_tokens = request.max_tokens
    if len(request.all_token_ids) >= max_model_len or (max_tokens is not None and num_output_tokens >= max_tokens):
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def append_until_stop(request: Request, sampled_token_ids: list[int], max_model_len: int) -> tuple[list[int], bool]:
    """Append tokens one by one up to the first that stops the request.

    Returns the tokens kept and whether the request stopped.
    """
    for num_kept, token_id in enumerate(sampled_token_ids, start=1):
        request.append_output_token_ids(token_id)
        if check_stop(request, max_model_len):
            return sampled_token_ids[:num_kept], True
    return sampled_token_ids, False
