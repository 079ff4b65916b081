"""The judge on any OpenAI-compatible chat endpoint (`gateway.judge: openai`).

A person rarely has a PRM pool: on a CPU the served model is too small to judge itself, and the
SGLang judge speaks SGLang's native ``/generate``. This judge sends the same eval and hint votes
(`judge.eval_vote_messages` / `judge.hint_vote_messages`: the same prompts) as chat messages to
``<judge_base_url>/chat/completions`` of any OpenAI-compatible server: a hosted model the person
trusts, or a local server (llama.cpp, vLLM, SGLang, Ollama, our embedded server). The answers are
parsed and voted exactly as the PRM pool's (`judge.build_judgement`: the last ``\\boxed{}``, the
majority of m valid votes, hints between ``[HINT_START]`` and ``[HINT_END]``); a call that fails or
times out is no vote.

The key comes from the environment variable named by ``gateway.judge_api_key_env`` (default
``OPENCLAW_JUDGE_API_KEY``), so that it never lands in a config file or a run's ``config.yaml``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import openai

from openclaw_jax.gateway.judge import Judgement, NextState, build_judgement, eval_vote_messages, hint_vote_messages

logger = logging.getLogger(__name__)

NO_KEY = "none"  # sent when no key is set: the openai client needs one, local servers ignore it


class JudgeEndpointError(RuntimeError):
    """The judge endpoint refuses us outright (wrong key, unknown model): a setting to fix, not a blip."""


class OpenAIJudge:
    """m eval votes and m hint votes of one turn, all concurrent, on an OpenAI-compatible endpoint.

    Vote i of a kind asks with ``seed = seed + i`` (eval) or ``seed + m + i`` (hint), as the PRM pool
    judge does; servers that honour ``seed`` then give reproducible votes. ``max_completion_tokens``
    bounds each answer (OpenAI's name; vLLM, SGLang, llama.cpp and our servers read it too).
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, votes: int = 3,
                 temperature: float = 0.6, max_new_tokens: int = 1024, max_candidates: int = 3,
                 min_chars: int = 10, timeout_s: float = 300.0, max_retries: int = 2, hints: bool = True) -> None:
        if votes <= 0:
            raise ValueError(f"judge votes={votes} must be > 0")
        if not model:
            raise ValueError("the OpenAI-compatible judge needs a model id (gateway.judge_model)")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.votes = votes
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.max_candidates = max_candidates
        self.min_chars = min_chars
        self.hints = hints  # False: no hint votes (RL-only training needs no hints)
        self.name = f"openai:{model}"
        self.client = openai.AsyncOpenAI(base_url=self.base_url, api_key=api_key or NO_KEY, timeout=timeout_s,
                                         max_retries=max_retries)

    async def check(self) -> None:
        """Ask the endpoint for its models once at start: a wrong key or an unknown model is an error
        that names the setting; an endpoint that is down only warns (its votes fail until it is up)."""
        try:
            served = [m.id async for m in self.client.models.list()]
        except openai.AuthenticationError as err:
            raise JudgeEndpointError(
                f"the judge endpoint {self.base_url} refused the key ({err.status_code}): put the endpoint's key "
                "in the environment variable named by gateway.judge_api_key_env") from None
        except (openai.APIConnectionError, openai.APITimeoutError) as err:
            logger.warning("the judge endpoint %s is not reachable now (%s); its votes count as none until it is",
                           self.base_url, err)
            return
        except openai.APIStatusError as err:  # no /models route (some servers): the votes will tell
            logger.warning("the judge endpoint %s has no model list (HTTP %d); judging with model %r anyway",
                           self.base_url, err.status_code, self.model)
            return
        if served and self.model not in served:
            raise JudgeEndpointError(f"gateway.judge_model={self.model!r} is not served by {self.base_url}; "
                                     f"it serves {served[:10]}")

    async def _call(self, messages: list[dict[str, str]], seed: int) -> str | None:
        try:
            out = await self.client.chat.completions.create(
                model=self.model, messages=messages, temperature=self.temperature,
                max_completion_tokens=self.max_new_tokens, seed=seed)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - any judge failure is "no vote", by design
            logger.warning("judge call to %s failed (counted as no vote): %s: %s", self.base_url,
                           type(err).__name__, err)
            return None
        if not out.choices:
            return None
        return out.choices[0].message.content

    async def judge(self, response_text: str, next_state: NextState, *, seed: int = 0) -> Judgement:
        m = self.votes
        eval_messages = eval_vote_messages(response_text, next_state)
        calls = [self._call(eval_messages, seed + i) for i in range(m)]
        if self.hints:
            hint_messages = hint_vote_messages(response_text, next_state)
            calls += [self._call(hint_messages, seed + m + i) for i in range(m)]
        outputs = await asyncio.gather(*calls)
        return build_judgement(outputs[:m], outputs[m:], max_candidates=self.max_candidates,
                               min_chars=self.min_chars, judge=self.name)

    async def close(self) -> None:
        await self.client.close()


def openai_judge_from_config(cfg: Any) -> OpenAIJudge:
    """The judge a `GatewayConfig` with ``judge: openai`` describes (the key read from its environment variable)."""
    return OpenAIJudge(cfg.judge_base_url, cfg.judge_model, api_key=os.environ.get(cfg.judge_api_key_env) or None,
                       votes=cfg.judge_votes, temperature=cfg.judge_temperature,
                       max_new_tokens=cfg.judge_max_new_tokens, max_candidates=cfg.max_candidates,
                       min_chars=cfg.hint_min_chars, timeout_s=cfg.judge_timeout_s,
                       max_retries=cfg.pool_max_retries, hints=cfg.judge_hints)
