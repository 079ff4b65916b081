"""A deterministic tiny byte-level BPE for tiny models (tests, `configs/tiny_cpu.yaml`: `tokenizer: tiny`).

Merges are learned from a small built-in corpus, so the vocabulary is the same on every machine.
"""

from __future__ import annotations

import collections
import functools

import tokenizers
from tokenizers import Regex, pre_tokenizers

from openclaw_jax.models.tokenizer.chat_template import QWEN3_CHAT_TEMPLATE, TokenizerError
from openclaw_jax.models.tokenizer.core import (QWEN_PRETOKENIZE_REGEX, Tokenizer, _add_tokens_at_ids,
                                                _byte_level_backend, byte_to_unicode)


TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>",
                       "</think>")
_TINY_SPECIAL_FLAGS = {"<|endoftext|>": True, "<|im_start|>": True, "<|im_end|>": True}
# the Qwen2.5-VL vision tokens of `tiny_vl_tokenizer`, special, at ids 320.. (after the 320 of `tiny`)
TINY_VL_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
TINY_VL_BASE = 320
TINY_VL_IDS = {tok: TINY_VL_BASE + i for i, tok in enumerate(TINY_VL_TOKENS)}

# Text the tiny BPE learns its merges from: chat, tool use, arithmetic and a little code.
_TINY_CORPUS = """
The user asks a question and the assistant answers it. The assistant thinks step by step before it answers.
Please help me with my homework. Sure, here is how you can solve the problem: first add the numbers, then
divide the total by the count. What is the weather in Paris today? Let me call the weather tool for you.
The answer is 42. The answer is 7. The answer is 12. Thank you, that is correct! No, that is wrong, try again.
You should use the search tool instead of guessing. I will search the web for the latest news.
def add(a, b):
    return a + b
for i in range(10):
    print(i * i)
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"name": "search", "arguments": {"query": "latest news"}}
system user assistant tool function arguments result error message content role name
one two three four five six seven eight nine ten hundred thousand plus minus times equals
Hello! How are you? I am fine, thanks. Good morning. Good night. Yes. No. Maybe. Okay.
"""


def _learn_bpe_merges(text: str, n_merges: int, split_regex: str) -> list[tuple[str, str]]:
    """Plain BPE training (most frequent adjacent pair, ties broken by the pair's spelling)."""
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split_regex), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    word_counts = collections.Counter(piece for piece, _ in pre.pre_tokenize_str(text))
    words = {word: list(word) for word in word_counts}
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pair_counts: collections.Counter = collections.Counter()
        for word, symbols in words.items():
            for pair in zip(symbols, symbols[1:]):
                pair_counts[pair] += word_counts[word]
        if not pair_counts:
            break
        best = min(pair_counts, key=lambda p: (-pair_counts[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        for word, symbols in words.items():
            i, out = 0, []
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            words[word] = out
    return merges


@functools.lru_cache(maxsize=8)
def _tiny_backend_json(vocab_size: int) -> str:
    n_special = len(TINY_SPECIAL_TOKENS)
    n_merges = vocab_size - 256 - n_special
    merges = _learn_bpe_merges(_TINY_CORPUS, n_merges, QWEN_PRETOKENIZE_REGEX)
    if len(merges) < n_merges:
        raise TokenizerError(f"tiny_test_tokenizer: the built-in corpus yields only {len(merges)} merges; "
                             f"vocab_size must be at most {256 + n_special + len(merges)}")
    vocab = {byte_to_unicode()[b]: b for b in range(256)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    backend = _byte_level_backend(vocab, merges, QWEN_PRETOKENIZE_REGEX, nfc=True)
    base = len(vocab)
    _add_tokens_at_ids(backend, [(base + i, tok, _TINY_SPECIAL_FLAGS.get(tok, False))
                                 for i, tok in enumerate(TINY_SPECIAL_TOKENS)])
    return backend.to_str()


def tiny_test_tokenizer(vocab_size: int = 320) -> Tokenizer:
    """A deterministic byte-level BPE of exactly `vocab_size` ids for tiny test models.

    Ids 0..255 are the bytes, then learned merges, then the specials `<|endoftext|>`, `<|im_start|>`,
    `<|im_end|>`, `<tool_call>`, `</tool_call>`, `<think>`, `</think>` as the last seven ids. Uses the
    Qwen3 (ChatML) chat template; eos `<|im_end|>`, pad `<|endoftext|>`.
    """
    minimum = 256 + len(TINY_SPECIAL_TOKENS)
    if vocab_size < minimum:
        raise TokenizerError(f"tiny_test_tokenizer(vocab_size={vocab_size}): need at least {minimum} "
                             "(256 bytes + 7 special tokens)")
    backend = tokenizers.Tokenizer.from_str(_tiny_backend_json(vocab_size))
    return Tokenizer(backend, chat_template=QWEN3_CHAT_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                     extra_eos_token_ids=(backend.token_to_id("<|endoftext|>"),), model_max_length=4096,
                     name=f"tiny-test-{vocab_size}")


def tiny_vl_tokenizer() -> Tokenizer:
    """`tiny_test_tokenizer(320)` plus the Qwen2.5-VL vision tokens as specials at fixed ids
    (`TINY_VL_IDS`): `<|vision_start|>` 320, `<|vision_end|>` 321, `<|image_pad|>` 322, `<|video_pad|>` 323
    (324 ids), for tiny random vision-language models (`model.tokenizer: tiny_vl`)."""
    backend = tokenizers.Tokenizer.from_str(_tiny_backend_json(TINY_VL_BASE))
    _add_tokens_at_ids(backend, [(i, tok, True) for tok, i in TINY_VL_IDS.items()])
    return Tokenizer(backend, chat_template=QWEN3_CHAT_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                     extra_eos_token_ids=(backend.token_to_id("<|endoftext|>"),), model_max_length=4096,
                     name="tiny-vl")
