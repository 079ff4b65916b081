"""Pure wire-protocol pieces: sampling-param validation, /generate parsing, tool-call parsing."""

from __future__ import annotations

import json
import math

import pytest

from openclaw_jax.inference import protocol as P
from openclaw_jax.inference.types import GenerationSpec, SequenceOutput
from openclaw_jax.wire import json_safe
from openclaw_jax.wire import sglang as S
from openclaw_jax.wire.errors import WireError
from openclaw_jax.wire.sglang import SamplingParams
from openclaw_jax.wire.sglang_results import FinishReason, MalformedResponse, build_generate_response, \
    parse_generate_response
from openclaw_jax.wire.tool_calls import parse_tool_calls, safe_stream_prefix

V = 320


def test_sampling_defaults_and_ranges():
    sp = S.parse_sampling_params(None, vocab_size=V)
    assert sp == SamplingParams()  # SGLang defaults: 128 new tokens, T=1, top_p=1, top_k=-1 (all)
    sp = S.parse_sampling_params({"temperature": 0, "top_k": 5000, "stop": "x", "stop_token_ids": [3, None],
                                  "max_new_tokens": None, "frequency_penalty": 0.0, "spaces_between_special_tokens":
                                  False}, vocab_size=V)
    assert sp.greedy and sp.top_k == -1 and sp.stop == ("x",) and sp.stop_token_ids == (3,)
    assert sp.max_new_tokens is None  # explicit null: until the context is full
    for bad, needle in [({"temperature": math.inf}, "temperature"), ({"top_p": 1.5}, "top_p"),
                        ({"top_k": -2}, "top_k"), ({"min_p": -0.1}, "min_p"), ({"n": 0}, "n must"),
                        ({"max_new_tokens": 2.5}, "integer"), ({"temperature": True}, "number"),
                        ({"frequency_penalty": 3}, "[-2, 2]"), ({"presence_penalty": 0.5}, "not supported"),
                        ({"regex": "a+"}, "not supported"), ({"stop_token_ids": [V]}, "vocabulary"),
                        ({"ignore_eos": "yes"}, "true or false"), ({"what": 1}, "unknown")]:
        with pytest.raises(WireError, match=needle.replace("[", r"\[").replace("]", r"\]")):
            S.parse_sampling_params(bad, vocab_size=V)


def test_generate_parsing_batches_and_per_item_fields():
    req = S.parse_generate_request({"input_ids": [[1, 2], [3]], "return_logprob": [True, False],
                                    "top_logprobs_num": 3, "rid": ["a", "b"],
                                    "sampling_params": [{"n": 2}, {"temperature": 0}]}, vocab_size=V)
    assert req.is_batch and [i.input_ids for i in req.items] == [(1, 2), (3,)]
    assert [i.return_logprob for i in req.items] == [True, False] and [i.rid for i in req.items] == ["a", "b"]
    assert req.items[0].sampling.n == 2 and req.items[1].sampling.greedy
    req = S.parse_generate_request({"text": "hi", "token_ids_logprob": [1, 2]}, vocab_size=V)
    assert not req.is_batch and req.items[0].token_ids_logprob == (1, 2)
    with pytest.raises(WireError, match="entries for a batch"):
        S.parse_generate_request({"text": ["a", "b"], "rid": ["x"]}, vocab_size=V)
    with pytest.raises(json_safe.JSONRejected, match="not valid JSON"):
        json_safe.loads(b"{")
    with pytest.raises(WireError, match="longer than the model's context length"):
        P.validate_prompt([1] * 10, SamplingParams(max_new_tokens=1), context_length=10, vocab_size=V)


def test_generate_response_and_client_parse_round_trip():
    out = SequenceOutput(rid="r1", prompt_ids=[5, 6, 7], output_ids=[8, 9], text="xy",
                         finish_reason={"type": "stop", "matched": 9}, output_logprobs=[-0.5, -1.5],
                         output_top_logprobs=[[(-0.5, 8), (-2.0, 4)], [(-1.0, 3), (-1.5, 9)]],
                         input_logprobs=[None, -3.0, -4.0], input_top_logprobs=[None, [(-1.0, 6)], [(-2.0, 7)]],
                         weight_version="w", created_time=1.0, finished_time=2.0)
    spec = GenerationSpec.of_item(S.GenerateItem(text=None, input_ids=(5, 6, 7), sampling=SamplingParams(),
                                                 return_logprob=True, logprob_start_len=0, top_logprobs_num=2),
                                  [5, 6, 7])
    body = build_generate_response(out, spec, return_text_in_logprobs=True, token_text=lambda i: f"<{i}>")
    meta = body["meta_info"]
    assert meta["input_token_logprobs"] == [[None, 5, "<5>"], [-3.0, 6, "<6>"], [-4.0, 7, "<7>"]]
    assert meta["output_top_logprobs"][1] == [[-1.0, 3, "<3>"], [-1.5, 9, "<9>"]]
    assert meta["e2e_latency"] == 1.0 and meta["completion_tokens"] == 2
    res = parse_generate_response(json.loads(json.dumps(body)), expect_logprobs=True, top_logprobs_num=2)
    assert res.response_ids == [8, 9] and res.rollout_logprobs == [-0.5, -1.5]
    assert res.output_top_logprobs == [[(-0.5, 8), (-2.0, 4)], [(-1.0, 3), (-1.5, 9)]]
    assert res.input_logprobs == [None, -3.0, -4.0] and res.finish_reason == FinishReason("stop", matched=9)
    broken = json.loads(json.dumps(body))
    broken["meta_info"]["output_token_logprobs"][0][1] = 1234
    with pytest.raises(MalformedResponse, match="does not match"):
        parse_generate_response(broken, expect_logprobs=True)


def test_tool_call_parsing():
    tools = [{"type": "function", "function": {"name": "get_weather"}},
             {"type": "function", "function": {"name": "search"}}]
    text = ('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "search", "arguments": {"query": "café"}}\n</tool_call>')
    content, calls = parse_tool_calls(text, tools)
    assert content == "Sure."
    assert [(c.name, json.loads(c.arguments), c.index) for c in calls] == [
        ("get_weather", {"city": "Paris"}, 0), ("search", {"query": "café"}, 1)]
    assert "café" in calls[1].arguments  # not ASCII-escaped, as SGLang sends it
    # unclosed final block (generation ended at EOS), "parameters" alias, string arguments
    content, calls = parse_tool_calls('<tool_call>{"name": "search", "parameters": "{\\"q\\": 1}"}', tools)
    assert content == "" and json.loads(calls[0].arguments) == {"q": 1}
    # unknown function: dropped; invalid JSON: the text stays content
    assert parse_tool_calls('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', tools)[1] == []
    bad = "<tool_call>{not json}</tool_call>"
    assert parse_tool_calls(bad, tools) == (bad, [])
    assert parse_tool_calls("no calls here", tools) == ("no calls here", [])


def test_safe_stream_prefix_holds_back_a_possible_tool_call():
    assert safe_stream_prefix("Hello") == 5
    assert safe_stream_prefix("Hello <tool") == len("Hello ")
    assert safe_stream_prefix("Hello <tool_call>{") == len("Hello ")
    assert safe_stream_prefix("a < b") == 5


def test_sampling_params_sent_are_the_ones_parsed():
    """The client's body (SamplingParams.to_json) parses back to the same typed params on the server."""
    sent = SamplingParams(max_new_tokens=7, temperature=0.5, top_k=4, stop=("a", "b"), stop_token_ids=(3,),
                          sampling_seed=11, no_stop_trim=True)
    body = sent.to_json()
    assert body == {"max_new_tokens": 7, "temperature": 0.5, "top_p": 1.0, "top_k": 4, "stop": ["a", "b"],
                    "stop_token_ids": [3], "sampling_seed": 11, "no_stop_trim": True}
    assert S.parse_sampling_params(json.loads(json.dumps(body)), vocab_size=V) == sent
    assert SamplingParams(max_new_tokens=None).to_json() == {"max_new_tokens": None, "temperature": 1.0,
                                                             "top_p": 1.0, "top_k": -1}
    req = S.parse_generate_request(json.loads(json.dumps(S.generate_request_body(
        input_ids=[1, 2], sampling_params=sent, top_logprobs_num=2, rid="r", stream=True))), vocab_size=V)
    item = req.items[0]
    assert req.stream and item.input_ids == (1, 2) and item.sampling == sent and item.return_logprob
    assert item.top_logprobs_num == 2 and item.logprob_start_len == -1 and item.rid == "r"


def test_sse_framing_round_trips_in_any_split():
    from openclaw_jax.wire.openai import SSE_DONE, SSEDecoder, sse_event

    events = [{"a": "é\n", "b": [1, float("-inf")]}, "[DONE]"]
    raw = b"".join(sse_event(e) for e in events)
    assert raw.endswith(SSE_DONE)
    for cut in range(len(raw) + 1):
        dec = SSEDecoder()
        got = dec.feed(raw[:cut]) + dec.feed(raw[cut:]) + dec.close()
        assert got[-1] == "[DONE]" and json.loads(got[0]) == {"a": "é\n", "b": [1, None]}, cut
    dec = SSEDecoder()
    assert dec.feed(b"data: x\n\ndata: {\"y\":1}") == ["x"] and dec.close() == ['{"y":1}']
