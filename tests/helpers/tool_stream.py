"""Streamed chat replies put back together, to compare with the whole reply."""


def reassembled(stream) -> tuple[str, list[tuple[str, str]], str | None]:
    """A stream's content, its tool calls (name, arguments) put together from their deltas, and
    its finish reason; asserts each call starts once, with its id and type."""
    content, calls, finish_reason = "", {}, None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                if call.id is not None:
                    assert call.type == "function" and call.index not in calls
                    calls[call.index] = [call.function.name, ""]
                calls[call.index][1] += call.function.arguments or ""
            finish_reason = choice.finish_reason or finish_reason
    return content, [tuple(calls[index]) for index in sorted(calls)], finish_reason
