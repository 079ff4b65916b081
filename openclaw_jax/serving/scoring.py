"""The promotion gate's check: a candidate against the served version on held-out replay turns.

Pure parts only: the host-side arrays of one replay turn (`replay_arrays`), the jitted per-turn
terms (`replay_terms`), their aggregation (`aggregate`) and the rule (`decide`). The orchestration
(which turns, which versions, what happens after) is `gate.py`.

For a replay turn i (prompt x, the response y it was served with, response positions t with mask
m_t, the judge's verdict r_i in {-1, 0, 1} on the person's reaction, its hint prompts x^c), with
log-probs at the sampling temperature tau (log_softmax(z / tau), the trainer's and the rollout's):

    dlogp_i   = sum_t m_t [log pi_cand(y_t | x, y_<t) - log pi_served(y_t | ...)] / sum_t m_t
    drift_i   = sum_t m_t KL(pi_served || pi_cand)(. | x, y_<t) / sum_t m_t          (whole vocabulary)
    teacher_i = mean_c sum_t m_t [KL(T_c || pi_served) - KL(T_c || pi_cand)] / sum_t m_t
                (T_c: the frozen teacher on hint prompt x^c; 0 without hints)
    s_i       = w_rl * (r_i - rbar) * dlogp_i + w_opd * teacher_i
                (rbar: the mean verdict of the replayed turns with r_i != 0)

``score`` is the mean of s_i over the turns with a signal (r_i != 0 with w_rl > 0, or hints with
w_opd > 0); ``drift`` the mean of drift_i over every replayed turn. dlogp_i is the candidate's
implicit reward of y against the served policy (the DPO / KTO log-ratio), and the reward part is the
policy-gradient estimate of the change in the expected verdict, with the replay set's mean verdict as
its baseline: answers of one conversation share most of their tokens ("The answer is ..."), so an
update moves the log-probs of accepted and corrected answers together, and without the baseline that
common move, times the mean verdict, would outweigh the contrast between them (on the CPU demo's
mostly-corrected turns it ranked an update trained on flipped rewards above the true one). So the
check asks whether the candidate raises the answers the person accepted *relative to* those they
corrected, and moves towards what the hinted teacher would have said, on turns it never trained on,
without serving it and without a reaction to its own answers (the judge scores reactions, and nobody
has reacted to the candidate). ``agreement`` (reported, not ruled on) is the fraction of (accepted,
corrected) pairs of replayed turns whose accepted answer gained more log-probability than the
corrected one (the pairwise accuracy DPO reports).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from openclaw_jax.ops import kl_divergence, token_logprobs


def bucket(n: int, minimum: int) -> int:
    """The smallest power of two >= max(n, minimum): one compiled shape per bucket."""
    size = max(minimum, 1)
    while size < n:
        size *= 2
    return size


@dataclass(frozen=True)
class ReplayArrays:
    """One replay turn as padded arrays (a batch of one): the student's ``ids [1, L]``, the positions
    whose hidden state predicts each response token ``idx [1, T]``, the response tokens ``targets
    [1, T]`` and their mask ``mask [1, T]``; with hints, the teacher's ``hint_ids [1, C, Lh]``,
    ``hint_idx [1, C, T]`` and which candidates are real ``hint_mask [1, C]``."""

    ids: np.ndarray
    idx: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    hint_ids: np.ndarray | None = None
    hint_idx: np.ndarray | None = None
    hint_mask: np.ndarray | None = None


def _placed(prompt: Sequence[int], response: Sequence[int], length: int, t_bucket: int, pad_id: int):
    ids = np.full((length,), pad_id, np.int32)
    seq = list(prompt) + list(response)
    ids[:len(seq)] = seq
    idx = np.zeros((t_bucket,), np.int32)
    idx[:len(response)] = np.arange(len(response)) + len(prompt) - 1
    return ids, idx


def replay_arrays(prompt_ids: Sequence[int], response_ids: Sequence[int], response_mask: Sequence[int] | None,
                  hint_prompt_ids: Sequence[Sequence[int]] = (), *, max_candidates: int = 1, pad_id: int = 0,
                  min_length: int = 64, min_response: int = 16) -> ReplayArrays:
    """The arrays of one replay turn, lengths bucketed to powers of two (``min_length`` / ``min_response`` floors)."""
    T = len(response_ids)
    if not prompt_ids or not T:
        raise ValueError("a replay turn needs a prompt and a response")
    t_bucket = bucket(T, min_response)
    ids, idx = _placed(prompt_ids, response_ids, bucket(len(prompt_ids) + T, min_length), t_bucket, pad_id)
    targets = np.full((t_bucket,), pad_id, np.int32)
    targets[:T] = response_ids
    mask = np.zeros((t_bucket,), np.float32)
    mask[:T] = 1.0 if response_mask is None else np.asarray(response_mask, np.float32)
    out = ReplayArrays(ids[None], idx[None], targets[None], mask[None])
    hints = list(hint_prompt_ids)[:max_candidates]
    if not hints:
        return out
    lh = bucket(max(len(h) for h in hints) + T, min_length)
    hint_ids = np.full((max_candidates, lh), pad_id, np.int32)
    hint_idx = np.zeros((max_candidates, t_bucket), np.int32)
    hint_mask = np.zeros((max_candidates,), np.float32)
    for c, hint in enumerate(hints):
        hint_ids[c], hint_idx[c] = _placed(hint, response_ids, lh, t_bucket, pad_id)
        hint_mask[c] = 1.0
    return dataclasses.replace(out, hint_ids=hint_ids[None], hint_idx=hint_idx[None], hint_mask=hint_mask[None])


def _response_hidden(model: nnx.Module, ids: jax.Array, idx: jax.Array) -> jax.Array:
    """Hidden states ``[B, T, H]`` at the positions that predict the response tokens."""
    hidden = model.hidden_states(ids)
    return jnp.take_along_axis(hidden, idx[..., None], axis=1)


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    return (x * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0)


@functools.partial(jax.jit, static_argnames=("temperature", "chunk_size"))
def replay_terms(graphdef: nnx.GraphDef, served: nnx.State, candidate: nnx.State, arrays: dict[str, jax.Array], *,
                 temperature: float, chunk_size: int, teacher_graphdef: nnx.GraphDef | None = None,
                 teacher: nnx.State | None = None) -> dict[str, jax.Array]:
    """Per turn of the batch: ``dlogp``, ``drift`` and (with a teacher and hint arrays) ``teacher`` (module docstring)."""
    s, c = nnx.merge(graphdef, served), nnx.merge(graphdef, candidate)
    ids, idx, targets, mask = arrays["ids"], arrays["idx"], arrays["targets"], arrays["mask"]
    hs, hc = _response_hidden(s, ids, idx), _response_hidden(c, ids, idx)
    ws, wc = s.lm_head_kernel(), c.lm_head_kernel()
    lp_s = token_logprobs(hs, ws, targets, temperature=temperature, chunk_size=chunk_size)
    lp_c = token_logprobs(hc, wc, targets, temperature=temperature, chunk_size=chunk_size)
    drift = kl_divergence(hs, ws, hc, wc, temperature=temperature, chunk_size=chunk_size)
    out = {"dlogp": _masked_mean(lp_c - lp_s, mask), "drift": _masked_mean(drift, mask)}
    if teacher_graphdef is not None and "hint_ids" in arrays:
        t = nnx.merge(teacher_graphdef, teacher)
        b, n_cand, lh = arrays["hint_ids"].shape
        ht = _response_hidden(t, arrays["hint_ids"].reshape(b * n_cand, lh), arrays["hint_idx"].reshape(b * n_cand, -1))
        ht = ht.reshape(b, n_cand, *ht.shape[1:])
        wt = t.lm_head_kernel()
        expand = lambda h: jnp.broadcast_to(h[:, None], ht.shape[:-1] + h.shape[-1:])   # noqa: E731
        kl_ts = kl_divergence(ht, wt, expand(hs), ws, temperature=temperature, chunk_size=chunk_size)
        kl_tc = kl_divergence(ht, wt, expand(hc), wc, temperature=temperature, chunk_size=chunk_size)
        gain = _masked_mean(kl_ts - kl_tc, mask[:, None, :])            # [B, C]
        real = arrays["hint_mask"]
        out["teacher"] = (gain * real).sum(-1) / jnp.maximum(real.sum(-1), 1.0)
    return out


@dataclass(frozen=True)
class TurnTerms:
    """One replayed turn's numbers (module docstring): the judge's verdict, and whether it had hints."""

    sample_id: str
    verdict: int
    dlogp: float
    drift: float
    teacher: float | None = None


@dataclass(frozen=True)
class ReplayCheck:
    """The check's numbers for one candidate against the served version."""

    replayed: int        # held-out turns replayed
    with_signal: int     # of them, turns that carry a verdict or (used) hints
    score: float         # mean s_i over the turns with a signal (0.0 when there is none)
    drift: float         # mean per-token KL(served || candidate)
    reward_term: float   # mean w_rl * (r_i - rbar) * dlogp_i over the turns with a signal
    teacher_term: float  # mean w_opd * teacher_i over the turns with a signal
    agreement: float | None   # (accepted, corrected) pairs ranked right by dlogp (None: no such pair)

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in dataclasses.asdict(self).items()}


def aggregate(turns: Sequence[TurnTerms], *, w_rl: float, w_opd: float) -> ReplayCheck:
    """The check's numbers from the replayed turns (module docstring)."""
    rated = [t.verdict for t in turns if t.verdict != 0]
    rbar = float(np.mean(rated)) if rated else 0.0
    reward, teacher = [], []
    for turn in turns:
        has_reward = w_rl > 0 and turn.verdict != 0
        has_teacher = w_opd > 0 and turn.teacher is not None
        if has_reward or has_teacher:
            reward.append(w_rl * (turn.verdict - rbar) * turn.dlogp if has_reward else 0.0)
            teacher.append(w_opd * turn.teacher if has_teacher else 0.0)
    accepted = [t.dlogp for t in turns if t.verdict > 0]
    corrected = [t.dlogp for t in turns if t.verdict < 0]
    pairs = [1.0 if a > c else 0.5 if a == c else 0.0 for a in accepted for c in corrected]
    mean = lambda xs: float(np.mean(xs)) if xs else 0.0   # noqa: E731
    return ReplayCheck(replayed=len(turns), with_signal=len(reward), score=mean(reward) + mean(teacher),
                       drift=mean([t.drift for t in turns]), reward_term=mean(reward), teacher_term=mean(teacher),
                       agreement=mean(pairs) if pairs else None)


def signal_count(verdicts: Sequence[int], has_hints: Sequence[bool], *, w_rl: float, w_opd: float,
                 teacher: bool) -> int:
    """How many turns `aggregate` will count as carrying a signal, known before any replay: a verdict (when the
    reward term is on) or hints the teacher reads (when it is on)."""
    return sum((w_rl > 0 and v != 0) or (w_opd > 0 and teacher and h) for v, h in zip(verdicts, has_hints))


def not_replayed(with_signal: int) -> ReplayCheck:
    """The check of a candidate refused for too little evidence before anything was replayed (`replayed` 0)."""
    return ReplayCheck(replayed=0, with_signal=with_signal, score=0.0, drift=0.0, reward_term=0.0, teacher_term=0.0,
                       agreement=None)


def decide(check: ReplayCheck, *, min_replay: int, min_score: float, max_kl: float) -> tuple[str | None, str]:
    """(the rule that failed or None, why): the candidate passes with at least ``min_replay`` turns with
    a signal, ``score >= min_score`` and ``drift <= max_kl``; the reason gives the numbers."""
    if check.with_signal < min_replay:
        return "min_replay", (f"only {check.with_signal} held-out turn(s) with a verdict or hint to replay; the check "
                              f"needs gate.min_replay={min_replay}")
    if not check.score >= min_score:
        return "min_score", (f"replay score {check.score:.4g} < gate.min_score={min_score:g} on {check.with_signal} "
                             "held-out turn(s): the candidate moves away from what the person accepted")
    if not check.drift <= max_kl:
        return "max_kl", (f"drift {check.drift:.4g} nats/token KL(served || candidate) > gate.max_kl={max_kl:g} on "
                          f"{check.replayed} held-out turn(s)")
    return None, (f"replay score {check.score:.4g} >= {min_score:g} on {check.with_signal} held-out turn(s), drift "
                  f"{check.drift:.4g} <= {max_kl:g}")
