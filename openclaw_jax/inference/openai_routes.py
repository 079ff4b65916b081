"""The embedded server's OpenAI endpoints: `/v1/chat/completions` and `/v1/completions` (SGLang's shapes).

A mixin of :class:`~openclaw_jax.inference.server.InferenceServer`: the handlers use its prompt
checks, engine submission and streaming helpers. Logprobs, streaming, n > 1, echo and
``<tool_call>`` parsing; the shapes themselves are :mod:`openclaw_jax.wire.openai`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from openclaw_jax.inference import protocol as P
from openclaw_jax.inference.types import GenerationSpec, SequenceOutput
from openclaw_jax.http import http_guard as G
from openclaw_jax.http.text_budget import message_chars
from openclaw_jax.wire import json_safe
from openclaw_jax.wire import openai as O
from openclaw_jax.wire import tool_calls as TC
from openclaw_jax.wire.errors import WireError
from openclaw_jax.wire.sglang_results import openai_finish


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(text=json_safe.dumps(obj), status=status, content_type="application/json")


class OpenAIRoutes:
    """OpenAI-compatible handlers; the host class provides the engine helpers they call."""

    # ------------------------------------------------------------------ /v1/chat/completions
    async def _chat_prompt(self, req: P.ChatRequest) -> list[int]:
        if req.images:
            # Parsed and checked (wire/images.py); the engine's image prefill is not wired to this route yet.
            raise WireError("this server does not serve images yet (image_url parts are accepted by the parser "
                            "only); send text content", param="messages")
        if req.input_ids is not None:
            return list(req.input_ids)
        messages = req.messages
        prefix = None
        if messages and messages[-1]["role"] == "assistant" and isinstance(messages[-1].get("content"), str):
            if req.continue_final_message:
                prefix, messages = messages[-1]["content"], messages[:-1]
            else:
                messages = messages[:-1] + [{"role": "user", "content": messages[-1]["content"]}]
        tools = req.tools if req.tool_choice != "none" else None
        chars = message_chars(messages, tools) + len(prefix or "")
        why = self.budget.conversation_too_long(messages, chars)
        if why is not None:
            raise WireError(f"the messages: {why}")
        try:
            ids = await self.budget.render(messages, chars=chars, tools=tools, **req.chat_template_kwargs)
        except Exception as exc:  # template errors are the request's fault (roles, missing fields)
            raise WireError(f"failed to apply the chat template: {type(exc).__name__}: {exc}") from None
        if prefix:
            ids += (await self._encode_all([prefix], "the final assistant message"))[0]
        return ids

    def _chat_specs(self, req: P.ChatRequest, ids: list[int]) -> list[GenerationSpec]:
        self._validate(ids, req.sampling, [0])
        base = req.rid or O.new_id("")
        return [GenerationSpec(prompt_ids=tuple(ids), sampling=req.sampling, return_logprob=req.logprobs,
                               top_logprobs_num=req.top_logprobs, rid=base if req.sampling.n == 1 else f"{base}-{j}",
                               sample_index=j, lora_path=req.lora_path)
                for j in range(req.sampling.n)]

    def _chat_logprobs(self, ids, logprobs, tops) -> dict[str, Any]:
        return O.logprobs_of_ids(ids, logprobs, tops, self.token_text)

    @staticmethod
    def _split_tool_calls(req: P.ChatRequest, text: str) -> tuple[str, list[dict[str, Any]]]:
        return TC.split_tool_calls(text, req.tools if req.tool_choice != "none" else None)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        self._refuse_many_messages(body)
        req = await G.parse_off_loop(request, P.parse_chat_request, body, vocab_size=self.vocab_size,
                                     image_limits=self.image_limits)
        ids = await self._chat_prompt(req)
        specs = self._chat_specs(req, ids)
        request_id = "chatcmpl-" + (req.rid or O.new_id(""))
        created = O.now_s()
        if not req.stream:
            outs = await self._run_all(specs)
            choices = []
            for i, out in enumerate(outs):
                content, calls = self._split_tool_calls(req, out.text)
                finish, matched = openai_finish(out.finish_reason, has_tool_calls=bool(calls))
                logprobs = (self._chat_logprobs(out.output_ids, out.output_logprobs, out.output_top_logprobs)
                            if req.logprobs else None)
                choices.append(O.chat_choice(i, O.chat_message(content or "", calls), finish_reason=finish,
                                             matched_stop=matched, logprobs=logprobs))
            usage = O.usage(len(ids), sum(len(o.output_ids) for o in outs), details=True)
            return json_response(O.chat_completion(completion_id=request_id, model=req.model, created=created,
                                                   choices=choices, usage=usage,
                                                   metadata={"weight_version": outs[0].weight_version}))
        return await self._chat_stream(request, req, specs, ids, request_id, created)

    async def _chat_stream(self, request, req: P.ChatRequest, specs, ids, request_id, created):
        resp = await self._start_sse(request)
        use_tools = bool(req.tools) and req.tool_choice != "none"
        sent_text: dict[int, int] = {}
        sent_tokens: dict[int, int] = {}
        completion: dict[int, int] = {}

        def chunk(*, delta: dict[str, Any] | None = None, **kw: Any) -> bytes:
            return O.sse_event(O.chat_chunk(completion_id=request_id, model=req.model, created=created,
                                            delta=O.full_delta(delta), **kw))

        async with self._client_stream(specs) as outputs:
            for i in range(len(specs)):
                await resp.write(chunk(index=i, delta={"role": "assistant", "content": ""}))
                sent_text[i] = sent_tokens[i] = completion[i] = 0
            async for i, out in outputs:
                completion[i] = len(out.output_ids)
                logprobs = None
                if req.logprobs and len(out.output_ids) > sent_tokens[i]:
                    a = sent_tokens[i]
                    logprobs = self._chat_logprobs(out.output_ids[a:], out.output_logprobs[a:],
                                                   out.output_top_logprobs[a:] if out.output_top_logprobs else None)
                    sent_tokens[i] = len(out.output_ids)
                usage = O.usage(len(ids), completion[i], details=True) if req.continuous_usage_stats else None
                if not out.finished:
                    safe = TC.safe_stream_prefix(out.text) if use_tools else len(out.text)
                    delta_text = out.text[sent_text[i]:safe] if safe > sent_text[i] else ""
                    if delta_text or logprobs:
                        await resp.write(chunk(index=i, delta={"content": delta_text}, logprobs=logprobs, usage=usage))
                        sent_text[i] = max(sent_text[i], safe)
                    continue
                content, calls = self._split_tool_calls(req, out.text)
                finish, matched = openai_finish(out.finish_reason, has_tool_calls=bool(calls))
                delta: dict[str, Any] = {}
                if calls:
                    remaining = content[sent_text[i]:] if len(content) > sent_text[i] else ""
                    if remaining:
                        delta["content"] = remaining
                    delta["tool_calls"] = calls
                else:
                    delta["content"] = out.text[sent_text[i]:]
                await resp.write(chunk(index=i, delta=delta, finish_reason=finish, matched_stop=matched,
                                       logprobs=logprobs, usage=usage))
            if req.include_usage:
                await resp.write(chunk(usage=O.usage(len(ids), sum(completion.values()), details=True), no_choices=True))
            await resp.write(O.SSE_DONE)
            await resp.write_eof()
        return resp

    # ------------------------------------------------------------------ /v1/completions
    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        req = await G.parse_off_loop(request, P.parse_completion_request, body, vocab_size=self.vocab_size)
        texts = [p for p in req.prompts if not isinstance(p, tuple)]
        encoded = iter(await self._encode_all(texts, "prompt") if texts else [])
        prompts_ids = [list(p) if isinstance(p, tuple) else next(encoded) for p in req.prompts]
        prompt_texts = [p if isinstance(p, str) else self.tokenizer.decode(list(p)) for p in req.prompts]
        base = req.rid or O.new_id("")
        specs = self._completion_specs(req, prompts_ids, base)
        head = {"completion_id": "cmpl-" + base, "model": req.model, "created": O.now_s()}
        if not req.stream:
            return await self._complete_texts(req, specs, prompts_ids, prompt_texts, head)
        return await self._stream_completions(request, req, specs, prompts_ids, prompt_texts, head)

    def _completion_specs(self, req: P.CompletionRequest, prompts_ids: list[list[int]],
                          base: str) -> list[GenerationSpec]:
        """`n` sequences per prompt, validated against the context and the request's token budget."""
        want_lp = req.logprobs is not None
        specs = []
        total = [0]
        for p, ids in enumerate(prompts_ids):
            self._validate(ids, req.sampling, total)
            for j in range(req.sampling.n):
                specs.append(GenerationSpec(prompt_ids=tuple(ids), sampling=req.sampling, return_logprob=want_lp,
                                            top_logprobs_num=req.logprobs or 0,
                                            logprob_start_len=0 if (req.echo and want_lp) else -1,
                                            rid=f"{base}-{p}-{j}", sample_index=j, lora_path=req.lora_path))
        return specs

    def _completion_logprobs(self, req: P.CompletionRequest, out: SequenceOutput, first: bool) -> dict | None:
        """The `logprobs` of a choice (with the prompt's, when echoing, on its first chunk)."""
        if req.logprobs is None:
            return None
        ids = list(out.output_ids)
        lps: list[float | None] = list(out.output_logprobs)
        tops = list(out.output_top_logprobs) if req.logprobs else None
        if req.echo and first:
            ids = out.prompt_ids + ids
            lps = list(out.input_logprobs or []) + lps
            if tops is not None:
                tops = list(out.input_top_logprobs or []) + tops
        tt = self.token_text
        return O.completion_logprobs([tt(int(t)) for t in ids], lps, None if tops is None else [
            None if pos is None else [(v, tt(int(t))) for v, t in pos] for pos in tops])

    async def _complete_texts(self, req: P.CompletionRequest, specs: list[GenerationSpec],
                              prompts_ids: list[list[int]], prompt_texts: list[str], head: dict) -> web.Response:
        n = req.sampling.n
        outs = await self._run_all(specs)
        choices = []
        for k, out in enumerate(outs):
            text = (prompt_texts[k // n] + out.text) if req.echo else out.text
            finish, matched = openai_finish(out.finish_reason)
            choices.append(O.completion_choice(k, text, finish_reason=finish, matched_stop=matched,
                                               logprobs=self._completion_logprobs(req, out, True)))
        usage = O.usage(sum(len(i) for i in prompts_ids), sum(len(o.output_ids) for o in outs), details=True)
        return json_response(O.text_completion(**head, choices=choices, usage=usage,
                                               metadata={"weight_version": outs[0].weight_version}))

    async def _stream_completions(self, request: web.Request, req: P.CompletionRequest,
                                  specs: list[GenerationSpec], prompts_ids: list[list[int]], prompt_texts: list[str],
                                  head: dict) -> web.StreamResponse:
        n = req.sampling.n
        resp = await self._start_sse(request)
        sent_text = {k: 0 for k in range(len(specs))}
        sent_tokens = {k: 0 for k in range(len(specs))}
        completion = {k: 0 for k in range(len(specs))}
        first = {k: True for k in range(len(specs))}
        async with self._client_stream(specs) as outputs:
            async for k, out in outputs:
                completion[k] = len(out.output_ids)
                text = out.text[sent_text[k]:]
                if req.echo and first[k]:
                    text = prompt_texts[k // n] + text
                sent_text[k] = len(out.text)
                lp = None
                if req.logprobs is not None:
                    a = sent_tokens[k]
                    partial = SequenceOutput(rid=out.rid, prompt_ids=out.prompt_ids, output_ids=out.output_ids[a:],
                                             output_logprobs=out.output_logprobs[a:],
                                             output_top_logprobs=out.output_top_logprobs[a:],
                                             input_logprobs=out.input_logprobs,
                                             input_top_logprobs=out.input_top_logprobs)
                    lp = self._completion_logprobs(req, partial, first[k])
                    sent_tokens[k] = len(out.output_ids)
                finish, matched = openai_finish(out.finish_reason)
                if text or lp or finish:
                    usage = (O.usage(len(prompts_ids[k // n]), completion[k], details=True) if req.continuous_usage_stats
                             else None)
                    await resp.write(O.sse_event(O.text_completion(
                        **head, usage=usage,
                        choices=[O.completion_choice(k, text, finish_reason=finish, matched_stop=matched, logprobs=lp)])))
                first[k] = False
            if req.include_usage:
                usage = O.usage(sum(len(i) for i in prompts_ids), sum(completion.values()), details=True)
                await resp.write(O.sse_event(O.text_completion(**head, choices=[], usage=usage)))
            await resp.write(O.SSE_DONE)
            await resp.write_eof()
        return resp

