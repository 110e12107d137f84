"""The engine's logprobs in the response formats: the completions' legacy lists, the chat
format, and vLLM's `prompt_logprobs`.

With vLLM's `return_tokens_as_token_ids` every token reads "token_id:N" instead of its
text, so a client can tell apart tokens that are not valid UTF-8 on their own.
"""

from serving.protocol import (
    ChatChoiceLogprobs,
    ChatTokenLogprob,
    ChatTopLogprob,
    CompletionLogProbs,
    PromptLogprob,
    PromptLogprobs,
)
from vjx.outputs import Logprob

_MIN_LOGPROB = -9999.0
"""What a -inf logprob reads as in `prompt_logprobs` (JSON has no infinity), as in vLLM."""


def token_text(token_id: int, logprob: Logprob, as_token_ids: bool) -> str:
    return f"token_id:{token_id}" if as_token_ids else logprob.decoded_token or ""


def make_completion_logprobs(
    token_ids: list[int], logprobs: list, num_top: int, tokenizer, start_offset: int = 0, as_token_ids: bool = False
) -> CompletionLogProbs:
    """The legacy logprobs of some tokens: each position's chosen token (the first entry of
    its dict), its logprob, its `num_top` best candidates plus itself, and text offsets.
    A None position (the prompt's first token) has no logprob."""
    out = CompletionLogProbs()
    offset = start_offset
    for token_id, position in zip(token_ids, logprobs):
        if position is None:
            token = f"token_id:{token_id}" if as_token_ids else tokenizer.decode([token_id])
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
        else:
            chosen_id = token_id if token_id in position else next(iter(position))
            chosen = position[chosen_id]
            token = token_text(chosen_id, chosen, as_token_ids)
            top = {
                token_text(t, lp, as_token_ids): lp.logprob
                for t, lp in position.items()
                if lp.rank is not None and lp.rank <= num_top
            }
            top.setdefault(token, chosen.logprob)
            out.token_logprobs.append(chosen.logprob)
            out.top_logprobs.append(top)
        out.tokens.append(token)
        out.text_offset.append(offset)
        offset += len(token)
    return out


def make_chat_logprobs(
    token_ids: list[int], logprobs: list, num_top: int, as_token_ids: bool = False
) -> ChatChoiceLogprobs:
    """Each token's logprob and its `num_top` best candidates, in the chat format."""

    def top_logprob(token_id: int, lp: Logprob) -> ChatTopLogprob:
        token = token_text(token_id, lp, as_token_ids)
        return ChatTopLogprob(token=token, logprob=lp.logprob, bytes=list(token.encode("utf-8")))

    content = []
    for token_id, position in zip(token_ids, logprobs):
        chosen_id = token_id if token_id in position else next(iter(position))
        chosen = top_logprob(chosen_id, position[chosen_id])
        candidates = sorted(
            (item for item in position.items() if item[1].rank is not None and item[1].rank <= num_top),
            key=lambda item: item[1].rank,
        )
        top = [top_logprob(t, lp) for t, lp in candidates[:num_top]]
        content.append(ChatTokenLogprob(**chosen.model_dump(), top_logprobs=top))
    return ChatChoiceLogprobs(content=content)


def to_prompt_logprobs(prompt_logprobs: list | None) -> PromptLogprobs | None:
    """The engine's prompt logprobs (None, then one dict per prompt token) in vLLM's shape."""
    if prompt_logprobs is None:
        return None
    return [
        None
        if position is None
        else {
            token_id: PromptLogprob(
                logprob=_MIN_LOGPROB if lp.logprob == float("-inf") else lp.logprob,
                rank=lp.rank,
                decoded_token=lp.decoded_token,
            )
            for token_id, lp in position.items()
        }
        for position in prompt_logprobs
    ]
