"""Independent NumPy float64 reference for the loss family, written from docs/design.md §6.

Plain per-sample, per-token Python loops: selection by explicit set intersections, the
subset as a Python list, PPO/OPD/entropy/KL values and their gradients w.r.t. the logits
derived by hand (no autodiff, no code shared with ``openclaw_jax``). Also the synthetic
batches the loss tests use.
"""

from __future__ import annotations

import math

import numpy as np

TAIL_EPS = 1e-7


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


# ----------------------------------------------------------------------------- data


def make_case(seed: int, *, B: int = 6, T: int = 10, K: int = 4, C: int = 3, V: int = 64,
              segments: bool = False) -> dict:
    """A batch exercising every corner: padding candidates that would win if not masked,
    tokens whose overlap is empty for every candidate, masked tokens holding NaN, a sample
    with no hint, a padding sample full of NaN, a real sample with an all-zero mask, and
    log-ratios beyond the +-20 clamp. Samples (B=6): 0 three candidates, 1 two + padding,
    2 none (RL only), 3 one candidate, 4 batch padding, 5 real but fully masked."""
    assert B == 6, "the corner cases below are laid out for 6 samples"
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, (B, T, V))
    cur_lsm = log_softmax(logits)
    old_logits = logits + rng.normal(0.0, 0.3, (B, T, V))
    old_lsm = log_softmax(old_logits)
    tokens = np.argmax(old_lsm + rng.gumbel(size=old_lsm.shape), axis=-1)
    old_lp = np.take_along_axis(old_lsm, tokens[..., None], -1)[..., 0]
    sq = np.argsort(-old_lsm, axis=-1, kind="stable")[..., :K]
    sq_lp = np.take_along_axis(old_lsm, sq, -1)

    teacher_logits = old_logits[:, None] + rng.normal(0.0, 1.5, (B, C, T, V))
    for t in (1, 2):  # every candidate's top-K misses the student's top-K here -> O = 0
        for c in range(C):
            teacher_logits[0, c, t, sq[0, t]] -= 100.0
    t_lsm = log_softmax(teacher_logits)
    sp = np.argsort(-t_lsm, axis=-1, kind="stable")[..., :K]
    sp_lp = np.take_along_axis(t_lsm, sp, -1)
    tsq = np.take_along_axis(t_lsm, np.broadcast_to(sq[:, None], (B, C, T, K)), -1)
    old_at_sp = np.take_along_axis(np.broadcast_to(old_lsm[:, None], t_lsm.shape), sp, -1)
    t_tok = np.take_along_axis(t_lsm, np.broadcast_to(tokens[:, None, :, None], (B, C, T, 1)), -1)[..., 0]

    candidate_mask = np.array([[1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], np.float64)[:, :C]
    sample_mask = np.array([1, 1, 1, 1, 0, 1], np.float64)
    loss_mask = (rng.random((B, T)) < 0.8).astype(np.float64)
    loss_mask[:, 0] = 0.0
    loss_mask[0, 1:4] = 1.0  # keep the empty-overlap and clamp tokens trained
    loss_mask[5] = 0.0
    rewards = np.array([1.0, -1.0, 1.0, 0.0, 1.0, -1.0])
    advantages = np.broadcast_to(rewards[:, None], (B, T)).copy()

    # log-ratios beyond the clamp: GRPO on (0, 3), OPD on the subset of (1, *) and (3, *)
    old_lp[0, 3] = cur_lsm[0, 3, tokens[0, 3]] + 25.0
    t_hi = int(np.flatnonzero(loss_mask[1])[0])
    sq_lp[1, t_hi, 0] -= 30.0
    old_at_sp[3, 0, 4, 1] += 30.0

    # padding candidates: their ids copy the student's (they would win) and their numbers are NaN
    for b in range(B):
        for c in range(C):
            if candidate_mask[b, c] == 0:
                sp[b, c] = sq[b]
                sp_lp[b, c] = np.nan
                tsq[b, c] = np.nan
                old_at_sp[b, c] = np.nan
                t_tok[b, c] = np.nan
    masked = loss_mask == 0
    old_lp[masked] = np.nan
    advantages[masked] = np.nan
    for arr in (old_lp, advantages):
        arr[4] = np.nan
    sq_lp[4] = np.nan
    tsq[4] = np.nan
    sp_lp[4] = np.nan
    old_at_sp[4] = np.nan

    rollout_lp = np.where(masked, np.nan, old_lp + rng.normal(0.0, 0.05, (B, T)))
    ref_lp = np.take_along_axis(cur_lsm, tokens[..., None], -1)[..., 0] + rng.normal(0.0, 0.5, (B, T))

    segment_ids = None
    if segments:
        segment_ids = np.zeros((B, T), np.int64)
        for b in range(B):
            t, seg = 1, 1
            while t < T:
                length = int(rng.integers(1, 4))
                if rng.random() < 0.25:
                    seg_id = 0  # outside any step
                else:
                    seg_id = seg
                    seg += 1
                segment_ids[b, t:t + length] = seg_id
                t += length

    return dict(
        logits=logits, response_ids=tokens, response_mask=loss_mask, old_logprobs=old_lp, advantages=advantages,
        student_topk_ids=sq, student_topk_logprobs=sq_lp, teacher_topk_ids=sp, teacher_topk_logprobs=sp_lp,
        teacher_logprobs_at_student_ids=tsq, old_logprobs_at_teacher_ids=old_at_sp,
        candidate_mask=candidate_mask, sample_mask=sample_mask, segment_ids=segment_ids,
        rollout_logprobs=rollout_lp, ref_logprobs=ref_lp, teacher_logprobs_at_tokens=t_tok,
    )


BATCH_FIELDS = (
    "response_ids", "response_mask", "old_logprobs", "advantages", "student_topk_ids", "student_topk_logprobs",
    "teacher_topk_ids", "teacher_topk_logprobs", "teacher_logprobs_at_student_ids",
    "old_logprobs_at_teacher_ids", "candidate_mask", "sample_mask", "segment_ids", "rollout_logprobs",
    "ref_logprobs", "teacher_logprobs_at_tokens",
)
INT_FIELDS = ("response_ids", "student_topk_ids", "teacher_topk_ids", "segment_ids")


def batch_arrays(case: dict, *, drop=()) -> dict:
    """The case's batch fields as float32/int32 numpy arrays (``drop`` names become None)."""
    out = {}
    for name in BATCH_FIELDS:
        value = case.get(name)
        if value is None or name in drop:
            out[name] = None
        else:
            out[name] = np.asarray(value, np.int32 if name in INT_FIELDS else np.float32)
    return out


# ----------------------------------------------------------------------------- reference


def _ppo(kl: float, adv: float, eps: float, eps_high: float, clamp: float | None):
    """Value, d value / d l_cur, and clipped flag of max(-rho A, -clip(rho) A), rho = exp(-clamp(kl))."""
    inside = True
    if clamp is not None:
        if kl > clamp:
            kl, inside = clamp, False
        elif kl < -clamp:
            kl, inside = -clamp, False
    rho = math.exp(-kl)
    unclipped = -rho * adv
    clipped = -min(max(rho, 1.0 - eps), 1.0 + eps_high) * adv
    if clipped > unclipped:
        return clipped, 0.0, 1.0
    # kl = l_old - l_cur, so d rho / d l_cur = rho (when not clamped)
    return unclipped, (-adv * rho if inside else 0.0), 0.0


def _overlap(sq_row, sp_row) -> int:
    return len(set(int(i) for i in sq_row) & set(int(i) for i in sp_row))


def reference_kstar(case: dict, mode: str) -> np.ndarray:
    """k*[b, t] by the selection rules of docs/design.md §6, with explicit loops."""
    sq, sp = case["student_topk_ids"], case["teacher_topk_ids"]
    cmask, mask, seg = case["candidate_mask"], case["response_mask"], case.get("segment_ids")
    B, C, T, _ = sp.shape
    kstar = np.zeros((B, T), np.int64)
    for b in range(B):
        real = [c for c in range(C) if cmask[b, c] > 0]
        if not real or mode == "shortest":
            continue
        ov = {c: [_overlap(sq[b, t], sp[b, c, t]) for t in range(T)] for c in real}

        def best(score):  # highest score, lowest index on ties
            top = max(score[c] for c in real)
            return min(c for c in real if score[c] == top)

        for t in range(T):
            if mode == "token_optimal":
                kstar[b, t] = best({c: ov[c][t] for c in real})
            elif seg is None:
                kstar[b, t] = best({c: sum(ov[c][u] for u in range(T) if mask[b, u] > 0) for c in real})
            elif seg[b, t] == 0:
                kstar[b, t] = 0
            else:
                members = [u for u in range(T) if seg[b, u] == seg[b, t] and mask[b, u] > 0]
                kstar[b, t] = best({c: sum(ov[c][u] for u in members) for c in real})
    return kstar


def reference_loss(logits: np.ndarray, case: dict, cfg: dict, kind: str = "hybrid"):
    """Returns (loss, d loss / d logits, metrics) in float64.

    ``cfg``: w_rl, w_opd, eps_clip, eps_clip_high, adv_diff_clip, hint_selection,
    subset_mode, log_ratio_clamp, entropy_coef, kl_coef, sample_norm_tokens (LossConfig's defaults when
    absent).
    """
    c = dict(w_rl=1.0, w_opd=1.0, eps_clip=0.2, eps_clip_high=0.28, adv_diff_clip=1.0,
             hint_selection="sequence_optimal", subset_mode="student", log_ratio_clamp=20.0,
             entropy_coef=0.0, kl_coef=0.0, sample_norm_tokens=0)
    c.update(cfg)
    eps, eps_h, clamp = c["eps_clip"], c["eps_clip_high"], c["log_ratio_clamp"]
    lsm = log_softmax(logits)
    prob = np.exp(lsm)
    B, T, V = logits.shape
    kstar = reference_kstar(case, c["hint_selection"])
    grad = np.zeros_like(lsm)
    real_samples = [b for b in range(B) if case["sample_mask"][b] > 0]
    n_real = max(len(real_samples), 1)

    acc = {name: [0.0, 0.0] for name in (
        "loss", "grpo_pg_loss", "opd_loss", "entropy_loss", "kl_loss", "grpo_pg_clipfrac", "opd_pg_clipfrac",
        "ppo_kl", "opd_subset_size", "sel_overlap_at_k_star", "sel_k_star_mean",
        "opd_teacher_student_logp_topk_abs_mean", "train_rollout_logprob_abs_diff")}

    def add(name, value, count=1.0):
        acc[name][0] += value
        acc[name][1] += count

    def dlogp(b, t, v):  # d l_cur(v) / d z[b, t, :]
        g = -prob[b, t].copy()
        g[v] += 1.0
        return g

    for b in real_samples:
        tokens_t = [t for t in range(T) if case["response_mask"][b, t] > 0]
        # each sample's terms: its token mean, or its token sum / a constant (loss.sample_norm_tokens)
        n_tok = c["sample_norm_tokens"] or max(len(tokens_t), 1)
        has_hint = bool(np.any(case["candidate_mask"][b] > 0))
        sums = dict(grpo=0.0, opd=0.0, ent=0.0, kl=0.0)
        for t in tokens_t:
            y = int(case["response_ids"][b, t])
            k = int(kstar[b, t])
            old_y = case["old_logprobs"][b, t]
            scale = 1.0 / (n_tok * n_real)
            add("ppo_kl", old_y - lsm[b, t, y])
            if case.get("rollout_logprobs") is not None:
                add("train_rollout_logprob_abs_diff", abs(old_y - case["rollout_logprobs"][b, t]))

            # entropy and low-variance KL
            ent = -float(np.sum(prob[b, t] * lsm[b, t]))
            sums["ent"] += ent
            if c["entropy_coef"] != 0:
                grad[b, t] += -c["entropy_coef"] * scale * (-prob[b, t] * (lsm[b, t] + ent))
            if case.get("ref_logprobs") is not None:
                r = case["ref_logprobs"][b, t] - lsm[b, t, y]
                sums["kl"] += math.exp(r) - r - 1.0
                if c["kl_coef"] != 0:
                    grad[b, t] += c["kl_coef"] * scale * (1.0 - math.exp(r)) * dlogp(b, t, y)

            if has_hint:
                add("sel_overlap_at_k_star", _overlap(case["student_topk_ids"][b, t], case["teacher_topk_ids"][b, k, t]))
                add("sel_k_star_mean", k)

            if kind == "token_combine":
                teacher_term = case["teacher_logprobs_at_tokens"][b, k, t] - old_y if has_hint else 0.0
                adv = c["w_opd"] * teacher_term + c["w_rl"] * case["advantages"][b, t]
                val, d, clipped = _ppo(old_y - lsm[b, t, y], adv, eps, eps_h, None)
                sums["grpo"] += val
                grad[b, t] += scale * d * dlogp(b, t, y)
                add("grpo_pg_clipfrac", clipped)
                continue

            val, d, clipped = _ppo(old_y - lsm[b, t, y], case["advantages"][b, t], eps, eps_h, clamp)
            sums["grpo"] += val
            grad[b, t] += c["w_rl"] * scale * d * dlogp(b, t, y)
            add("grpo_pg_clipfrac", clipped)

            if not has_hint:
                continue
            sq = case["student_topk_ids"][b, t]
            sp = case["teacher_topk_ids"][b, k, t]

            if kind == "tail_kl":
                q = [prob[b, t, int(v)] for v in sp]
                a = list(case["teacher_topk_logprobs"][b, k, t])
                s_sum = sum(q)
                s_clamped = s_sum > 1.0 - TAIL_EPS
                s_tail = 1.0 - min(s_sum, 1.0 - TAIL_EPS)
                t_tail = 1.0 - min(sum(math.exp(x) for x in a), 1.0 - TAIL_EPS)
                kl = sum(qi * (math.log(qi) - ai) for qi, ai in zip(q, a))
                kl += s_tail * (math.log(s_tail) - math.log(t_tail))
                sums["opd"] += kl
                d_tail = 0.0 if s_clamped else -(math.log(s_tail) - math.log(t_tail) + 1.0)
                for qi, ai, v in zip(q, a, sp):
                    d_q = math.log(qi) - ai + 1.0 + d_tail
                    grad[b, t] += c["w_opd"] * scale * d_q * qi * dlogp(b, t, int(v))
                continue

            mode = c["subset_mode"]
            if mode == "student":
                subset = [(int(v), sq_lp, t_lp) for v, sq_lp, t_lp in
                          zip(sq, case["student_topk_logprobs"][b, t], case["teacher_logprobs_at_student_ids"][b, k, t])]
            elif mode == "teacher":
                subset = [(int(v), o_lp, t_lp) for v, o_lp, t_lp in
                          zip(sp, case["old_logprobs_at_teacher_ids"][b, k, t], case["teacher_topk_logprobs"][b, k, t])]
            else:
                teacher_set = set(int(v) for v in sp)
                subset = [(int(v), sq_lp, t_lp) for v, sq_lp, t_lp in
                          zip(sq, case["student_topk_logprobs"][b, t], case["teacher_logprobs_at_student_ids"][b, k, t])
                          if int(v) in teacher_set]
            add("opd_subset_size", len(subset))
            if not subset:
                continue
            top = max(o for _, o, _ in subset)
            z = sum(math.exp(o - top) for _, o, _ in subset)
            for v, o, t_lp in subset:
                w = math.exp(o - top) / z
                diff = t_lp - o
                add("opd_teacher_student_logp_topk_abs_mean", abs(diff))
                if c["adv_diff_clip"] > 0:
                    diff = min(max(diff, -c["adv_diff_clip"]), c["adv_diff_clip"])
                val, d, clipped = _ppo(o - lsm[b, t, v], diff * w, eps, eps_h, clamp)
                sums["opd"] += val
                grad[b, t] += c["w_opd"] * scale * d * dlogp(b, t, v)
                add("opd_pg_clipfrac", clipped)

        per = {key: value / n_tok for key, value in sums.items()}
        add("grpo_pg_loss", per["grpo"])
        add("opd_loss", per["opd"])
        add("entropy_loss", per["ent"])
        add("kl_loss", per["kl"])
        if kind == "token_combine":
            total = per["grpo"]
        else:
            total = c["w_rl"] * per["grpo"] + c["w_opd"] * per["opd"]
        total += -c["entropy_coef"] * per["ent"] + c["kl_coef"] * per["kl"]
        add("loss", total)

    loss = acc["loss"][0] / n_real
    metrics = {name: (s / n if n > 0 else 0.0) for name, (s, n) in acc.items()}
    for name in ("grpo_pg_loss", "opd_loss", "entropy_loss", "kl_loss", "loss"):
        metrics[name] = acc[name][0] / n_real if real_samples else 0.0
    return loss, grad, metrics
