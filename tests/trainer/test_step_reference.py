"""One whole trainer step (`Trainer.train_on`) against a reference that shares nothing with
`openclaw_jax.trainer.step`.

The reference takes every model output from HF `transformers` (PyTorch, float64) on the same
checkpoint files the trainer loads: the student's logits over prompt + response and the
teacher's logits over each hint-augmented prompt + the same response. From those full logits
it builds, in NumPy float64 by the equations of docs/design.md §6, the student's top-K S^q, each
candidate's own top-K S^p, the teacher's log-probs at S^q, the old policy's log-probs at S^p,
the overlap, k*, the subsets and the loss (`loss_reference.reference_loss`, plain loops). The
gradient is the reference d loss / d logits pushed back through the PyTorch model by autograd;
its global norm must equal the step's `grad_norm`.

So a wiring mistake anywhere in the step (which teacher tensor feeds which loss field, which
prompt the teacher sees, which candidate is padding, temperature, masks) changes at least one
of the compared numbers.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from tests.helpers.loss_reference import log_softmax, reference_loss

TAU = 0.7
TOP_K = 4


def _samples(rng: np.random.Generator, vocab: int):
    from openclaw_jax.samples import Sample

    def ids(n):
        return [int(x) for x in rng.integers(3, vocab - 8, n)]

    plan = [("opd+rl", -1.0, 3), ("opd", 0.0, 1), ("rl", 1.0, 0), ("opd+rl", 1.0, 2)]
    out = []
    for i, (kind, reward, n_hints) in enumerate(plan):
        prompt, response = ids(6 + 2 * i), ids(7 + i)
        # Hint prompts share the prompt's head and differ in length (shortest first, as the gateway sorts).
        hint_prompts = [prompt[:-1] + ids(2 + 3 * j) + prompt[-1:] for j in range(n_hints)]
        out.append(Sample(session_id=f"s{i}", turn_index=0, kind=kind, reward=reward, prompt_ids=prompt,
                          response_ids=response, rollout_logprobs=[float(x) for x in -rng.random(len(response)) - 0.5],
                          hints=[f"hint {j} that is long enough" for j in range(n_hints)],
                          hint_prompt_ids=hint_prompts, weight_version="0", temperature=TAU))
    return out


def _torch_model(model_dir):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float64)
    return model.eval()


def _response_logits(model, prompt, response, *, grad=False):
    """[R, V] logits / tau predicting each response token (float64 torch tensor)."""
    import torch

    seq = torch.tensor([list(prompt) + list(response)])
    with torch.set_grad_enabled(grad):
        logits = model(seq).logits[0]
    return logits[len(prompt) - 1:len(prompt) - 1 + len(response)] / TAU


def _reference(student_dir, teacher_dir, samples, max_candidates, loss_cfg, *, teacher_candidates=True,
               with_ref=False):
    import torch

    student, teacher = _torch_model(student_dir), _torch_model(teacher_dir)
    B, C, K = len(samples), max_candidates, TOP_K
    T = max(len(s.response_ids) for s in samples)
    V = student.config.vocab_size
    z = np.zeros((B, T, V))
    case = dict(
        response_ids=np.zeros((B, T), np.int64), response_mask=np.zeros((B, T)), old_logprobs=np.zeros((B, T)),
        advantages=np.zeros((B, T)), rollout_logprobs=np.zeros((B, T)),
        student_topk_ids=np.zeros((B, T, K), np.int64), student_topk_logprobs=np.zeros((B, T, K)),
        teacher_topk_ids=np.zeros((B, C, T, K), np.int64), teacher_topk_logprobs=np.zeros((B, C, T, K)),
        teacher_logprobs_at_student_ids=np.zeros((B, C, T, K)), old_logprobs_at_teacher_ids=np.zeros((B, C, T, K)),
        candidate_mask=np.zeros((B, C)), sample_mask=np.ones(B), segment_ids=None,
        ref_logprobs=np.zeros((B, T)) if with_ref else None)
    for b, s in enumerate(samples):
        r = len(s.response_ids)
        z[b, :r] = _response_logits(student, s.prompt_ids, s.response_ids).numpy()
        lsm = log_softmax(z[b, :r])
        y = np.asarray(s.response_ids)
        case["response_ids"][b, :r] = y
        case["response_mask"][b, :r] = 1.0
        case["old_logprobs"][b, :r] = lsm[np.arange(r), y]      # old policy = the student at the step's start
        case["advantages"][b, :r] = s.reward
        case["rollout_logprobs"][b, :r] = s.rollout_logprobs
        if with_ref:  # the KL anchor: the frozen teacher model on the un-hinted prompt
            case["ref_logprobs"][b, :r] = log_softmax(_response_logits(teacher, s.prompt_ids, s.response_ids).numpy()
                                                      )[np.arange(r), y]
        sq = np.argsort(-lsm, axis=-1, kind="stable")[:, :K]
        case["student_topk_ids"][b, :r] = sq
        case["student_topk_logprobs"][b, :r] = np.take_along_axis(lsm, sq, -1)
        # RL-only samples: the un-hinted prompt is the single teacher candidate (docs/design.md §6)
        prompts = (s.hint_prompt_ids or [s.prompt_ids])[:C] if teacher_candidates else []
        for c, prompt in enumerate(prompts):
            t_lsm = log_softmax(_response_logits(teacher, prompt, s.response_ids).numpy())
            sp = np.argsort(-t_lsm, axis=-1, kind="stable")[:, :K]
            case["candidate_mask"][b, c] = 1.0
            case["teacher_topk_ids"][b, c, :r] = sp
            case["teacher_topk_logprobs"][b, c, :r] = np.take_along_axis(t_lsm, sp, -1)
            case["teacher_logprobs_at_student_ids"][b, c, :r] = np.take_along_axis(t_lsm, sq, -1)
            case["old_logprobs_at_teacher_ids"][b, c, :r] = np.take_along_axis(lsm, sp, -1)
    loss, grad_z, metrics = reference_loss(z, case, loss_cfg)

    # Push d loss / d (z / tau) back through the PyTorch student: sum_b <grad_z[b], logits_b / tau>.
    student.zero_grad()
    total = 0.0
    for b, s in enumerate(samples):
        r = len(s.response_ids)
        logits = _response_logits(student, s.prompt_ids, s.response_ids, grad=True)
        total = total + (logits * torch.from_numpy(grad_z[b, :r])).sum()
    total.backward()
    grad_norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in student.parameters() if p.grad is not None))
    return loss, metrics, grad_norm


@pytest.mark.parametrize("method,selection,subset,self_teacher,kl_coef,shared", [
    ("combine", "sequence_optimal", "student", False, 0.0, True),
    ("combine", "token_optimal", "teacher", False, 0.0, False),
    # the method's own setting: the teacher is the frozen initial model, re-prompted with the hints
    # (so the top-K sets overlap and the `overlap` subset is not empty)
    ("opd", "sequence_optimal", "overlap", True, 0.0, True),
    # the KL anchor to the frozen model: the reference log-probs from the shared-prefix teacher rows
    # (the un-hinted prompt rides along), and from the reference pass over the student's rows
    ("combine", "sequence_optimal", "student", False, 0.5, True),
    ("combine", "sequence_optimal", "student", False, 0.5, False),
])
def test_train_on_matches_independent_reference(tiny_qwen3_dir, tiny_qwen3_dir_b, method, selection, subset,
                                                self_teacher, kl_coef, shared):
    import jax

    from openclaw_jax.config import load_experiment_config
    from openclaw_jax.models.hub import load_pretrained
    from openclaw_jax.parallel.mesh import make_mesh
    from openclaw_jax.trainer.batcher import pack
    from openclaw_jax.trainer.loop import Trainer

    max_candidates = 2  # the first sample's third hint is dropped, as the trainer keeps at most this many
    cfg = load_experiment_config([], [
        f"loss.name={method}", f"loss.hint_selection={selection}", f"loss.subset_mode={subset}",
        f"gateway.temperature={TAU}", f"loss.top_k={TOP_K}", "trainer.chunk_size=8",
        "trainer.samples_per_step=4", f"gateway.max_candidates={max_candidates}",
        "trainer.min_seq_bucket=16", "trainer.min_response_bucket=8", "trainer.staleness_mode=drop",
        "trainer.optimizer.lr=1e-3", f"loss.kl_coef={kl_coef}", f"trainer.shared_prefix_teacher={shared}",
        "trainer.batch_prefix_min=0"])   # (the per-sample rows, not packed ones, whenever shared)
    teacher_dir = tiny_qwen3_dir if self_teacher else tiny_qwen3_dir_b
    student = load_pretrained(tiny_qwen3_dir, dtype="float32").model
    teacher = load_pretrained(teacher_dir, dtype="float32").model
    mesh = make_mesh((1, 1, 1), devices=jax.devices()[:1])
    trainer = Trainer(cfg, student, teacher, mesh, samples=cfg.sample_spec())
    samples = _samples(np.random.default_rng(0), student.cfg.vocab_size)
    packed = pack(samples, trainer.train_step.spec)
    assert ("prefix_len" in packed.teacher) is shared
    assert ("reference_offset" in packed.teacher) is (shared and bool(kl_coef))
    metrics = trainer.train_on(packed)
    assert ("time/reference_pass" in metrics) is (bool(kl_coef) and not shared)

    loss_cfg = dict(hint_selection=selection, subset_mode=subset, kl_coef=kl_coef)
    if method == "opd":
        loss_cfg["w_rl"] = 0.0
    ref_loss, ref_metrics, ref_grad_norm = _reference(tiny_qwen3_dir, teacher_dir, samples, max_candidates,
                                                      loss_cfg, with_ref=bool(kl_coef))
    if kl_coef:  # the anchor's value, and its part of the loss and gradient checked below
        assert metrics["kl_loss"] == pytest.approx(ref_metrics["kl_loss"], abs=2e-4, rel=1e-4)
        assert ref_metrics["kl_loss"] > 1e-3

    assert metrics["loss"] == pytest.approx(ref_loss, abs=1e-4, rel=1e-4)
    for name in ("grpo_pg_loss", "opd_loss", "opd_subset_size", "sel_overlap_at_k_star", "sel_k_star_mean",
                 "opd_teacher_student_logp_topk_abs_mean", "train_rollout_logprob_abs_diff", "ppo_kl",
                 "entropy_loss", "grpo_pg_clipfrac", "opd_pg_clipfrac"):
        assert metrics[name] == pytest.approx(ref_metrics[name], abs=2e-4, rel=1e-4), name
    assert metrics["grad_norm"] == pytest.approx(ref_grad_norm, rel=1e-3, abs=1e-6)
    # the case must exercise the OPD branch with several candidates, or the wiring goes unchecked
    assert ref_metrics["opd_subset_size"] > 0 and abs(ref_metrics["opd_loss"]) > 1e-3


def test_rl_trains_on_rewards_alone_without_teacher_or_hint_only_samples(tiny_qwen3_dir, tiny_qwen3_dir_b, tmp_path):
    """`rl`: the hint-only sample (reward 0) is not in the batch, so the GRPO mean is over the three
    rewarded samples; the teacher pass never runs; the step equals the reference GRPO step on them."""
    import jax

    from openclaw_jax.config import load_experiment_config
    from openclaw_jax.samples import SampleStore
    from openclaw_jax.models.hub import load_pretrained
    from openclaw_jax.parallel.mesh import make_mesh
    from openclaw_jax.trainer.batcher import SampleBatcher
    from openclaw_jax.trainer.loop import Trainer

    cfg = load_experiment_config([], [
        "loss.name=rl", f"gateway.temperature={TAU}", f"loss.top_k={TOP_K}",
        "trainer.chunk_size=8", "trainer.samples_per_step=4", "gateway.max_candidates=2",
        "trainer.min_seq_bucket=16", "trainer.min_response_bucket=8", "trainer.optimizer.lr=1e-3"])
    student = load_pretrained(tiny_qwen3_dir, dtype="float32").model
    teacher = load_pretrained(tiny_qwen3_dir_b, dtype="float32").model
    trainer = Trainer(cfg, student, teacher, make_mesh((1, 1, 1), devices=jax.devices()[:1]), samples=cfg.sample_spec())

    samples = _samples(np.random.default_rng(0), student.cfg.vocab_size)
    # people's samples, the last one as a record written before samples had a person: the batch is the same
    samples = [dataclasses.replace(s, person=p) for s, p in zip(samples, ["alice", "bob@home", "bob@home", "default"])]
    with SampleStore(tmp_path / "store") as store:
        for sample in samples[:-1]:
            store.append(sample)
        old = samples[-1].to_dict()
        del old["person"]
        store.append_payload(json.dumps(old).encode())
    batcher = SampleBatcher(str(tmp_path / "store"), trainer.train_step.spec)
    [packed] = list(batcher.batches(0, len(samples), current_version=0))
    assert batcher.dropped["hint_only"] == 1 and [s.kind for s in packed.samples] == ["opd+rl", "rl", "opd+rl"]
    assert [s.person for s in packed.samples] == ["alice", "bob@home", "default"]
    assert packed.teacher["candidate_mask"].sum() == 0  # no hint candidate, no un-hinted anchor
    metrics = trainer.train_on(packed)
    assert metrics["time/teacher_pass"] == 0.0   # the step ran no teacher pass (a pass that runs takes time)
    assert {k: v for k, v in metrics.items() if k.startswith("people/") and k.endswith(("/samples", "/reward"))} == {
        "people/alice/samples": 1.0, "people/alice/reward": -1.0, "people/bob_40home/samples": 1.0,
        "people/bob_40home/reward": 1.0, "people/default/samples": 1.0, "people/default/reward": 1.0}

    kept = [s for s in samples if s.kind != "opd"]
    ref_loss, ref_metrics, ref_grad_norm = _reference(tiny_qwen3_dir, tiny_qwen3_dir_b, kept, 2, {"w_opd": 0.0},
                                                      teacher_candidates=False)
    assert metrics["loss"] == pytest.approx(ref_loss, abs=1e-5, rel=1e-4)
    assert metrics["grpo_pg_loss"] == pytest.approx(ref_metrics["grpo_pg_loss"], abs=1e-5, rel=1e-4)
    assert metrics["opd_loss"] == 0.0
    assert metrics["grad_norm"] == pytest.approx(ref_grad_norm, rel=1e-3, abs=1e-6)
    # a zero-loss row in the mean would scale the loss by 3/4: the reference on all four differs
    diluted = ref_loss * 3 / 4
    assert abs(metrics["loss"] - diluted) > 1e-4
