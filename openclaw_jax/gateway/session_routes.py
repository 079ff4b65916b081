"""Session endpoints and checks of the gateway that exist for agents such as OpenClaw.

A mixin of :class:`~openclaw_jax.gateway.server.Gateway`:

* ``POST /v1/sessions/{session_id}/done`` ends a session without a chat request (our OpenClaw
  plugin calls it from OpenClaw's ``session_end`` / ``before_reset`` hooks, which make no model
  request of their own). Same effect as ``X-Session-Done`` on a request: completed turns still
  waiting for a next state are dropped (sessions.py). Answers ``{"session_id", "ended",
  "dropped_turns"}``; an optional JSON body ``{"reason": ...}`` (the plugin sends OpenClaw's
  ``session_end`` reason) is logged; ending an unknown or already-ended session is not an error (``ended``: false),
  so the plugin may call it more than once. With ``"messages"`` (OpenAI chat messages ending on the
  person's last reaction or tool results) the session closes as a last main request would, scoring its
  last turn with that next state, but without asking the policy for a reply nobody reads (a simulated
  user's closing request prefilled the whole conversation for one thrown-away token).
* ``POST /v1/sessions/{session_id}/turn_starting`` says a person's turn has begun in that session (our
  OpenClaw plugin calls it from the first hook of a run, as the person's message arrives; OpenClaw then
  spends from a fraction of a second to seconds of CPU building the prompt before its model request). The
  gateway asks the policy servers (``/expect_request``) to hold their background work (recomputing cached
  prefixes for new weights, compiling programs ahead) until that request arrives, ``gateway.turn_notice_hold_s``
  at most, so the client's CPU work and then the turn itself do not share the CPU with it. Answers 202
  ``{"session_id", "held_s"}`` at once; one such ask is in flight at a time (more notices meanwhile
  extend nothing: the ask in flight holds as long).
* A main turn samples with the gateway's temperature and top_p (the trainer's, unless
  ``gateway.honor_client_sampling``); when the client asked for other values, the reply says so in
  the header ``X-Sampling-Override`` (e.g. ``temperature=1 -> 0.7``) instead of replacing them in silence.
* A main turn must leave room for a reply: OpenClaw asks for ``max_completion_tokens: 1`` when its
  prompt fills the ``contextWindow`` it was told, and a one-token reply is neither an answer for the
  person nor a sample worth training on, so such a request gets a 400 that says what to change.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from openclaw_jax.gateway.protocol import GatewayHTTPError, bad_request, parse_session_info
from openclaw_jax.http import http_guard as G
from openclaw_jax.wire import openai as O
from openclaw_jax.wire.errors import with_context_advice
from openclaw_jax.wire.sglang import SamplingParams

logger = logging.getLogger("openclaw_jax.gateway.server")

# Headers a chat handler adds to its reply (stored on the request between parsing and answering).
GATEWAY_HEADERS = web.RequestKey("gateway_headers", dict)


class SessionRoutes:
    """The session-end endpoint and the main-turn room check; state lives on the Gateway."""

    cfg: Any
    sessions: Any
    activity: Any   # the status page's SessionActivity
    guard: Any
    _check_auth: Any  # the Gateway's key check: the request's caller
    _submit: Any  # the Gateway's hand-off of a scoring job to the judge
    _next_state: Any  # the Gateway's next state of a conversation (off the loop when long)
    policy: Any   # the policy pool's client
    stats: Any    # the Gateway's counters
    _turn_notice: asyncio.Task | None = None  # the policy pool's /expect_request in flight

    async def handle_session_done(self, request: web.Request) -> web.Response:
        person = self._check_auth(request).person
        sid = _path_session_id(request)
        reason, messages = await self._done_body(request)
        # Only the caller's own session: another person's session of the same id is another session.
        ended = (person, sid) in self.sessions
        job, dropped = None, 0
        if ended and messages is not None:
            job, dropped = self.sessions.end_with_next_state(sid, messages, person=person,
                                                             next_state=await self._next_state(messages))
        elif ended:
            dropped = self.sessions.end_session(sid, person=person)
        if job is not None:
            self._submit(job)
        self.activity.ended(person, sid)
        logger.info("session %s of %s done (%s): %s, %s, %d unscored turn(s) dropped", sid, person,
                    reason or "no reason given", "ended" if ended else "not active",
                    "last turn scored" if job else "no turn scored", dropped)
        return web.json_response({"session_id": sid, "ended": ended, "dropped_turns": dropped,
                                  "scored_turn": job is not None})

    async def handle_turn_starting(self, request: web.Request) -> web.Response:
        person = self._check_auth(request).person
        sid = _path_session_id(request)
        hold = self.cfg.turn_notice_hold_s
        self.stats.turn_notices += 1
        if hold > 0 and (self._turn_notice is None or self._turn_notice.done()):
            self._turn_notice = asyncio.create_task(self._expect_request(hold), name="turn-notice")
        logger.debug("turn starting: session %s of %s, policy background work held up to %g s", sid, person, hold)
        return web.json_response({"session_id": sid, "held_s": hold}, status=202)

    async def _expect_request(self, hold: float) -> None:
        replies = await self.policy.expect_request(hold)
        for url, reply in replies.items():
            if reply["status"] not in (200, 404):  # 404: a worker without the route (SGLang) serves unheld
                logger.warning("turn notice: %s/expect_request answered %s %s", url, reply["status"],
                               reply["error"] or reply["body"])

    async def _done_body(self, request: web.Request) -> tuple[str | None, list[dict[str, Any]] | None]:
        """The optional body ``{"reason": ..., "messages": [...]}``: OpenClaw's session_end reason (new,
        reset, idle, ...) and the conversation whose trailing user / tool messages are the last turn's
        next state."""
        raw = await G.read_body(request, self.guard)
        request[G.BODY_BYTES_KEY] = len(raw)
        if not raw.strip():
            return None, None
        body = await G.decode_json(raw, self.guard)
        if not isinstance(body, dict):
            raise bad_request(f"the body must be a JSON object, got {type(body).__name__}")
        reason = body.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 64):
            raise bad_request(f"reason={reason!r:.80} must be a short string (OpenClaw's session_end reason)",
                              param="reason")
        messages = None
        if "messages" in body:
            try:
                messages = await G.parse_off_loop(request, O.parse_messages, {"messages": body["messages"]},
                                                  strict=True)
            except ValueError as err:
                raise bad_request(str(err), param="messages") from None
        return reason, messages

    def _check_room(self, params: SamplingParams) -> None:
        wanted = params.max_new_tokens
        floor = self.cfg.min_main_turn_tokens
        if wanted is not None and wanted < floor:
            raise bad_request(with_context_advice(
                f"(max_completion_tokens={wanted} leaves no room for a reply on a main turn: at least {floor}, "
                "gateway.min_main_turn_tokens; OpenClaw asks for 1 token when its prompt fills the contextWindow "
                "it was told.)"), param="max_completion_tokens")

    def _override_headers(self, req: Any, params: SamplingParams) -> dict[str, str]:
        """``X-Sampling-Override`` naming each client sampling value the gateway replaced (empty: none)."""
        changed = [f"{name}={asked:g} -> {used:g}" for name, asked, used in
                   (("temperature", req.temperature, params.temperature), ("top_p", req.top_p, params.top_p),
                    ("max_tokens", req.max_tokens, params.max_new_tokens))
                   if asked is not None and float(asked) != float(used)]
        return {"X-Sampling-Override": ", ".join(changed)} if changed else {}


def _path_session_id(request: web.Request) -> str:
    """The session id in a session route's path, checked as the ``X-Session-Id`` header would be."""
    raw = request.match_info.get("session_id", "")
    try:
        return parse_session_info({"X-Session-Id": raw, "X-Session-Done": "1"}, {}).session_id
    except GatewayHTTPError as err:
        raise GatewayHTTPError(400, err.message.replace("header X-Session-Id", "the session id in the path"),
                               param="session_id") from None
