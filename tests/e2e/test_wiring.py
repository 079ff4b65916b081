"""The wiring between the pieces: each test here fails when one realistic wiring bug is put in.

A mutation review found the suite blind in these places; every test names the bug it
guards against, and its expected values are derived from the samples or configs directly, not
from the code under test:

- `Trainer.train_on` ignoring `trainer.reward_baseline` (only the helper was tested);
- the shared-prefix teacher's real-token count (`padding_fraction("teacher")`) off by the prefixes;
- `GroupRollouts.run_group` writing a dropped all-equal group (`drop` behaving like `zero`);
- `rl` still asking the gateway's judge for hint votes (`train._start_gateway`);
- a wrong LoRA merge in the serving weights the trainer pushes (fast, tiny random model).

(The sandbox's escape probes, as root and as an ordinary user, are in tests/envs/test_sandbox_escape.py.)

Config keys are built in `overrides` only, so a rename of a key changes one place.
"""

from __future__ import annotations

import asyncio
import types

import jax
import numpy as np
import pytest
from flax import nnx

from openclaw_jax.config import ExperimentConfig, load_experiment_config
from openclaw_jax.models.config import ModelConfig
from openclaw_jax.models.decoder import Decoder
from openclaw_jax.samples import Sample

VOCAB = 96


# ------------------------------------------------------------------ configs (the one place keys are named)

def overrides(*, loss_name: str = "combine", samples_per_step: int = 4, top_k: int = 4, extra=()) -> list[str]:
    return [f"loss.name={loss_name}", f"trainer.samples_per_step={samples_per_step}", f"loss.top_k={top_k}",
            "trainer.chunk_size=8", "gateway.max_candidates=3", "trainer.min_seq_bucket=16",
            "trainer.min_response_bucket=8", "trainer.optimizer.lr=1e-2", *extra]


def experiment(**kw) -> ExperimentConfig:
    return load_experiment_config([], overrides(**kw))


def _decoder(seed: int) -> Decoder:
    cfg = ModelConfig(family="qwen3", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, tie_word_embeddings=False,
                      dtype="float32", param_dtype="float32")
    return Decoder(cfg, rngs=nnx.Rngs(seed))


def _trainer(cfg: ExperimentConfig, student: Decoder | None = None):
    from openclaw_jax.parallel.mesh import make_mesh
    from openclaw_jax.trainer.loop import Trainer

    return Trainer(cfg, student or _decoder(0), _decoder(1), make_mesh((1, 1, 1), devices=jax.devices()[:1]),
                   samples=cfg.sample_spec())


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return [int(x) for x in rng.integers(1, VOCAB, n)]


def _flat(state) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.array(v.get_value(), np.float64, copy=True) for p, v in nnx.to_flat_state(state)}


# ------------------------------------------------------------------ (a) the reward baseline reaches the step

def _baseline_samples(rewards_of_turns: list[float], advantages_of_turns: list[float] | None = None) -> list[Sample]:
    """Three conversation turns with the given rewards (and, when given, those advantages on every
    token, set by hand) and one environment sample (its own per-token advantages, never centred)."""
    rng = np.random.default_rng(3)
    out = []
    for i, reward in enumerate(rewards_of_turns):
        r = 5 + i
        adv = None if advantages_of_turns is None else [advantages_of_turns[i]] * r
        out.append(Sample(session_id=f"s{i}", turn_index=0, kind="rl", reward=reward, prompt_ids=_ids(rng, 4 + i),
                          response_ids=_ids(rng, r), rollout_logprobs=list(-rng.random(r) - 0.5), weight_version="0",
                          token_advantages=adv))
    r = 6
    out.append(Sample(session_id="env", turn_index=0, kind="rl", reward=1.0, prompt_ids=_ids(rng, 5),
                      response_ids=_ids(rng, r), rollout_logprobs=list(-rng.random(r) - 0.5), weight_version="0",
                      token_advantages=[0.3, 0.3, -0.2, 0.5, 0.5, 0.1]))
    return out


def test_train_on_applies_the_reward_baseline():
    """Bug: `Trainer.train_on` ignores `trainer.reward_baseline`. With `batch_mean` the step must equal
    a `none` step on the same turns given the centred rewards as their advantages by hand (the mean
    over the conversation turns only, the environment sample untouched), and differ from a `none` step on the raw rewards."""
    from openclaw_jax.trainer.batcher import pack

    rewards = [1.0, -1.0, 1.0]
    mean = sum(rewards) / len(rewards)               # 1/3: the evaluated turns' mean
    centred = [r - mean for r in rewards]
    results = {}
    for name, baseline, by_hand in [("batch_mean", "batch_mean", None), ("by_hand", "none", centred),
                                    ("raw", "none", None)]:
        cfg = experiment(loss_name="rl", extra=[f"trainer.reward_baseline={baseline}"])
        trainer = _trainer(cfg)
        packed = pack(_baseline_samples(rewards, by_hand), trainer.train_step.spec)
        metrics = trainer.train_on(packed)
        results[name] = (metrics, _flat(trainer.state.trainable))
    (m_mean, p_mean), (m_hand, p_hand), (m_raw, p_raw) = (results[k] for k in ("batch_mean", "by_hand", "raw"))
    assert m_mean["rollout/reward_baseline"] == pytest.approx(mean)
    np.testing.assert_allclose(m_mean["loss"], m_hand["loss"], rtol=1e-5, atol=1e-7)
    for k in p_hand:
        np.testing.assert_allclose(p_mean[k], p_hand[k], rtol=1e-5, atol=1e-7, err_msg=k)
    # the baseline matters here: the raw-reward step moves the weights differently
    assert max(np.max(np.abs(p_raw[k] - p_hand[k])) for k in p_hand) > 1e-4
    assert abs(m_raw["loss"] - m_hand["loss"]) > 1e-4


# ------------------------------------------------------------------ (b) real teacher tokens, shared prefix

def _hinted_samples(rng: np.random.Generator) -> list[Sample]:
    """Samples whose hint prompts share the prompt's head (the hint goes before the last turn)."""
    out = []
    for i, n_hints in enumerate([3, 2, 1, 0]):
        prompt, response = _ids(rng, 6 + 2 * i), _ids(rng, 5 + i)
        hint_prompts = [prompt[:-1] + _ids(rng, 2 + 3 * j) + prompt[-1:] for j in range(n_hints)]
        out.append(Sample(session_id=f"h{i}", turn_index=0, kind="opd+rl" if n_hints else "rl",
                          reward=1.0 - 2 * (i % 2), prompt_ids=prompt, response_ids=response,
                          rollout_logprobs=[-0.5] * len(response), hints=[f"hint {j}" for j in range(n_hints)],
                          hint_prompt_ids=hint_prompts, weight_version="0"))
    return out


def _common_prefix_len(seqs: list[list[int]]) -> int:
    n = 0
    while all(len(s) > n for s in seqs) and len({s[n] for s in seqs}) == 1:
        n += 1
    return n


@pytest.mark.parametrize("packing", [False, True])
def test_shared_prefix_teacher_counts_its_real_tokens(packing):
    """Bug: the shared-prefix teacher's real-token count is off by the prefix lengths (counted per
    candidate, or not at all). Expected from the samples: each sample's candidates (hint prompts, or
    the un-hinted prompt for a turn without hints) share a prefix (stopping one short of the shortest
    prompt) that runs once, then each candidate's rest and the response."""
    from openclaw_jax.trainer.batch import BatchSpec
    from openclaw_jax.trainer.batcher import pack

    samples = _hinted_samples(np.random.default_rng(5))
    spec = BatchSpec(samples_per_step=4, max_candidates=3, min_seq_bucket=16, min_response_bucket=8,
                     shared_prefix_teacher=True, packing=packing, batch_prefix_min=0)
    assert spec.shares_prefix
    packed = pack(samples, spec)
    assert "prefix_len" in packed.teacher          # the shared-prefix layout was taken
    expected = 0
    for s in samples:
        prompts = [list(p) for p in s.hint_prompt_ids] or [list(s.prompt_ids)]   # rl_only_teacher="unhinted"
        n = min(_common_prefix_len(prompts), min(map(len, prompts)) - 1)
        assert len(prompts) < 2 or n > 0
        expected += n + sum(len(p) - n + len(s.response_ids) for p in prompts)
    assert packed.real_tokens["teacher"] == expected
    assert int((packed.teacher["segment_ids"] != 0).sum()) == expected     # the layout agrees
    slots = packed.teacher["input_ids"].size
    assert packed.padding_fraction("teacher") == pytest.approx((slots - expected) / slots)


# ------------------------------------------------------------------ (d) dropped all-equal groups stay out

class _FixedRewards:
    """An episode runner whose episodes end with the given rewards, in turn."""

    def __init__(self, rewards):
        self.rewards = list(rewards)

    async def run(self, task, policy, *, temperature):
        from openclaw_jax.envs.agentic.episode import Episode

        reward = self.rewards.pop(0)
        return Episode(task=task, prompt_ids=[1, 2, 3], response_ids=[4, 5, 6], loss_mask=[1, 1, 0],
                       rollout_logprobs=[-0.1, -0.2, 0.0], turns=[(0, 2)], reward=reward, end_reason="answer",
                       weight_versions=["0"])


@pytest.mark.parametrize("all_equal", ["drop", "zero"])
def test_run_group_drops_an_all_equal_group(all_equal, tmp_path):
    """Bug: `GroupRollouts.run_group` writes a dropped all-equal group with advantage 0 (`drop`
    behaving like `zero`). A group with one reward for all: `drop` writes nothing, `zero` writes every
    episode with advantage 0; a mixed group is written with r - mean(r) over std(r)."""
    from openclaw_jax.envs.agentic.episode import Task
    from openclaw_jax.envs.agentic.rollout import GroupRollouts
    from openclaw_jax.samples import SampleStore

    task = Task(task_id="t0", prompt="do it")
    with SampleStore(tmp_path / "s") as store:
        rollouts = GroupRollouts(_FixedRewards([1.0, 1.0, 1.0, 1.0, 0.0, 0.0]), policy=None, store=store,
                                 tasks=[task], group_size=3, temperature=1.0, all_equal=all_equal)
        asyncio.run(rollouts.run_group(task))                   # all equal
        written_equal = store.read(0)
        asyncio.run(rollouts.run_group(task))                   # rewards 1, 0, 0
        written = store.read(0)
    if all_equal == "drop":
        assert written_equal == [] and rollouts.stats.groups_dropped == 1
    else:
        assert len(written_equal) == 3 and rollouts.stats.groups_dropped == 0
        assert all(set(s.token_advantages) == {0.0} for s in written_equal)
    mixed = written[len(written_equal):]
    r = np.array([1.0, 0.0, 0.0])
    want = (r - r.mean()) / (r.std() + 1e-6)
    assert [s.token_advantages[0] for s in mixed] == pytest.approx(list(want), rel=1e-6)


def test_run_group_without_a_baseline_writes_the_solved_episodes_of_every_group(tmp_path):
    """`baseline=none` (filtered imitation): an all-solved group is kept with advantage 1 on every
    episode (a group baseline would drop it), a mixed group's solved episode gets 1 and its failures
    0, and a group with no reward at all is dropped."""
    from openclaw_jax.envs.agentic.episode import Task
    from openclaw_jax.envs.agentic.rollout import GroupRollouts
    from openclaw_jax.samples import SampleStore

    task = Task(task_id="t0", prompt="do it")
    with SampleStore(tmp_path / "s") as store:
        rollouts = GroupRollouts(_FixedRewards([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]), policy=None,
                                 store=store, tasks=[task], group_size=3, temperature=1.0, baseline="none")
        for _ in range(3):
            asyncio.run(rollouts.run_group(task))
        written = store.read(0)
    assert rollouts.stats.groups_dropped == 1
    assert [s.token_advantages[0] for s in written] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert [s.reward for s in written] == [1.0, 1.0, 1.0, 1.0, -1.0, -1.0]


def test_sampled_evaluation_runs_each_task_n_times_at_the_temperature():
    """`evaluate(..., temperature=t, samples=n)`: n episodes per task, each asked for at t, the success the
    mean over all of them; greedy (the default) runs each task once at temperature 0 and refuses n > 1."""
    from openclaw_jax.envs.agentic.episode import Task
    from openclaw_jax.envs.agentic.rollout import evaluate

    class Recording(_FixedRewards):
        def __init__(self, rewards):
            super().__init__(rewards)
            self.calls = []

        async def run(self, task, policy, *, temperature):
            self.calls.append((task.task_id, temperature))
            return await super().run(task, policy, temperature=temperature)

    tasks = [Task(task_id="a", prompt="x"), Task(task_id="b", prompt="y")]
    runner = Recording([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    result = asyncio.run(evaluate(runner, None, tasks, temperature=0.7, samples=3))
    assert sorted(runner.calls) == [("a", 0.7)] * 3 + [("b", 0.7)] * 3
    assert result.n == 6 and result.success == pytest.approx(4 / 6)
    greedy = Recording([1.0, 0.0])
    assert asyncio.run(evaluate(greedy, None, tasks)).success == 0.5 and {t for _, t in greedy.calls} == {0.0}
    with pytest.raises(ValueError, match="greedy takes 1"):
        asyncio.run(evaluate(greedy, None, tasks, samples=2))


# ------------------------------------------------------------------ (e) rl casts no hint votes

@pytest.mark.parametrize("loss_name,votes", [("rl", False), ("combine", True), ("opd", True)])
def test_start_gateway_asks_for_hint_votes_only_when_the_loss_uses_hints(loss_name, votes, tmp_path, monkeypatch):
    """Bug: with `rl` the run's gateway still has the judge cast hint votes (wasted judge calls,
    hint-only samples). `train._start_gateway` must hand the gateway `judge_hints` off for `rl`."""
    import openclaw_jax.gateway.server as gateway_server
    import openclaw_jax.train as train

    seen = []

    async def fake_start(gw_cfg, **kw):
        seen.append(gw_cfg)
        return object(), object(), "http://127.0.0.1:1"

    monkeypatch.setattr(gateway_server, "start_gateway", fake_start)
    monkeypatch.setattr(train, "start_gateway", fake_start, raising=False)   # if imported at module top
    cfg = experiment(loss_name=loss_name, extra=["gateway.judge_hints=true"])
    run = types.SimpleNamespace(cfg=cfg, run_dir=tmp_path, base=types.SimpleNamespace(model_dir="m", tokenizer=None),
                                cleanups=[], summary={}, pool_api_key="pool-key")
    url = asyncio.run(train._start_gateway(run, ["http://127.0.0.1:2"]))
    assert url == "http://127.0.0.1:1" and len(seen) == 1
    assert seen[0].judge_hints is votes
    assert tuple(seen[0].policy_urls) == ("http://127.0.0.1:2",)
    assert seen[0].policy_api_key == "pool-key"   # the gateway sends the policy servers' key


# ------------------------------------------------------------------ LoRA merge in the pushed serving weights

def test_serving_weights_merge_lora_as_w_plus_scaled_ab():
    """Bug: a wrong LoRA merge (scale, order of A and B, no merge) in the weights the step pushes.
    After a step (B no longer zero) every adapted kernel of the pushed model must equal, in float64,
    W + (alpha / rank) * A @ B from the trainer's own base and adapter values; the rest unchanged."""
    from openclaw_jax.models.lora import LoRAConfig, add_lora
    from openclaw_jax.trainer.batcher import pack

    rank, alpha = 4, 8.0
    cfg = experiment(loss_name="rl", extra=["model.lora.enabled=true", f"model.lora.rank={rank}",
                                            f"model.lora.alpha={alpha}", "model.dtype=float32",
                                            "model.param_dtype=float32"])
    student = add_lora(_decoder(0), LoRAConfig(rank=rank, alpha=alpha), rngs=nnx.Rngs(2))
    trainer = _trainer(cfg, student)
    packed = pack(_baseline_samples([1.0, -1.0, 1.0]), trainer.train_step.spec)
    trainer.train_on(packed, serve=True)
    _, pushed = trainer.take_serving_weights()
    got = _flat(pushed)
    adapters, base = _flat(trainer.state.trainable), _flat(trainer.state.frozen)
    scale = alpha / rank
    merged = 0
    for name, w in base.items():
        assert name in got, name
        parent = name.rsplit(".", 1)[0]
        if name.endswith(".kernel") and parent + ".lora_a" in adapters:
            a, b = adapters[parent + ".lora_a"], adapters[parent + ".lora_b"]   # [L, *in, r], [L, r, *out]
            assert np.abs(b).max() > 0                                          # the step moved B
            layers = a.shape[0]
            delta = np.stack([a[i].reshape(-1, rank) @ b[i].reshape(rank, -1) for i in range(layers)])
            want = w + scale * delta.reshape(w.shape)
            merged += 1
        else:
            want = w
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
    assert merged > 0
    assert not any(k.endswith(("lora_a", "lora_b")) for k in got)
    # the export path (outside jit) merges the same way
    outside = _flat(nnx.state(trainer.serving_model()))
    for name in got:
        np.testing.assert_allclose(outside[name], got[name], rtol=1e-5, atol=1e-6, err_msg=name)
