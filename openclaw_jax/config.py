"""The experiment config: one typed tree of frozen dataclasses for `python -m openclaw_jax.train`.

Loaded from YAML (`configs/*.yaml`), gin files/bindings, and dotted `key=value` overrides
(see `openclaw_jax.configlib`). Every section validates its own values in `__post_init__`;
the messages name the dotted key, the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from openclaw_jax.configlib import load_config, load_yaml, require
from openclaw_jax.envs.agentic.config import AgenticConfig
from openclaw_jax.envs.config import EnvConfig
from openclaw_jax.gateway.config import GatewayConfig
from openclaw_jax.losses import LossConfig
from openclaw_jax.models.config import LoRAConfig
from openclaw_jax.samples import SampleSpec
from openclaw_jax.serving.config import GateConfig


_require = require


@dataclass(frozen=True)
class RandomVisionConfig:
    """The vision tower of a random Qwen2.5-VL model (`model.random.vision`): its presence makes
    `model.path: random` write a Qwen2.5-VL checkpoint (text decoder of `model.random`'s shape, family
    qwen2) whose image tokens come from the tokenizer (`model.tokenizer: tiny_vl`)."""

    depth: int = 2
    hidden_size: int = 32
    intermediate_size: int = 64
    num_heads: int = 2
    out_hidden_size: int = 0            # must equal model.random.hidden_size (0 = that value)
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    window_size: int = 56               # a multiple of patch_size x spatial_merge_size
    fullatt_block_indexes: tuple[int, ...] = (1,)
    # M-RoPE (temporal, height, width) rotary sections of the text decoder: they sum to head_dim / 2
    # (empty = head_dim/2 split 1/4, 3/8, 3/8 as Qwen2.5-VL's 16/24/24 of 64)
    mrope_section: tuple[int, ...] = ()

    def __post_init__(self):
        key = "model.random.vision"
        for name in ("depth", "hidden_size", "intermediate_size", "num_heads", "patch_size", "spatial_merge_size",
                     "temporal_patch_size", "window_size"):
            _require(getattr(self, name) > 0, f"{key}.{name}={getattr(self, name)} must be > 0")
        _require(self.out_hidden_size >= 0, f"{key}.out_hidden_size={self.out_hidden_size} must be >= 0 "
                                            "(0 = model.random.hidden_size)")
        head = self.hidden_size // self.num_heads
        _require(self.hidden_size % self.num_heads == 0 and head % 4 == 0,
                 f"{key}.hidden_size={self.hidden_size} / num_heads={self.num_heads} must be a whole head_dim "
                 "divisible by 4 (the 2-D rotary positions)")
        unit = self.patch_size * self.spatial_merge_size
        _require(self.window_size % unit == 0, f"{key}.window_size={self.window_size} must be a multiple of "
                                               f"patch_size x spatial_merge_size = {unit}")
        bad = [i for i in self.fullatt_block_indexes if not 0 <= i < self.depth]
        _require(not bad, f"{key}.fullatt_block_indexes={list(self.fullatt_block_indexes)} must lie in "
                          f"[0, depth={self.depth})")
        _require(all(s > 0 for s in self.mrope_section) and len(self.mrope_section) in (0, 3),
                 f"{key}.mrope_section={list(self.mrope_section)} must be three positive sizes "
                 "(temporal, height, width) or empty")

    def sections(self, head_dim: int) -> tuple[int, int, int]:
        """The M-RoPE sections for a text head_dim (validated: they sum to head_dim / 2)."""
        half = head_dim // 2
        if self.mrope_section:
            _require(sum(self.mrope_section) == half,
                     f"model.random.vision.mrope_section={list(self.mrope_section)} sums to "
                     f"{sum(self.mrope_section)}; it must sum to head_dim / 2 = {half}")
            return tuple(self.mrope_section)  # type: ignore[return-value]
        t = max(1, half // 4)
        h = (half - t) // 2
        _require(half >= 3 and h >= 1, f"model.random head_dim={head_dim} is too small for M-RoPE: need >= 6")
        return t, h, half - t - h


@dataclass(frozen=True)
class RandomModelConfig:
    """Shape of a randomly initialised model (tests, `tiny_cpu`): Qwen3-shaped by default; with
    `vision`, a Qwen2.5-VL model (family qwen2, head_dim = hidden_size / num_heads)."""

    family: Literal["llama", "qwen2", "qwen3"] = "qwen3"
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    max_position_embeddings: int = 1024
    tie_word_embeddings: bool = True
    seed: int = 0
    vision: RandomVisionConfig | None = None   # a vision tower: the model is a Qwen2.5-VL

    def __post_init__(self):
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            _require(getattr(self, name) > 0, f"model.random.{name}={getattr(self, name)} must be > 0")
        _require(self.num_heads % self.num_kv_heads == 0,
                 f"model.random.num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        if self.vision is not None:
            v = self.vision
            _require(self.family == "qwen2", f"model.random.family={self.family!r}: a model with model.random.vision "
                                             "is a Qwen2.5-VL, whose text decoder is qwen2; set model.random.family=qwen2")
            _require(self.head_dim * self.num_heads == self.hidden_size,
                     f"model.random.head_dim={self.head_dim} x num_heads={self.num_heads} must equal hidden_size="
                     f"{self.hidden_size} for a Qwen2.5-VL model (its head_dim is hidden_size / num_heads)")
            _require(v.out_hidden_size in (0, self.hidden_size),
                     f"model.random.vision.out_hidden_size={v.out_hidden_size} must equal model.random.hidden_size="
                     f"{self.hidden_size} (the merger feeds the text decoder); leave it 0 for that value")
            v.sections(self.head_dim)


@dataclass(frozen=True)
class ModelSourceConfig:
    """Where the student comes from.

    `path`: an HF checkpoint directory, `smollm2` (the packaged SmolLM2-135M-Instruct GGUF), or
    `random` (a fresh model of shape `random`, with the tokenizer named by `tokenizer`).

    Precision (docs/design.md §12): `param_dtype` is the dtype of the trained master weights and of
    the optimizer state (float32 for real training); `dtype` is the compute dtype the jitted phases
    cast the params to (bfloat16 on GPUs). Norms, softmax, log-probs and losses always run in
    float32. The frozen teacher is held in `dtype`; serving and weight sync get `dtype`;
    checkpoints keep `param_dtype`. `dtype=param_dtype=bfloat16` (pure bfloat16) is possible but
    loses small updates (a 1e-6 step on a 0.02 weight is below bfloat16's spacing).
    """

    path: str = "smollm2"
    # auto (from path) | tiny | qwen3 | smollm2 | tiny_vl / smollm2_vl (+ the vision tokens) | an HF dir
    tokenizer: str = "auto"
    dtype: Literal["float32", "bfloat16"] = "float32"
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    remat: bool = False
    # attention kernel: dense (reference) | blockwise (memory linear in length) | fused (cuDNN, GPU)
    # | auto (fused where it applies, else blockwise); see openclaw_jax/models/attention.py.
    attention: Literal["dense", "blockwise", "fused", "auto"] = "auto"
    random: RandomModelConfig = field(default_factory=RandomModelConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    # a random vision tower in front of the pretrained text model at `path`: the run's base model is
    # the Qwen2.5-VL of both (written once to <run_dir>/base_model; seed model.random.seed)
    vision: RandomVisionConfig | None = None

    def __post_init__(self):
        _require(bool(self.path), "model.path must name an HF directory, 'smollm2' or 'random'")
        if self.vision is not None:
            _require(self.path != "random", "model.vision puts a vision tower on a pretrained text model; with "
                                            "model.path=random use model.random.vision instead")
            _require(self.tokenizer not in ("auto", "tiny", "smollm2", "qwen3"),
                     f"model.vision needs a tokenizer with the vision tokens (<|vision_start|>, <|image_pad|>, ...), "
                     f"not model.tokenizer={self.tokenizer!r}; use smollm2_vl for model.path=smollm2")
            _require(not self.lora.enabled, "model.lora with a vision-language model (model.vision) is not "
                                            "supported yet; set model.lora.enabled=false")
        if self.path == "random":
            _require(self.tokenizer != "auto",
                     "model.tokenizer='auto' cannot be used with model.path=random; use tiny, qwen3, smollm2 or a dir")
            if self.random.vision is not None:
                _require(self.tokenizer != "tiny", "model.random.vision needs a tokenizer with the vision tokens "
                                                   "(<|vision_start|>, <|image_pad|>, ...); use model.tokenizer=tiny_vl")
                _require(not self.lora.enabled, "model.lora with a vision-language model (model.random.vision) is not "
                                                "supported yet; set model.lora.enabled=false")


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh ("data", "fsdp", "tp"); -1 takes the remaining devices."""

    data: int = 1
    fsdp: int = -1
    tp: int = 1

    def __post_init__(self):
        dims = (self.data, self.fsdp, self.tp)
        _require(all(d == -1 or d > 0 for d in dims), f"mesh={dims} entries must be positive or -1")
        _require(sum(d == -1 for d in dims) <= 1, f"mesh={dims} may contain at most one -1")


@dataclass(frozen=True)
class PolicyConfig:
    """The serving pool: the embedded JAX server (in-process) or external SGLang workers."""

    # embedded: the JAX engine in this process; process: the same engine as its own server process, this
    # run's trainer (every thread of its process but the gateway's event loop) at nice `trainer_nice` and its XLA
    # threads in SCHED_IDLE (`trainer_idle`), so serving comes first
    # (runs/policy_process.py); external: SGLang workers (or a router) at `urls`
    mode: Literal["embedded", "process", "external"] = "embedded"
    urls: tuple[str, ...] = ()          # pool entry points (workers or a router)
    worker_urls: tuple[str, ...] = ()   # every worker, for weight updates (a router does not forward them)
    host: str = "127.0.0.1"             # embedded server bind address
    port: int = 0                       # 0 = ephemeral
    max_batch_size: int = 16
    # the embedded engine's shape floors (each distinct shape compiles once; on a CPU a decode-step
    # compile costs as much as hundreds of decode steps): rows of the running batch, its KV-cache slots,
    # the prompt bucket of a prefill
    min_batch_rows: int = 1
    min_cache_len: int = 64
    min_prompt_len: int = 16
    max_prefill_rows: int = 0           # prompts per prefill call (0: no limit; 1: one prefill shape per prompt bucket)
    prefix_cache_mb: int = 1024         # the embedded engine's prefix cache (0 turns it off)
    # at each weight swap the most recently used cached prefixes (the sessions' prompts so far), up to this
    # many tokens and entries, are recomputed with the new weights before they serve; 0: the swap empties it
    prefix_refresh_tokens: int = 8192
    prefix_refresh_entries: int = 8
    prefix_refresh_wait_s: float = 10.0  # before each prefix the refresh recomputes, wait this long at most for no request
    prefix_refresh_chunk_tokens: int = 256  # the refresh recomputes this many tokens at a time, waiting before each chunk
    # mode=process: the trainer's threads that run no Python (XLA's pools, where a step's arithmetic runs) in Linux's
    # SCHED_IDLE class as well: a core only when serving leaves one (cpu_priority.py; its Python threads share the
    # interpreter lock with the gateway and keep the nice value alone). Measured: docs/performance.md
    trainer_idle: bool = True
    trainer_nice: int = 19              # mode=process: the nice value the trainer's threads step down to (0: none)
    context_length: int = 0             # 0 = from the model config
    weight_sync_dir: str = ""           # external / process mode: where HF safetensors are written ("" = <run_dir>/weights)
    request_timeout_s: float = 300.0
    # the policy servers' bearer key (external: the workers' --api-key); empty: the environment's
    # OPENCLAW_POLICY_API_KEY, else none for external workers and a fresh key per run for the embedded and
    # process servers
    api_key: str | None = None
    # trainer.personalize=per_person: the people's LoRA adapters resident in the embedded (or process) engine at
    # once (each slot holds one adapter at model.lora.rank; a person beyond them waits for an idle one, the least
    # recently used is evicted and read again when needed); unused in shared runs
    lora_slots: int = 4

    def __post_init__(self):
        _require(self.lora_slots >= 1, f"policy.lora_slots={self.lora_slots} must be >= 1 (adapters resident at once "
                                       "in a per-person run)")
        if self.mode == "external":
            _require(bool(self.urls), "policy.urls must list at least one worker or router URL when policy.mode=external")
        _require(0 <= self.port < 65536, f"policy.port={self.port} must be in [0, 65535]")
        _require(self.max_batch_size > 0, f"policy.max_batch_size={self.max_batch_size} must be > 0")
        for name in ("min_batch_rows", "min_cache_len", "min_prompt_len"):
            _require(getattr(self, name) > 0, f"policy.{name}={getattr(self, name)} must be > 0")
        _require(self.max_prefill_rows >= 0, f"policy.max_prefill_rows={self.max_prefill_rows} must be >= 0 (0: no limit)")
        _require(self.prefix_cache_mb >= 0, f"policy.prefix_cache_mb={self.prefix_cache_mb} must be >= 0 (0: off)")
        for name in ("prefix_refresh_tokens", "prefix_refresh_entries"):
            _require(getattr(self, name) >= 0, f"policy.{name}={getattr(self, name)} must be >= 0 (0: no refresh)")
        _require(self.prefix_refresh_chunk_tokens >= 1,
                 f"policy.prefix_refresh_chunk_tokens={self.prefix_refresh_chunk_tokens} must be >= 1")
        _require(self.prefix_refresh_wait_s >= 0,
                 f"policy.prefix_refresh_wait_s={self.prefix_refresh_wait_s} must be >= 0 (0: never wait)")
        _require(0 <= self.trainer_nice <= 19, f"policy.trainer_nice={self.trainer_nice} must be a nice value in "
                                               "[0, 19] (0: no change)")


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 1e-5
    warmup_steps: int = 0
    # "constant" after the warm-up, or "cosine": decay to final_lr_ratio * lr at trainer.max_steps
    # (late steps of a short online run then settle the policy instead of moving it as far as the first)
    schedule: Literal["constant", "cosine"] = "constant"
    final_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.98
    eps: float = 1e-8
    grad_clip: float = 1.0

    def __post_init__(self):
        _require(self.lr > 0, f"trainer.optimizer.lr={self.lr} must be > 0")
        _require(self.warmup_steps >= 0, f"trainer.optimizer.warmup_steps={self.warmup_steps} must be >= 0")
        _require(0 <= self.final_lr_ratio <= 1,
                 f"trainer.optimizer.final_lr_ratio={self.final_lr_ratio} must be in [0, 1]")
        _require(0 <= self.b1 < 1 and 0 <= self.b2 < 1, f"trainer.optimizer betas ({self.b1}, {self.b2}) must be in [0, 1)")
        _require(self.grad_clip > 0, f"trainer.optimizer.grad_clip={self.grad_clip} must be > 0")


@dataclass(frozen=True)
class TrainerConfig:
    """The background trainer (docs/design.md §7)."""

    # Keys that moved: the loss is the `loss` section's, tau is the sampling temperature.
    RENAMED_KEYS: ClassVar[dict[str, str]] = {
        "method": "the loss is chosen by loss.name (e.g. loss.name=rl)",
        "top_k": "K of the top-K sets is loss.top_k",
        "temperature": "the trainer's tau is the sampling temperature, gateway.temperature (one temperature "
                       "for sampling and training)",
        "allow_temperature_mismatch": "tau is gateway.temperature, so nothing can mismatch; samples drawn at "
                                      "another temperature are still refused (samples/dropped_temperature)",
        "rollout_batch_size": "renamed trainer.samples_per_step",
    }

    # false: nothing trains; the base model is served and the samples are consumed in the same windows (the
    # sample budget and evaluation steps of a training run), for baselines that learn outside the weights
    # (env.memory: OpenClaw's memory) -- runs/untrained.py
    enabled: bool = True
    max_steps: int = 100
    samples_per_step: int = 4
    chunk_size: int = 128                # response positions per LM-head chunk
    max_seq_len: int = 2048              # longest prompt+response (teacher prompts included)
    min_seq_bucket: int = 64
    min_response_bucket: int = 32
    teacher: str = "initial"             # "initial" (frozen initial student) or an HF checkpoint dir
    # top-level modules of the student held fixed (e.g. [visual]: a Qwen2.5-VL's vision tower and
    # merger); they are served and checkpointed as loaded, and get no gradient or optimizer state
    freeze: tuple[str, ...] = ()
    rl_only_teacher: Literal["unhinted", "none"] = "unhinted"
    # GRPO advantage of a conversation turn: its reward ("none", docs/design.md §6), or the reward minus
    # the mean reward of the step's evaluated turns ("batch_mean"; see trainer/advantages.py)
    reward_baseline: Literal["none", "batch_mean"] = "none"
    # a step whose samples carry no learning signal (every advantage 0, e.g. all corrected under
    # batch_mean, and no hint teacher in the batch) leaves the weights and the optimizer state as they
    # are: otherwise Adam, which scales each update to about the learning rate whatever the gradient's
    # size, turns the KL anchor's gradient alone, however small, into a sizeable step (trainer/step.py)
    skip_steps_without_signal: bool = False
    max_staleness: int = 4               # weight versions; older samples are dropped or corrected
    staleness_mode: Literal["drop", "importance"] = "drop"
    importance_cap: float = 2.0
    sync_every: int = 1                  # push weights to the pool every N steps
    checkpoint_every: int = 1            # orbax checkpoint every N steps (0 = only at the end)
    keep_checkpoints: int = 3
    export_every: int = 0                # HF safetensors export every N steps (0 = only at the end)
    export_dtype: Literal["master", "float32", "bfloat16"] = "master"  # master = model.param_dtype
    micro_batch_size: int = 0            # rows per micro-batch of every phase (0 = the whole batch)
    packing: bool = True                 # several samples per row (segment ids; equal to the unpacked step)
    bucket_quantum: int = 128            # lengths past this are multiples of it, below powers of two (0: all pow2)
    # teacher: a sample's candidates' common prompt prefix once per sample (with a KL anchor the un-hinted
    # prompt rides along: no reference pass); used when a sample can have 2+ candidates
    # (gateway.max_candidates >= 2): OpenClaw's long prompts, short hints
    shared_prefix_teacher: bool = True
    # packing: a prompt prefix common to every sample of a batch (OpenClaw's system prompt, the same for
    # every turn of every session) at least this long runs once per packed row, not once per sample (0: never)
    batch_prefix_min: int = 256
    shape_reuse_slack: float = 0.1       # packing: reuse a compiled batch shape unless a new one saves more slots
    # the old pass read from the train step's own forward, the whole step one program (trainer/fused_step.py):
    # one student forward fewer per step, its activations held through the teacher pass (more memory);
    # not with micro-batches or image batches
    fused_old_pass: bool = False
    # whose adapter a step trains (trainer/people.py, docs/household.md): "shared", one model trained from
    # everyone's samples; "per_person", a LoRA adapter (and its optimizer state) per person on the shared
    # frozen base, each step training each person of the window on that person's samples alone
    personalize: Literal["shared", "per_person"] = "shared"
    log_every: int = 1
    wait_timeout_s: float = 0.0          # stop when no new sample arrives for this long (0 = wait forever)
    store_wait_s: float = 300.0          # multi-host: how long other processes wait for process 0's sample store
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)

    def __post_init__(self):
        _require(self.max_steps >= 0, f"trainer.max_steps={self.max_steps} must be >= 0")
        _require(self.samples_per_step > 0, f"trainer.samples_per_step={self.samples_per_step} must be > 0")
        _require(self.chunk_size > 0, f"trainer.chunk_size={self.chunk_size} must be > 0")
        _require(self.max_seq_len >= self.min_seq_bucket > 0,
                 f"trainer.max_seq_len={self.max_seq_len} must be >= trainer.min_seq_bucket={self.min_seq_bucket} > 0")
        _require(self.bucket_quantum >= 0,
                 f"trainer.bucket_quantum={self.bucket_quantum} must be >= 0 (0: power-of-two buckets only)")
        _require(self.batch_prefix_min >= 0,
                 f"trainer.batch_prefix_min={self.batch_prefix_min} must be >= 0 (0: never share a batch's common prefix)")
        _require(0 <= self.shape_reuse_slack < 1,
                 f"trainer.shape_reuse_slack={self.shape_reuse_slack} must be in [0, 1) (0: always the fewest "
                 "token slots, a new compiled shape whenever that saves any)")
        _require(self.importance_cap > 0, f"trainer.importance_cap={self.importance_cap} must be > 0")
        _require(all(name and "." not in name for name in self.freeze),
                 f"trainer.freeze={list(self.freeze)} must name top-level modules of the model (e.g. [visual])")
        _require(self.sync_every > 0, f"trainer.sync_every={self.sync_every} must be > 0")
        _require(self.max_staleness >= 0, f"trainer.max_staleness={self.max_staleness} must be >= 0")
        _require(self.micro_batch_size >= 0 and (self.micro_batch_size == 0
                                                 or self.samples_per_step % self.micro_batch_size == 0),
                 f"trainer.micro_batch_size={self.micro_batch_size} must be 0 (whole batch) or divide "
                 f"trainer.samples_per_step={self.samples_per_step}")


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything `python -m openclaw_jax.train` runs: see configs/*.yaml for examples."""

    run_dir: str = "runs/default"
    seed: int = 0
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    progress: bool = True                # console progress line
    # JAX's persistent compilation cache ("auto": ~/.cache/openclaw_jax/xla; "": off): a second run of a
    # config loads the programs the first compiled (openclaw_jax/compile_cache.py)
    compile_cache_dir: str = "auto"
    model: ModelSourceConfig = field(default_factory=ModelSourceConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    agentic: AgenticConfig = field(default_factory=AgenticConfig)   # general agentic RL instead of the gateway
    gate: GateConfig = field(default_factory=GateConfig)   # which trained versions are served (serving/gate.py)

    def __post_init__(self):
        _require(bool(self.run_dir), "run_dir must be a directory path")
        _require(self.gateway.temperature > 0,
                 f"gateway.temperature={self.gateway.temperature} must be > 0: it is also the trainer's tau, which "
                 "divides the logits")
        _require(self.loss.kl_coef == 0 or self.trainer.teacher == "initial",
                 f"loss.kl_coef={self.loss.kl_coef} anchors the policy to the frozen initial model, but "
                 f"trainer.teacher={self.trainer.teacher!r} replaces it; use trainer.teacher=initial or loss.kl_coef=0")
        _require(self.trainer.personalize == "shared" or self.model.lora.enabled,
                 "trainer.personalize=per_person trains a LoRA adapter per person on the frozen base, but "
                 "model.lora.enabled=false; set model.lora.enabled=true (and model.lora.rank, model.lora.targets as "
                 "wanted), or trainer.personalize=shared")
        _require(self.trainer.personalize == "shared" or not self.agentic.enabled,
                 "trainer.personalize=per_person trains the people of the gateway's samples; agentic.enabled runs "
                 "have no people: set trainer.personalize=shared")
        _require(self.trainer.personalize == "shared" or not self.gate.enabled,
                 "trainer.personalize=per_person serves each person their own adapter as it trains, with no promotion "
                 "check (the gate decides on shared versions), and the gate would hold out 1 in "
                 f"{self.gate.holdout_every} of each person's turns from training: set gate.enabled=false")
        if self.gate.enabled:
            _require(not self.agentic.enabled, "gate.enabled=true checks candidates on the person's held-out turns "
                                               "from the gateway; agentic.enabled runs have none: set gate.enabled=false")
            _require(self.model.vision is None, "gate.enabled=true scores text decoders; model.vision is set: set "
                                                "gate.enabled=false")
            _require(self.trainer.staleness_mode == "importance",
                     f"gate.enabled=true needs trainer.staleness_mode=importance (it is "
                     f"{self.trainer.staleness_mode!r}): while the gate keeps an older version served, the turns it "
                     "serves are many trainer steps old and `drop` would discard every one of them")

    def sample_spec(self) -> SampleSpec:
        """What the trainer needs to know of the samples' source: they are drawn at `gateway.temperature`
        (the one temperature: the trainer's tau) with at most `gateway.max_candidates` hints. The
        caller hands it to the trainer, which reads no `gateway` setting itself."""
        return SampleSpec(temperature=self.gateway.temperature, max_candidates=self.gateway.max_candidates)


def load_experiment_config(config_files=(), overrides=(), gin_files=(), gin_bindings=()) -> ExperimentConfig:
    """YAML file(s), then gin, then dotted overrides -> a validated ExperimentConfig."""
    return load_config(ExperimentConfig, yaml_files=config_files, gin_files=gin_files,
                       gin_bindings=gin_bindings, overrides=overrides)


def upgrade_run_config(data: dict) -> dict:
    """A run directory's resolved `config.yaml` written before the loss section and the one temperature,
    in today's keys: trainer.method -> loss.name (the weight `rl` / `opd` fixed was
    rewritten then, so it is left to the loss), trainer.top_k -> loss.top_k, trainer.rollout_batch_size
    -> trainer.samples_per_step, loss.ppo_kl_clamp -> loss.log_ratio_clamp; trainer.temperature and
    trainer.allow_temperature_mismatch are dropped (tau is gateway.temperature). Only for reading old
    runs: a config written by hand gets the error naming the new key."""
    trainer, loss = dict(data.get("trainer") or {}), dict(data.get("loss") or {})
    if "method" in trainer:
        loss["name"] = trainer.pop("method")
        fixed = {"rl": "w_opd", "opd": "w_rl"}.get(loss["name"])
        if fixed is not None:
            loss[fixed] = None
    for old, new, target in (("top_k", "top_k", loss), ("rollout_batch_size", "samples_per_step", trainer)):
        if old in trainer:
            target[new] = trainer.pop(old)
    if "ppo_kl_clamp" in loss:
        loss["log_ratio_clamp"] = loss.pop("ppo_kl_clamp")
    trainer.pop("temperature", None)
    trainer.pop("allow_temperature_mismatch", None)
    return {**data, "trainer": trainer, "loss": loss}


def load_run_config(path, overrides=()) -> ExperimentConfig:
    """A run directory's resolved config (`<run_dir>/config.yaml`), from any version (`upgrade_run_config`),
    then dotted overrides."""
    return load_config(ExperimentConfig, base=upgrade_run_config(load_yaml(path)), overrides=overrides)
