"""When a sequence stops and what text it reports (SGLang's order and trimming rules).

`check_finished` decides after each accepted token (length, then stop ids, then stop strings in the
decoded tail); `final_text` trims a matched stop unless `no_stop_trim`; `stream_text` holds back a
possible half character or half stop string so streamed text only ever grows.
"""

from __future__ import annotations

from typing import Any, Sequence

from openclaw_jax.inference.scheduler import Seq


def check_finished(seq: Seq, token: int, limit: int, tokenizer: Any) -> dict | None:
    """The finish reason after `token` was accepted, or None; `limit` = the cache slots this sequence has."""
    n = len(seq.out.output_ids)
    # Order as SGLang's Req.check_finished: length, then stop tokens, then stop strings.
    if n >= seq.max_new:
        return {"type": "length", "length": seq.max_new}
    if seq.position >= limit:  # no slot left for the next token (only reachable with max_new_tokens=None)
        return {"type": "length", "length": n}
    if token in seq.stop_ids:
        return {"type": "stop", "matched": token}
    if seq.stop_strs:
        tail = tokenizer.decode(seq.out.output_ids[-(seq.stop_tail_tokens + 1):],
                                skip_special_tokens=seq.spec.sampling.skip_special_tokens)
        for s in seq.stop_strs:
            if s in tail:
                return {"type": "stop", "matched": s}
    return None


def decode_text(seq: Seq, ids: Sequence[int], tokenizer: Any) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=seq.spec.sampling.skip_special_tokens)


def final_text(seq: Seq, finish: dict, tokenizer: Any) -> str:
    """The response text of a finished sequence: a matched stop id or stop string is trimmed unless no_stop_trim."""
    sp = seq.spec.sampling
    ids = seq.out.output_ids
    matched = finish.get("matched")
    if finish.get("type") == "stop" and isinstance(matched, int) and not sp.no_stop_trim and ids:
        return decode_text(seq, ids[:-1], tokenizer)
    text = decode_text(seq, ids, tokenizer)
    if finish.get("type") == "stop" and isinstance(matched, str) and not sp.no_stop_trim:
        cut = text.find(matched)
        if cut >= 0:
            text = text[:cut]
    return text


def stream_text(seq: Seq, tokenizer: Any) -> str:
    """Text of an unfinished sequence, stable under growth: no half characters, no half stop strings."""
    text = decode_text(seq, seq.out.output_ids, tokenizer).rstrip("\ufffd")
    for s in seq.stop_strs:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                text = text[:-k]
                break
    return text
