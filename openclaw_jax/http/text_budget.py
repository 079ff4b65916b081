"""Cheap length checks before tokenizing, and tokenizing/rendering off the event loop.

A token of the vocabulary spans at most ``max_token_chars`` characters of the input (the longest
token spelling: byte-level tokens are spelled one character per byte, added tokens by their
content). So a text of ``n`` characters tokenizes to at least ``ceil(n / max_token_chars)``
tokens, and a text longer than ``max_tokens * max_token_chars`` characters cannot fit
``max_tokens`` in any tokenization: it is rejected at once, before any tokenizer work. (A
normalizer that deletes characters could make such a text shorter in tokens; none of the
supported tokenizers has one, and such input is absurd anyway.)

Tokenizing runs through ``encode_batch`` on a worker thread: the Rust tokenizer releases the GIL
there (``encode`` does not), so the event loop keeps serving while a large text is tokenized.
Chat-template rendering (Jinja, pure Python) of a large conversation also runs on a thread, where
the interpreter switches back to the loop every few milliseconds.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Mapping, Sequence

from openclaw_jax.http.offload import run_heavy

# Below this many characters, tokenizing/rendering inline costs less than a thread hand-off.
OFFLOAD_CHARS = 16_384


@functools.lru_cache(maxsize=8)
def _max_token_chars_of(backend: Any, vocab_size: int) -> int:
    longest = 1
    for i in range(vocab_size):
        token = backend.id_to_token(i)
        if token:
            longest = max(longest, len(token))
    return longest


def max_token_chars(tokenizer: Any) -> int:
    """Longest spelling (in characters) of any token of ``tokenizer`` (cached per tokenizer backend)."""
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "id_to_token"):
        return _max_token_chars_of(backend, int(tokenizer.vocab_size))
    id_to_token = getattr(tokenizer, "id_to_token", None) or getattr(tokenizer, "convert_ids_to_tokens")
    return max([1] + [len(id_to_token(i) or "") for i in range(int(tokenizer.vocab_size))])


def message_chars(messages: Sequence[Mapping[str, Any]], tools: Any = None) -> int:
    """Characters of text a conversation carries (contents, reasoning, tool-call arguments, tool schemas)."""
    total = len(json.dumps(tools, default=str)) if tools else 0
    for msg in messages:
        for key in ("content", "reasoning_content"):
            value = msg.get(key)
            if isinstance(value, str):
                total += len(value)
        for call in msg.get("tool_calls") or ():
            if isinstance(call, Mapping):
                fn = call.get("function")
                if isinstance(fn, Mapping):
                    args = fn.get("arguments")
                    total += len(args) if isinstance(args, str) else len(repr(args))
    return total


class TextBudget:
    """Length limits of one tokenizer/context, and off-loop tokenization.

    ``max_text_chars``: the largest text (in characters) a request may carry; by default the most
    characters that could still fit ``max_tokens`` tokens (see the module docstring).
    """

    def __init__(self, tokenizer: Any, *, max_tokens: int, max_text_chars: int | None = None,
                 offload_chars: int = OFFLOAD_CHARS) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        self.tokenizer = tokenizer
        self.max_tokens = int(max_tokens)
        self.token_chars = max_token_chars(tokenizer)
        bound = self.max_tokens * self.token_chars
        if max_text_chars is not None and max_text_chars < 1:
            raise ValueError(f"max_text_chars={max_text_chars} must be >= 1 (or None for the derived bound)")
        self.max_text_chars = bound if max_text_chars is None else min(int(max_text_chars), bound)
        self.offload_chars = offload_chars

    def too_long(self, chars: int) -> str | None:
        """Why a text of ``chars`` characters is refused without tokenizing it, or None."""
        if chars <= self.max_text_chars:
            return None
        return (f"{chars} characters of text cannot fit {self.max_tokens} tokens (at most {self.max_text_chars} "
                f"characters are accepted: no token of this vocabulary spans more than {self.token_chars})")

    def conversation_too_long(self, messages: Sequence[Any], chars: int) -> str | None:
        """Why a conversation is refused before rendering, or None. Besides the characters: every chat
        template we serve renders each message with at least one token (its role header)."""
        if len(messages) > self.max_tokens:
            return f"{len(messages)} messages cannot fit {self.max_tokens} tokens (each takes at least one)"
        return self.too_long(chars)

    def _encode_now(self, texts: Sequence[str]) -> list[list[int]]:
        batch = getattr(self.tokenizer, "encode_batch", None)
        if batch is not None:
            return [list(ids) for ids in batch(list(texts))]
        return [list(self.tokenizer.encode(t)) for t in texts]

    def check(self, texts: Sequence[str], what: str = "the text") -> None:
        """ValueError (with the reason) if any of ``texts`` cannot fit, before any tokenizer work."""
        for i, text in enumerate(texts):
            why = self.too_long(len(text))
            if why is not None:
                raise ValueError(f"{what}{f'[{i}]' if len(texts) > 1 else ''}: {why}")

    async def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (no special tokens added); on a worker thread when they are large."""
        if sum(len(t) for t in texts) < self.offload_chars:
            return [list(self.tokenizer.encode(t)) for t in texts]
        return await run_heavy(self._encode_now, texts)

    async def encode(self, text: str) -> list[int]:
        return (await self.encode_many([text]))[0]

    async def render(self, messages: Sequence[Mapping[str, Any]], *, chars: int | None = None,
                     **template_kwargs: Any) -> list[int]:
        """``apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kw)`` as ids;
        a large conversation is rendered and tokenized off the event loop."""
        chars = message_chars(messages) if chars is None else chars
        tok = self.tokenizer
        if chars < self.offload_chars:
            return [int(t) for t in tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                            **template_kwargs)]

        def render_text() -> str:
            return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_kwargs)

        text = await run_heavy(render_text)
        return [int(t) for t in (await run_heavy(self._encode_now, [text]))[0]]
