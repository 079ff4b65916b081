"""The SSE side of one streamed chat completion of the gateway: what the client has been sent so far.

Text is sent once it can no longer change (not a possible tool-call start, nor a possible stop string
the server will trim); the final chunk carries the rest, any tool calls and the finish reason; the
turn is recorded just before the finish reason goes out (once the client has it, it may send the next
turn). A client that goes away is `ClientGone`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from aiohttp import web

from openclaw_jax.gateway.protocol import ChatCompletionRequest, GatewayHTTPError
from openclaw_jax.wire import openai as O
from openclaw_jax.wire.sglang_results import GenerateResult, openai_finish
from openclaw_jax.wire.tool_calls import safe_stream_prefix, split_tool_calls

logger = logging.getLogger("openclaw_jax.gateway.server")


class ClientGone(Exception):
    """The agent closed the connection mid-response."""


def finish_reason(result: GenerateResult, has_calls: bool) -> str:
    """The OpenAI finish reason of a result (``tool_calls`` when the reply called tools)."""
    return openai_finish(result.finish_reason, has_tool_calls=has_calls)[0] or "stop"


class ChatStream:
    """The SSE side of one streamed chat completion: what the client has been sent so far."""

    def __init__(self, response: web.StreamResponse, req: ChatCompletionRequest, *, model: str,
                 logprobs_block: Callable[[GenerateResult, int, int, int], dict[str, Any]]):
        self.response, self.req, self.model = response, req, model
        self.logprobs_block = logprobs_block
        self.completion_id, self.created = O.new_id("chatcmpl-"), O.now_s()
        # Text held back until it is final: a possible tool-call start, or a possible stop string
        # that the server will trim from the final text.
        self.holdback = max((len(s) for s in req.stop), default=1) - 1
        self.emitted = ""
        self.sent_tokens = 0

    async def send(self, obj: Any) -> None:
        try:
            await self.response.write(O.sse_event(obj))
        except (ConnectionResetError, RuntimeError) as err:
            raise ClientGone() from err

    async def chunk(self, **fields: Any) -> None:
        await self.send(O.chat_chunk(completion_id=self.completion_id, created=self.created, model=self.model,
                                     **fields))

    def _logprobs(self, result: GenerateResult, upto: int) -> dict[str, Any] | None:
        if not self.req.logprobs or upto <= self.sent_tokens:
            return None
        return self.logprobs_block(result, self.sent_tokens, upto, self.req.top_logprobs)

    async def progress(self, result: GenerateResult) -> None:
        """The text of an unfinished result that can no longer change, and the new tokens' log-probs."""
        text = result.text
        safe = safe_stream_prefix(text) if self.req.tools else len(text)
        safe = min(safe, max(len(text) - self.holdback, 0))
        while safe > 0 and text[safe - 1] == "\ufffd":  # an incomplete UTF-8 character so far
            safe -= 1
        emitted = self.emitted
        delta_text = text[len(emitted):safe] if text.startswith(emitted) and safe > len(emitted) else ""
        new_tokens = len(result.response_ids)
        lp = self._logprobs(result, new_tokens)
        if delta_text or lp:
            await self.chunk(delta={"content": delta_text} if delta_text else {}, logprobs=lp)
            self.emitted += delta_text
            if lp:
                self.sent_tokens = new_tokens

    async def finish(self, result: GenerateResult, prompt_tokens: int, *, record: Callable[[], None]) -> None:
        """The rest of the content, any tool calls, `record()`, the finish reason, usage, [DONE]."""
        text = result.text
        content, calls = split_tool_calls(text, self.req.tools)
        final_content = content if calls else text
        if not final_content.startswith(self.emitted):
            logger.warning("streamed content %r is not a prefix of the final text %r", self.emitted[-40:],
                           final_content[-40:])
        rest = final_content[len(self.emitted):] if final_content.startswith(self.emitted) else ""
        lp = self._logprobs(result, len(result.response_ids))
        if rest or lp:
            await self.chunk(delta={"content": rest} if rest else {}, logprobs=lp)
        if calls:
            await self.chunk(delta={"tool_calls": calls})
        record()
        await self.chunk(delta={}, finish_reason=finish_reason(result, bool(calls)))
        if self.req.include_usage:
            await self.chunk(delta=None, usage=O.usage(prompt_tokens, len(result.response_ids),
                                                       cached_tokens=result.cached_tokens), no_choices=True)
        await self.send("[DONE]")
        await self.response.write_eof()

    async def error(self, http: GatewayHTTPError) -> None:
        """An in-band error event (the status line is long sent), then [DONE]."""
        try:
            await self.send({"error": http.body()["error"] | {"code": http.status}})
            await self.send("[DONE]")
            await self.response.write_eof()
        except ClientGone:
            pass
