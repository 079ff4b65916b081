"""The typed config machinery: YAML, gin and dotted overrides onto frozen dataclasses."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import pytest

from openclaw_jax.configlib import ConfigError, dump_yaml, from_dict, load_config, parse_override


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0

    def __post_init__(self):
        if self.lr <= 0:
            raise ValueError(f"optim.lr={self.lr} must be > 0")


@dataclass(frozen=True)
class TrainerConfig:
    max_steps: int = 100
    method: Literal["combine", "rl", "opd"] = "combine"
    optim: OptimConfig = field(default_factory=OptimConfig)
    teacher_path: str | None = None


@dataclass(frozen=True)
class Root:
    run_dir: str = "runs/default"
    seed: int = 0
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    urls: tuple[str, ...] = ()


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run_dir: runs/x\ntrainer:\n  max_steps: 7\n  optim: {lr: 1e-4}\nurls: [a, b]\n")
    cfg = load_config(Root, yaml_files=[path], overrides=["trainer.method=rl", "trainer.optim.warmup_steps=3"])
    assert cfg.run_dir == "runs/x"
    assert cfg.trainer.max_steps == 7
    assert cfg.trainer.optim.lr == pytest.approx(1e-4)  # YAML reads "1e-4" as a string; it must become a float
    assert cfg.trainer.optim.warmup_steps == 3
    assert cfg.trainer.method == "rl"
    assert cfg.urls == ("a", "b")
    assert dataclasses.is_dataclass(cfg.trainer.optim)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 1  # type: ignore[misc]


def test_base_include(tmp_path):
    (tmp_path / "base.yaml").write_text("seed: 3\ntrainer: {max_steps: 9, method: opd}\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\ntrainer: {max_steps: 11}\n")
    cfg = load_config(Root, yaml_files=[tmp_path / "child.yaml"])
    assert (cfg.seed, cfg.trainer.max_steps, cfg.trainer.method) == (3, 11, "opd")


def test_unknown_key_names_key_and_allowed():
    with pytest.raises(ConfigError) as err:
        load_config(Root, overrides=["trainer.max_step=5"])
    msg = str(err.value)
    assert "trainer.max_step" in msg and "5" in msg and "max_steps" in msg


@pytest.mark.parametrize("override, fragment", [
    ("trainer.method=ppo", "'ppo'"),
    ("trainer.max_steps=many", "must be an integer"),
    ("trainer.optim.lr=-1", "optim.lr=-1"),
    ("trainer.optim.betas=[0.9]", "exactly 2"),
    ("seed=true", "must be an integer"),
])
def test_bad_values_fail_clearly(override, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(Root, overrides=[override])
    assert fragment in str(err.value)
    assert override.split("=")[0].split(".")[-1] in str(err.value) or "lr" in str(err.value)


def test_gin_front_end_by_class_and_by_path(tmp_path):
    gin_file = tmp_path / "x.gin"
    gin_file.write_text("TrainerConfig.max_steps = 42\nOptimConfig.lr = 0.5\nRoot.run_dir = 'runs/gin'\n")
    cfg = load_config(Root, gin_files=[gin_file], gin_bindings=["trainer.method = 'opd'"])
    assert cfg.trainer.max_steps == 42
    assert cfg.trainer.optim.lr == 0.5
    assert cfg.run_dir == "runs/gin"
    assert cfg.trainer.method == "opd"
    # dotted overrides win over gin
    cfg2 = load_config(Root, gin_files=[gin_file], overrides=["trainer.max_steps=1"])
    assert cfg2.trainer.max_steps == 1


def test_gin_unknown_param_is_an_error():
    with pytest.raises(ConfigError) as err:
        load_config(Root, gin_bindings=["TrainerConfig.steps = 3"])
    assert "trainer.steps" in str(err.value)


def test_dump_round_trip(tmp_path):
    cfg = load_config(Root, overrides=["trainer.optim.betas=[0.8, 0.9]", "urls=[u]"])
    path = tmp_path / "dump.yaml"
    path.write_text(dump_yaml(cfg))
    assert load_config(Root, yaml_files=[path]) == cfg


def test_parse_override_reads_yaml_scalars():
    assert parse_override("a.b=3") == ("a.b", 3)
    assert parse_override("a=null") == ("a", None)
    assert parse_override("a=hello world") == ("a", "hello world")
    with pytest.raises(ConfigError):
        parse_override("novalue")


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Root, yaml_files=[tmp_path / "nope.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(Root, yaml_files=[bad])
    with pytest.raises(ConfigError, match="mapping"):
        from_dict(Root, {"trainer": 3})


@dataclass(frozen=True)
class Section:
    RENAMED_KEYS = {"batch": "renamed section.samples_per_step"}   # not annotated: a class attribute
    samples_per_step: int = 4


@dataclass(frozen=True)
class Top:
    section: Section = field(default_factory=Section)


def test_a_renamed_key_fails_naming_where_it_went():
    """A config class's RENAMED_KEYS turn an old key into an error that names the new one (an unknown key
    without an entry still lists the allowed keys)."""
    with pytest.raises(ConfigError, match=r"config key section\.batch \(value 8\) is gone: renamed "
                                          r"section\.samples_per_step"):
        load_config(Top, overrides=["section.batch=8"])
    with pytest.raises(ConfigError, match="allowed keys under section: samples_per_step"):
        load_config(Top, overrides=["section.batchh=8"])
    assert load_config(Top, overrides=["section.samples_per_step=8"]).section.samples_per_step == 8


@pytest.mark.parametrize("old, new", [
    ("trainer.method=rl", "loss.name"), ("trainer.top_k=8", "loss.top_k"),
    ("trainer.temperature=0.7", "gateway.temperature"),
    ("trainer.allow_temperature_mismatch=true", "gateway.temperature"),
    ("trainer.rollout_batch_size=8", "trainer.samples_per_step"), ("loss.ppo_kl_clamp=10", "loss.log_ratio_clamp"),
])
def test_the_experiment_config_names_the_new_home_of_a_moved_key(old, new):
    from openclaw_jax.config import load_experiment_config

    with pytest.raises(ConfigError, match=f"{old.split('=')[0]}.*is gone.*{new}"):
        load_experiment_config([], [old])


def test_an_old_run_directorys_config_still_loads(tmp_path):
    """A run's resolved config.yaml from before the loss section: read with today's keys (the weight `rl`
    rewrote then is left to the loss), while the same file as a hand-written config is refused."""
    import yaml

    from openclaw_jax.config import load_experiment_config, load_run_config

    old = {"run_dir": "runs/old", "gateway": {"temperature": 0.7},
           "trainer": {"method": "rl", "top_k": 8, "rollout_batch_size": 6, "temperature": 0.7,
                       "allow_temperature_mismatch": False, "max_steps": 3},
           "loss": {"w_rl": 1.0, "w_opd": 1.0, "ppo_kl_clamp": 10.0, "kl_coef": 0.0}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    cfg = load_run_config(path, [f"run_dir={tmp_path}"])
    assert (cfg.loss.name, cfg.loss.w_rl, cfg.loss.w_opd, cfg.loss.top_k, cfg.loss.log_ratio_clamp) == (
        "rl", 1.0, 0.0, 8, 10.0)
    assert (cfg.trainer.samples_per_step, cfg.trainer.max_steps, cfg.sample_spec().temperature) == (6, 3, 0.7)
    assert cfg.run_dir == str(tmp_path)
    with pytest.raises(ConfigError, match="is gone"):
        load_experiment_config([str(path)])
