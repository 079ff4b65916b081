"""The trainer's tau must be the temperature each sample was drawn with (docs/design.md §6): there
is one temperature (gateway.temperature, handed to the trainer as its tau), and the batcher refuses
(and counts, and says why, once) samples drawn at another temperature."""

from __future__ import annotations

import logging

import pytest

from openclaw_jax.config import load_experiment_config
from openclaw_jax.configlib import ConfigError
from openclaw_jax.samples import Sample, SampleStore
from openclaw_jax.trainer.batch import BatchSpec
from openclaw_jax.trainer.batcher import SampleBatcher


def test_one_temperature_is_the_sampling_temperature_and_the_trainers_tau():
    cfg = load_experiment_config([], ["gateway.temperature=0.7"])
    assert cfg.sample_spec().temperature == 0.7
    with pytest.raises(ConfigError, match="gateway.temperature=0.0 must be > 0"):
        load_experiment_config([], ["gateway.temperature=0"])
    with pytest.raises(ConfigError, match="trainer.temperature.*is gone.*gateway.temperature"):
        load_experiment_config([], ["trainer.temperature=0.7"])


def _sample(i: int, temperature: float) -> Sample:
    return Sample(session_id=f"s{i}", turn_index=0, kind="rl", reward=1.0, prompt_ids=[1, 2, 3], response_ids=[4, 5],
                  rollout_logprobs=[-0.1, -0.2], weight_version="0", temperature=temperature, top_p=0.9, top_k=20)


def test_batcher_refuses_samples_drawn_at_another_temperature(tmp_path, caplog):
    with SampleStore(tmp_path / "s") as store:
        temps = [0.7, 1.0, 0.7, 0.3, 0.7, 1.0]
        for i, t in enumerate(temps):
            store.append(_sample(i, t))
    batcher = SampleBatcher(str(tmp_path / "s"), BatchSpec(samples_per_step=8, min_seq_bucket=8, min_response_bucket=4,
                                                          temperature=0.7))
    with caplog.at_level(logging.WARNING, logger="openclaw_jax.trainer.batcher"):
        batches = list(batcher.batches(0, len(temps)))
    kept = [s.session_id for b in batches for s in b.samples]
    assert kept == ["s0", "s2", "s4"]
    assert batcher.dropped["temperature"] == 3
    warnings = [r for r in caplog.records if "temperature" in r.getMessage()]
    assert len(warnings) == 1 and "tau is 0.7" in warnings[0].getMessage()
    # the sampling settings travel with the sample through the store
    with SampleStore(tmp_path / "s", readonly=True) as store:
        assert (store[0].temperature, store[0].top_p, store[0].top_k) == (0.7, 0.9, 20)


def test_records_written_before_top_p_existed_still_load():
    data = _sample(0, 1.0).to_dict()
    del data["top_p"], data["top_k"]
    old = Sample.from_dict(data)
    assert (old.top_p, old.top_k) == (1.0, -1)
