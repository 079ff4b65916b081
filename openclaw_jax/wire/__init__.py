"""The wire formats, written once: what crosses HTTP between agents, the gateway, the pool and the server.

A leaf package (imports nothing else of ``openclaw_jax``); pure functions and frozen dataclasses,
no I/O. Both directions live here: what a server parses is what a client builds.

* ``openai``     — OpenAI chat/completions: message and tool normalisation, request fields,
                   responses and stream chunks, log-prob content, usage, model lists, SSE framing
                   (write and parse), error bodies.
* ``sglang``     — SGLang's native API: ``SamplingParams`` (parsed by the server, sent by the
                   client), ``/generate`` requests in both directions, weight-update and
                   control bodies, native error bodies.
* ``sglang_results`` — ``/generate`` responses in both directions (built by the server, parsed
                   into ``GenerateResult`` by the client), finish reasons.
* ``tool_calls`` — ``<tool_call>`` blocks in model output -> OpenAI ``tool_calls``.
* ``json_safe``  — strict, depth-bounded JSON decoding of untrusted text; JSON encoding with
                   non-finite numbers as null.
* ``fields``     — typed getters of JSON request fields.
* ``errors``     — ``WireError``: bad wire data (HTTP 400 unless told otherwise).
"""
