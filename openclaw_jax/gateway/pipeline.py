"""The gateway's background path: judge queued turns, build samples, hand them to the store writer.

A mixin of :class:`~openclaw_jax.gateway.server.Gateway` (which owns the queue, the judge, the
budget, the writer and the stats): ``cfg.judge_concurrency`` workers take scoring jobs off the
bounded queue, ask the judge, apply the three-case rule, render the hint-augmented prompts
and submit the sample; the store writer calls back once it is durable. Never on the request path.
Each person holds at most ``gateway.max_pending_judgements_per_person`` places of the queue, so one
client cannot crowd out the others' turns. A sample records its person beside its session.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from typing import Any

from openclaw_jax.gateway.judge import hint_augmented_messages
from openclaw_jax.samples import Sample
from openclaw_jax.gateway.sessions import ScoringJob, TurnRecord

logger = logging.getLogger("openclaw_jax.gateway.server")


class JudgePipeline:
    """Judge workers, sample building and the store writer's callbacks (state lives on the Gateway)."""

    cfg: Any
    stats: Any
    judge: Any
    budget: Any
    writer: Any
    sessions: Any
    limits: Any
    _queue: "asyncio.Queue[ScoringJob] | None"
    _active_jobs: int
    _release_images: Any   # ImageTurns
    _store_images_now: Any
    _hint_prompt_with_images: Any
    _next_sample_id: Any   # () -> the next sample's id (samples/holdout.py sample_ids)

    def _submit(self, job: ScoringJob) -> None:
        assert self._queue is not None
        person = job.turn.person
        if not self.limits.queue_judgement(person):
            self.stats.jobs_dropped_queue_full += 1
            logger.warning("person %s has %d turns waiting for the judge (gateway.max_pending_judgements_per_person): "
                           "session %s turn %d is dropped unscored", person, self.cfg.max_pending_judgements_per_person,
                           job.turn.session_id, job.turn.turn_index)
            self._release_images(job.turn)
            return
        try:
            self._queue.put_nowait(job)
            self.stats.jobs_queued += 1
        except asyncio.QueueFull:
            self.limits.judgement_done(person)
            self.stats.jobs_dropped_queue_full += 1
            logger.warning("judge queue full (%d): session %s turn %d is dropped unscored",
                           self.cfg.max_pending_judgements, job.turn.session_id, job.turn.turn_index)
            self._release_images(job.turn)

    async def _judge_worker(self, worker_index: int) -> None:
        assert self._queue is not None
        while True:
            job = await self._queue.get()
            self._active_jobs += 1
            try:
                await self._score_and_store(job)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one bad job must not stop the worker
                self.stats.judge_errors += 1
                logger.exception("judging session %s turn %d failed; no sample", job.turn.session_id,
                                 job.turn.turn_index)
            finally:
                self.limits.judgement_done(job.turn.person)
                self._release_images(job.turn)   # stored by now, or never to be (a few unlinks at most)
                self._active_jobs -= 1
                self._queue.task_done()

    @staticmethod
    def _judge_seed(turn: TurnRecord) -> int:
        return zlib.crc32(f"{turn.session_id}\x00{turn.turn_index}\x00{turn.created_at}".encode()) * 1000

    async def _score_and_store(self, job: ScoringJob) -> Sample | None:
        turn = job.turn
        judgement = await self.judge.judge(turn.response_text, job.next_state, seed=self._judge_seed(turn))
        self.stats.judgements += 1
        kind = judgement.kind
        if kind is None:
            self.stats.no_sample += 1
            logger.debug("session %s turn %d: eval 0 and no hint -> no sample", turn.session_id, turn.turn_index)
            return None
        hint_prompts = []
        for hint in judgement.hints:
            # One candidate at a time, yielding in between; inline when small (a thread would only add
            # GIL hand-offs), on a worker thread when large (the budget decides).
            messages = hint_augmented_messages(turn.prompt_messages, hint)
            if turn.images:   # the same images, each placeholder widened as in the prompt (from its grid)
                hint_prompts.append(await self._hint_prompt_with_images(turn, messages))
            else:
                hint_prompts.append(await self.budget.render(messages, tools=turn.tools, **turn.chat_template_kwargs))
            await asyncio.sleep(0)
        sample = Sample(
            sample_id=self._next_sample_id(), session_id=turn.session_id, turn_index=turn.turn_index, kind=kind,
            reward=judgement.eval_score if kind != "opd" else 0,
            prompt_ids=list(turn.prompt_ids), response_ids=turn.response_ids, rollout_logprobs=turn.rollout_logprobs,
            hints=list(judgement.hints), hint_prompt_ids=hint_prompts, weight_version=turn.weight_version,
            last_weight_version=turn.last_weight_version,
            temperature=turn.temperature, top_p=turn.top_p, top_k=turn.top_k, eval_score=judgement.eval_score, eval_votes=list(judgement.eval_votes),
            hint_votes=list(judgement.hint_votes), judge_raw=judgement.raw, judge=judgement.judge,
            next_state=job.next_state.to_dict(), response_text=turn.response_text,
            finish_reason=turn.finish_reason, image_sha256=[im.sha256 for im in turn.images], person=turn.person,
            adapter=turn.adapter, adapter_steps=turn.adapter_steps)
        if turn.images:
            # The blobs first, durably (fsynced), from the spool: the store refuses a record naming an image it lacks.
            try:
                await asyncio.get_running_loop().run_in_executor(None, self._store_images_now, turn)
            except OSError as err:
                logger.warning("session %s turn %d: image blobs not written (%s); sample dropped", turn.session_id,
                               turn.turn_index, err)
                self._store_error()
                self.stats.samples_dropped_store += 1
                return None
        if not self.writer.submit(sample):
            self.stats.samples_dropped_store += 1
        return sample

    def _store_error(self) -> None:
        self.stats.store_errors += 1

    def _sample_written(self, offset: int, sample: Sample) -> None:
        """Called by the store writer once ``sample`` is durable at ``offset``."""
        self.stats.samples += 1
        logger.info("sample %d: person %s session %s turn %d kind %s reward %s, %d hint(s)", offset, sample.person,
                    sample.session_id, sample.turn_index, sample.kind, sample.reward, len(sample.hints))

    async def drain(self, timeout_s: float = 60.0) -> None:
        """Wait until every queued judgement is done and its sample written (tests, benchmarks, shutdown)."""
        assert self._queue is not None and self.writer is not None
        deadline = asyncio.get_running_loop().time() + timeout_s
        await asyncio.wait_for(self._queue.join(), timeout=timeout_s)
        if not await self.writer.flush(deadline - asyncio.get_running_loop().time()):
            raise asyncio.TimeoutError(f"{self.writer.pending} sample(s) still wait for the store: "
                                       f"{self.writer.last_error}")

    async def _housekeeping_loop(self) -> None:
        interval = max(1.0, min(60.0, self.cfg.session_idle_timeout_s / 10))
        while True:
            await asyncio.sleep(interval)
            expired = self.sessions.expire_idle()
            if expired:
                logger.info("ended %d idle session(s)", len(expired))
