"""The gateway: an OpenAI-compatible endpoint that turns live conversations into training samples.

Run it:

    python -m openclaw_jax.gateway --policy-url http://127.0.0.1:30000 --judge rule \
        --model smollm2 --store runs/samples --port 8000 [--api-key KEY]

Agents talk to ``/v1/chat/completions`` (JSON or SSE streaming, tools), ``/v1/models``;
``/healthz`` reports pool, judge, store and queue state. Per request:

* ``X-Session-Id`` (or body ``session_id``): the conversation;
* ``X-Turn-Type: main|side`` (or body ``turn_type``; default side): only main turns train;
* ``X-Session-Done: 1|true|yes|on`` (or body ``session_done``): ends the session after this
  request (its own turn, and any turn still without a next state, is dropped).

The next main request of a session supplies the *next state* (its last message, role user
or tool) of the previous main turn; the judge scores that pair (``judge.py``), the
three-case rule makes at most one sample, and the sample is appended durably to the
store (``openclaw_jax.samples``). What is never lost: an appended sample. What a crash loses: turns
still waiting for their next state or for the judge (in memory only).

Modules: ``config`` (GatewayConfig), ``protocol`` (session headers, the gateway's request
limits; the OpenAI shapes are :mod:`openclaw_jax.wire.openai`), ``sessions`` (next-state
association), ``judge`` (PRM votes, hints, rule judge), ``server`` (the aiohttp app),
``pipeline`` (judge workers -> samples), ``store_writer`` (the one writer into the sample store,
:mod:`openclaw_jax.samples`).
"""

from openclaw_jax.gateway.config import GatewayConfig

__all__ = ["GatewayConfig"]
