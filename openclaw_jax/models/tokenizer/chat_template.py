"""Chat templates: Jinja2 rendering configured like `transformers`, and our Qwen3 (ChatML) template.

Templates render in a sandboxed Jinja2 environment configured like `transformers`' (trim_blocks,
lstrip_blocks, loop controls, `raise_exception`, `tojson` without HTML escaping, `strftime_now`),
and messages are prepared the same way (keys with None values dropped, reasoning aliases), so a
template renders identically here and in `apply_chat_template`. `TokenizerError` lives here (the
leaf of the package): a tokenizer could not be built or a template could not be rendered.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from datetime import datetime
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox


class TokenizerError(ValueError):
    """A tokenizer could not be built or a chat template could not be rendered."""


# ----------------------------------------------------------------------------------------------
# Chat template rendering (transformers-compatible environment)
# ----------------------------------------------------------------------------------------------


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text in some templates; render it as is."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):  # noqa: D401 - jinja callback
        return caller()


class _SafeNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore attributes (no reaching into Python internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - mirrors jinja's signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _SafeNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates may not set underscore attribute {name!r}")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes '<', '>', '&' and "'"; chat templates need the plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=32)
def compile_chat_template(template: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _SafeNamespace
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as err:
        raise TokenizerError(f"chat template does not parse: {err.message} (line {err.lineno})") from err


_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def _plain(value: Any) -> Any:
    """Rebuild a value out of JSON types only (templates must not see arbitrary Python objects)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value] if isinstance(value, list) else tuple(_plain(v) for v in value)
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models (e.g. openai types)
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def prepare_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as templates expect them: plain dicts, None-valued keys dropped (OpenAI clients send
    `content=None` beside tool calls), reasoning available as `reasoning_content` and `thinking`."""
    prepared = []
    for index, message in enumerate(messages):
        message = _plain(message)
        if not isinstance(message, dict):
            raise TokenizerError(f"chat message #{index} must be a dict with 'role' and 'content', got {message!r}")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_KEYS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


def render_chat_template(template: str, messages: Sequence[Mapping[str, Any]], *,
                         tools: Sequence[Mapping[str, Any]] | None = None,
                         documents: Sequence[Mapping[str, Any]] | None = None,
                         add_generation_prompt: bool = False, **template_kwargs: Any) -> str:
    """Render a chat template the way `transformers.apply_chat_template(..., tokenize=False)` does."""
    if not messages:
        raise TokenizerError("cannot apply a chat template to an empty conversation; pass at least one message")
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, Mapping):
                raise TokenizerError(f"tools must be JSON-schema dicts, got {type(tool).__name__}: {tool!r}")
    compiled = compile_chat_template(template)
    try:
        return compiled.render(messages=prepare_messages(messages), tools=_plain(tools), documents=_plain(documents),
                               add_generation_prompt=add_generation_prompt, **_plain(template_kwargs))
    except jinja2.TemplateError as err:
        raise TokenizerError(f"chat template failed to render: {err}") from err



# Qwen3 chat format, written for this project. It renders like the official Qwen3 template:
# - a tools block (JSON schema per line inside <tools>) is folded into the system turn;
# - assistant reasoning (`reasoning_content`, or a <think>...</think> prefix of the content) is kept
#   only for assistant turns after the latest real user query (tool results do not count), and the
#   final assistant turn always gets a <think> block;
# - tool calls render as <tool_call>{"name": ..., "arguments": ...}</tool_call> lines;
# - consecutive tool results share one user turn, each inside <tool_response>;
# - `enable_thinking=False` pre-fills an empty <think> block after the generation prompt.
QWEN3_CHAT_TEMPLATE = r"""
{%- set has_system = messages[0].role == 'system' -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if has_system -%}
        {{- messages[0].content + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        '<args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif has_system -%}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{#- Index of the latest user turn that is a real query (not a wrapped tool response). -#}
{%- set scan = namespace(query_at=messages | length - 1, found=false) -%}
{%- for back in range(messages | length - 1, -1, -1) -%}
    {%- set m = messages[back] -%}
    {%- if not scan.found and m.role == 'user' and m.content is string
          and not (m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) -%}
        {%- set scan.query_at = back -%}
        {%- set scan.found = true -%}
    {%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
    {%- set body = m.content if m.content is string else '' -%}
    {%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}
        {{- '<|im_start|>' + m.role + '\n' + body + '<|im_end|>\n' -}}
    {%- elif m.role == 'assistant' -%}
        {%- set thought = '' -%}
        {%- if m.reasoning_content is string -%}
            {%- set thought = m.reasoning_content -%}
        {%- elif '</think>' in body -%}
            {%- set thought = body.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set body = body.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if loop.index0 > scan.query_at and (loop.last or thought) -%}
            {{- '<think>\n' + thought.strip('\n') + '\n</think>\n\n' + body.lstrip('\n') -}}
        {%- else -%}
            {{- body -}}
        {%- endif -%}
        {%- for call in (m.tool_calls or []) -%}
            {%- if body or not loop.first -%}
                {{- '\n' -}}
            {%- endif -%}
            {%- set fn = call.function if call.function else call -%}
            {{- '<tool_call>\n{"name": "' -}}
            {{- fn.name -}}
            {{- '", "arguments": ' -}}
            {{- fn.arguments if fn.arguments is string else (fn.arguments | tojson) -}}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif m.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + body + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- endif -%}
{%- endif -%}
""".strip("\n")



# Qwen2.5-VL's image form. The chat template renders one `<|vision_start|><|image_pad|><|vision_end|>`
# per image (`wire.images.extract_images` puts it where the image part was); the processor then
# widens the k-th one to `image_token_count(grid_k)` pads, as HF's `Qwen2_5_VLProcessor` does.
VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
_IMAGE_PLACEHOLDER = VISION_START + IMAGE_PAD + VISION_END


def expand_image_placeholders(text: str, token_counts: Sequence[int]) -> str:
    """The rendered prompt with the k-th image placeholder widened to ``token_counts[k]`` pads.

    The text must hold exactly one `<|image_pad|>` per image, each inside its placeholder (a
    conversation whose text spells the marker itself would misplace the images): otherwise
    TokenizerError."""
    pads = text.count(IMAGE_PAD)
    placeholders = text.count(_IMAGE_PLACEHOLDER)
    if pads != len(token_counts) or placeholders != len(token_counts):
        raise TokenizerError(f"the rendered prompt has {pads} {IMAGE_PAD} markers ({placeholders} image placeholders) "
                             f"for {len(token_counts)} images; message text may not spell the image markers")
    pieces = text.split(_IMAGE_PLACEHOLDER)
    out = [pieces[0]]
    for n, rest in zip(token_counts, pieces[1:]):
        if int(n) < 1:
            raise TokenizerError(f"an image needs at least one token, got {n}")
        out.append(VISION_START + IMAGE_PAD * int(n) + VISION_END)
        out.append(rest)
    return "".join(out)
