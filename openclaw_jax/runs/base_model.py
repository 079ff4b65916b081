"""The run's base model and trainer: the student and its frozen teacher read from the same files onto the
trainer's mesh (a random or vision-on-text checkpoint written first when the config asks for one), and the
`Trainer` (or `PerPersonTrainer`) built around them. Used by `python -m openclaw_jax.train` and the benches."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from openclaw_jax.config import ExperimentConfig
from openclaw_jax.configlib import ConfigError
from openclaw_jax.models.config import ModelConfig, ModelConfigError
from openclaw_jax.models.decoder import Decoder
from openclaw_jax.models.hub import load_pretrained
from openclaw_jax.models.lora import add_lora
from openclaw_jax.models.random_vl import RandomVLError, write_random_vl_model, write_vl_on_text_model
from openclaw_jax.models.tokenizer import tokenizer_by_name
from openclaw_jax.models.weights import save_hf_checkpoint
from openclaw_jax.parallel import multihost
from openclaw_jax.parallel.mesh import make_mesh, shard_model
from openclaw_jax.trainer.loop import Trainer
from openclaw_jax.trainer.people import PerPersonTrainer

log = logging.getLogger("openclaw_jax.train")


@dataclasses.dataclass
class BaseModel:
    model: Any           # the student Decoder, on the mesh (master dtype); handed to the trainer
    tokenizer: Any
    model_dir: str       # what the gateway / eval use to find the tokenizer ("smollm2" or an HF dir)
    hf_config: dict
    config: Any = None   # the student's ModelConfig (stays valid after the trainer takes the model)
    teacher: Any = None  # the frozen initial teacher (compute dtype), from the same files
    mesh: Any = None


def random_base_model(cfg: ExperimentConfig, out_dir: Path) -> None:
    """Create (once) a random HF checkpoint of the configured shape, with tokenizer files."""
    r = cfg.model.random
    tokenizer = tokenizer_by_name(cfg.model.tokenizer)
    if r.vision is not None:   # a Qwen2.5-VL model (models/random_vl.py)
        try:
            vl = write_random_vl_model(r, tokenizer, out_dir)
        except (RandomVLError, ModelConfigError) as exc:
            raise ConfigError(f"model.random.vision: {exc}") from None
        log.info("created random Qwen2.5-VL base model (%s) in %s", vl, out_dir)
        return
    mcfg = ModelConfig(
        family=r.family, vocab_size=tokenizer.vocab_size, hidden_size=r.hidden_size,
        intermediate_size=r.intermediate_size, num_layers=r.num_layers, num_heads=r.num_heads,
        num_kv_heads=r.num_kv_heads, head_dim=r.head_dim, max_position_embeddings=r.max_position_embeddings,
        tie_word_embeddings=r.tie_word_embeddings, qk_norm=r.family == "qwen3", attention_bias=r.family == "qwen2",
        eos_token_id=tuple(tokenizer.eos_token_ids))
    model = Decoder(mcfg, rngs=nnx.Rngs(r.seed))
    save_hf_checkpoint(model, mcfg, out_dir)
    tokenizer.save_pretrained(out_dir)
    log.info("created random %s base model (%s) in %s", r.family, mcfg, out_dir)


def _vision_on_text_base_model(cfg: ExperimentConfig, out_dir: Path) -> None:
    """Create (once) the Qwen2.5-VL of the pretrained text model `model.path` and a random vision tower."""
    tokenizer = tokenizer_by_name(cfg.model.tokenizer)
    text = load_pretrained(cfg.model.path, tokenizer=False)
    try:
        vl = write_vl_on_text_model(text, cfg.model.vision, tokenizer, out_dir, seed=cfg.model.random.seed)
    except (RandomVLError, ModelConfigError) as exc:
        raise ConfigError(f"model.vision: {exc}") from None
    log.info("created a Qwen2.5-VL base model (%s: %s + a random vision tower) in %s", cfg.model.path, vl, out_dir)


def load_base_model(cfg: ExperimentConfig) -> BaseModel:
    """Student (master dtype) and, for `trainer.teacher=initial`, the frozen teacher (compute dtype),
    both read from the same files straight onto the trainer's mesh (no resident base copy)."""
    path = cfg.model.path
    if path == "random" or cfg.model.vision is not None:
        out = Path(cfg.run_dir) / "base_model"
        if jax.process_index() == 0 and not (out / "config.json").exists():
            (random_base_model if path == "random" else _vision_on_text_base_model)(cfg, out)
        multihost.barrier("random_base_model")  # the other processes read what process 0 wrote
        path = str(out)
    mesh = make_mesh((cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp))
    teacher_dtype = cfg.model.dtype if cfg.trainer.teacher == "initial" and cfg.trainer.enabled else None
    loaded = load_pretrained(path, mesh=mesh, dtype=cfg.model.dtype, param_dtype=cfg.model.param_dtype,
                             teacher_dtype=teacher_dtype, remat=cfg.model.remat, attention=cfg.model.attention)
    tokenizer = loaded.tokenizer
    if cfg.model.tokenizer not in ("auto",) and cfg.model.path != "random" and cfg.model.vision is None:
        tokenizer = tokenizer_by_name(cfg.model.tokenizer)
    return BaseModel(loaded.model, tokenizer, path, dict(loaded.hf_config or {}), loaded.config, loaded.teacher,
                     mesh)


def copy_model(model):
    """An independent copy (own buffers) of an NNX model."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda x: x.copy(), state))


def process_local_copy(model):
    """A copy of a (possibly multi-process sharded) model on this process's default device.

    A collective when the model spans processes: every process must call it."""
    if not multihost.is_multiprocess():
        return copy_model(model)
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda x: jnp.asarray(multihost.to_host(x)), state))


def build_trainer(cfg: ExperimentConfig, base: BaseModel):
    """The Trainer around the student (+LoRA) and the frozen teacher on one mesh; takes the models
    out of `base` (the trainer donates their buffers)."""
    mesh = base.mesh if base.mesh is not None else make_mesh((cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tp))
    student, teacher = base.model, base.teacher
    base.model = base.teacher = None
    if teacher is None:
        teacher = load_pretrained(cfg.trainer.teacher, mesh=mesh, dtype=cfg.model.dtype, attention=cfg.model.attention,
                                  tokenizer=False).model
    if cfg.model.lora.enabled:
        if hasattr(student, "vl_cfg"):
            raise ConfigError("model.lora with a Qwen2.5-VL model is not supported yet; set model.lora.enabled=false")
        student = add_lora(student, cfg.model.lora, rngs=nnx.Rngs(cfg.seed + 1))
    student = shard_model(student, mesh)  # places what is not placed yet (LoRA adapters)
    teacher = shard_model(teacher, mesh)
    pad = base.tokenizer.pad_token_id
    # the trainer's tau and teacher batch shape come from the samples' source (the gateway's settings)
    trainer_class = PerPersonTrainer if cfg.trainer.personalize == "per_person" else Trainer
    return trainer_class(cfg, student, teacher, mesh, samples=cfg.sample_spec(), pad_id=int(pad) if pad is not None else 0)
