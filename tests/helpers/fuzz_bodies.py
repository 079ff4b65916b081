"""A seeded generator of malformed and well-formed HTTP requests for the server fuzz tests.

Each request starts from a valid body of the server's protocol and, most of the time, is
mutated: junk values in fields, truncation, invalid UTF-8 (raw ``ED A0 80``, ``FF``), lone
surrogate escapes, deep nesting, tool-call arguments that are not JSON, content codings that
do not match the bytes, garbage, odd headers (non-UTF-8 ``Authorization``, bad session
headers). Same seed, same requests.
"""

from __future__ import annotations

import gzip
import json
import random
import zlib
from dataclasses import dataclass, field

JUNK_VALUES = [None, True, False, 0, -1, 1, 2 ** 31, -(2 ** 63), 10 ** 30, 0.5, -1e308, "", "x", "\u00e9\u4e2d",
               [], {}, [1, [2, [3]]], {"a": {"b": None}}, "NaN", [None], ["a", 1], "\ud83d\ude00"]
RAW_BAD_UTF8 = [b"\xed\xa0\x80", b"\xff", b"\xc0\xaf", b"\xe2\x82", b"\x80\x80"]
SURROGATES = ["\\udfff", "\\ud800", "\\udbff\\udfff", "\\ud83d\\ude00", "\\uDC00"]


@dataclass
class FuzzRequest:
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    what: str = "valid"


def _sglang_bases(rng: random.Random) -> list[tuple[str, dict]]:
    small = {"max_new_tokens": rng.choice([1, 2]), "temperature": rng.choice([0, 0.7])}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    return [
        ("/generate", {"input_ids": [rng.randrange(1, 300) for _ in range(rng.randrange(1, 6))],
                       "sampling_params": small, "return_logprob": rng.random() < 0.5}),
        ("/generate", {"text": rng.choice(["hello", "2+2=", "caf\u00e9 \u4e2d"]), "sampling_params": small,
                       "stream": rng.random() < 0.2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                  "temperature": 0}),
        ("/v1/chat/completions", {"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], "tools": [tool], "max_tokens": 2}),
        ("/v1/completions", {"prompt": "once upon", "max_tokens": 2, "temperature": 0}),
    ]


def _gateway_bases(rng: random.Random) -> list[tuple[str, dict]]:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    return [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": rng.choice(["hi", "caf\u00e9", "2+2?"])}],
                                  "max_tokens": 2, "stream": rng.random() < 0.2}),
        ("/v1/chat/completions", {"messages": [
            {"role": "system", "content": "be brief"}, {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], "tools": [tool], "max_tokens": 2}),
    ]


def _paths(obj, prefix=()):
    """Every (path) into dicts/lists of ``obj``."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    return out


def _set(obj, path, value):
    if not path:
        return value
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return obj


def _deep(rng: random.Random) -> str:
    depth = rng.choice([70, 500, 5000, 100000])
    return "[" * depth + "]" * depth


def _mutate(rng: random.Random, path: str, body: dict, kind: str) -> FuzzRequest:
    op = rng.randrange(14)
    headers: dict[str, str] = {"Content-Type": "application/json"}
    if op == 0:  # valid
        return FuzzRequest(path, json.dumps(body).encode(), headers, "valid")
    if op == 1:  # junk value somewhere
        target = rng.choice(_paths(body)[1:] or [()])
        return FuzzRequest(path, json.dumps(_set(body, target, rng.choice(JUNK_VALUES))).encode(), headers,
                           f"junk at {target}")
    raw = json.dumps(body).encode()
    if op == 2:  # truncated
        return FuzzRequest(path, raw[:rng.randrange(len(raw))], headers, "truncated")
    if op == 3:  # raw invalid UTF-8 inside a string
        i = raw.find(b'"', rng.randrange(len(raw)))
        i = i if i > 0 else 1
        return FuzzRequest(path, raw[:i + 1] + rng.choice(RAW_BAD_UTF8) + raw[i + 1:], headers, "bad utf-8")
    if op == 4:  # lone surrogate escape in a string value
        strings = [p for p in _paths(body)[1:] if isinstance(_get(body, p), str)]
        if strings:
            target = rng.choice(strings)
            marker = "@@SURROGATE@@"
            text = json.dumps(_set(body, target, _get(body, target) + marker))
            return FuzzRequest(path, text.replace(marker, rng.choice(SURROGATES)).encode(), headers, "surrogate")
        return FuzzRequest(path, raw, headers, "valid")
    if op == 5:  # deep nesting in a field or as the whole body
        if rng.random() < 0.3:
            return FuzzRequest(path, _deep(rng).encode(), headers, "deep body")
        target = rng.choice(_paths(body)[1:] or [()])
        marker = '"@@DEEP@@"'
        text = json.dumps(_set(body, target, "@@DEEP@@"))
        return FuzzRequest(path, text.replace(marker, _deep(rng)).encode(), headers, f"deep at {target}")
    if op == 6:  # tool-call arguments that are deep / not JSON
        args = rng.choice(["[" * 5000, "{" * 3000, '{"city": ', "null", "[1, 2]", '"\\udfff"', "{}" * 3])
        msgs = [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c9", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "user", "content": "and?"}]
        return FuzzRequest("/v1/chat/completions", json.dumps({"messages": msgs, "max_tokens": 1}).encode(), headers,
                           "tool args")
    if op == 7:  # content coding that does not match the bytes (or does)
        coding = rng.choice(["gzip", "deflate", "br", "zstd", "x-gzip", "bogus", "gzip, deflate"])
        body_bytes = raw
        if rng.random() < 0.3 and coding in ("gzip", "x-gzip"):
            body_bytes = gzip.compress(raw)
        elif rng.random() < 0.3 and coding == "deflate":
            body_bytes = zlib.compress(raw)
        elif rng.random() < 0.3:
            body_bytes = gzip.compress(raw)[: rng.randrange(5, 30)]  # a truncated gzip stream
        return FuzzRequest(path, body_bytes, {**headers, "Content-Encoding": coding}, f"encoding {coding}")
    if op == 8:  # odd top-level documents
        doc = rng.choice([b"", b" ", b"null", b"[]", b"42", b'"s"', b"{}", b'{"a":1}{"b":2}', b"{,}", b"NaN",
                          b'{"messages": Infinity}', b"\xef\xbb\xbf{}", b"1e999", raw + b"garbage"])
        return FuzzRequest(path, doc, headers, "odd document")
    if op == 9:  # random bytes
        return FuzzRequest(path, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))), headers, "garbage")
    if op == 10:  # non-UTF-8 / odd headers (requests sends str headers as latin-1 bytes)
        extra = rng.choice([{"Authorization": "Bearer \xff\xfe\xed"}, {"Authorization": "Bearer \xe9"},
                            {"Authorization": "\xc0\xaf"}, {"X-Session-Id": "\xff\xfe", "X-Turn-Type": "main"},
                            {"X-Session-Id": "s", "X-Turn-Type": "\xe9"}, {"X-Session-Done": "\xff"},
                            {"Content-Type": "text/plain\xff"}])
        return FuzzRequest(path, raw, {**headers, **extra}, "odd headers")
    if op == 11:  # huge numbers and non-finite values
        target = rng.choice(_paths(body)[1:] or [()])
        marker = '"@@NUM@@"'
        text = json.dumps(_set(body, target, "@@NUM@@"))
        return FuzzRequest(path, text.replace(marker, rng.choice(["1e999", "-1e999", "NaN", "Infinity", "1" * 5000,
                                                                    "-0", "1e-400"])).encode(), headers, "numbers")
    if op == 12:  # many keys / long strings (modest: stays under the body limits)
        body = dict(body)
        body.update({f"k{i}": i for i in range(rng.randrange(100, 3000))})
        return FuzzRequest(path, json.dumps(body).encode(), headers, "many keys")
    # op 13: wrong route/method-ish paths with a valid body
    other = rng.choice(["/generate", "/v1/chat/completions", "/v1/completions", "/v1/models", "/nope"]
                       if kind == "sglang" else ["/v1/chat/completions", "/v1/models", "/healthz", "/nope"])
    return FuzzRequest(other, raw, headers, f"other path {other}")


def _get(obj, path):
    for key in path:
        obj = obj[key]
    return obj


def fuzz_requests(seed: int, n: int, kind: str) -> list[FuzzRequest]:
    """``n`` requests for ``kind`` ('sglang' for the inference server, 'gateway')."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        bases = _sglang_bases(rng) if kind == "sglang" else _gateway_bases(rng)
        path, body = rng.choice(bases)
        out.append(_mutate(rng, path, json.loads(json.dumps(body)), kind))
    return out
