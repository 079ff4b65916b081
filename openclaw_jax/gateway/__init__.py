"""The gateway: an OpenAI-compatible endpoint that turns live conversations into training samples.

Run it:

    python -m openclaw_jax.gateway --policy-url http://127.0.0.1:30000 --judge rule \
        --model smollm2 --store runs/samples --port 8000 [--api-key KEY]

Agents talk to ``/v1/chat/completions`` (JSON or SSE streaming, tools), ``/v1/models``;
``/healthz`` reports pool, judge, store and queue state. Per request:

* ``X-Session-Id`` (or body ``session_id``): the conversation;
* ``X-Turn-Type: main|side`` (or body ``turn_type``; default side): only main turns train;
* ``X-Session-Done: 1|true|yes|on`` (or body ``session_done``): ends the session after this
  request (its own turn, and any turn still without a next state, is dropped);
* ``Authorization: Bearer <key>``: the client's key, which says whose sessions these are
  (``--keys-file``: a key per person; ``--api-key``: one shared key, the person from ``X-Person-Id``).

The next main request of a session supplies the *next state* (its last message, role user
or tool) of the previous main turn; the judge scores that pair (``judge.py``), the
three-case rule makes at most one sample, and the sample is appended durably to the
store (``openclaw_jax.samples``). What is never lost: an appended sample. What a crash loses: turns
still waiting for their next state or for the judge (in memory only).

Modules: ``config`` (GatewayConfig), ``protocol`` (session headers, the gateway's request
limits; the OpenAI shapes are :mod:`openclaw_jax.wire.openai`), ``auth`` (keys, persons, the admin
key: ``request_person``, ``is_admin``, ``require_admin``), ``client_limits`` (per-person caps),
``sessions`` (next-state association, one namespace per person), ``judge`` (PRM votes, hints, rule
judge), ``server`` (the aiohttp app), ``chat_stream`` (SSE), ``health_routes``, ``image_turns`` and
``image_spool`` (turns with images), ``session_routes`` (the done endpoint), ``pipeline`` (judge
workers -> samples), ``store_writer`` (the one writer into the sample store, :mod:`openclaw_jax.samples`).
Security: docs/security.md.
"""

from openclaw_jax.gateway.config import GatewayConfig

__all__ = ["GatewayConfig"]
