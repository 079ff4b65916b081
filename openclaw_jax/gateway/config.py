"""Gateway settings: one frozen dataclass, embeddable in the top-level YAML config.

Every field has a default; `__post_init__` validates and names the key (``gateway.<field>``),
the value and what is allowed. The CLI (`python -m openclaw_jax.gateway`) builds it from
flags and/or a YAML file with the same keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Mapping
from urllib.parse import urlparse

from openclaw_jax.configlib import ConfigError, require
from openclaw_jax.http.http_guard import GuardConfig, is_loopback_host
from openclaw_jax.wire.images import ImageLimits

# Environment variables that supply keys a config leaves unset (`GatewayConfig.with_environment`).
KEY_ENVIRONMENT = {"api_key": "OPENCLAW_GATEWAY_API_KEY", "admin_key": "OPENCLAW_GATEWAY_ADMIN_KEY",
                   "policy_api_key": "OPENCLAW_POLICY_API_KEY"}


def _check_url(key: str, url: str) -> None:
    parsed = urlparse(url)
    require(parsed.scheme in ("http", "https") and bool(parsed.netloc),
             f"{key}={url!r} must be an http(s) URL such as http://127.0.0.1:30000")


@dataclass(frozen=True)
class GatewayConfig:
    """Settings of the OpenAI-compatible gateway, its judge and its sample store."""

    # --- serving
    host: str = "127.0.0.1"                 # bind address; 127.0.0.1 unless told otherwise
    port: int = 8000                        # 0 = an ephemeral port (printed at start-up)
    # Who may call the gateway (docs/security.md; gateway/auth.py). A gateway bound beyond loopback needs
    # api_key or keys_file. The keys also come from the environment (`with_environment`): OPENCLAW_GATEWAY_API_KEY,
    # OPENCLAW_GATEWAY_ADMIN_KEY, OPENCLAW_POLICY_API_KEY, so they need not appear on a command line.
    api_key: str | None = None              # one key shared by every client ("" or null = none)
    keys_file: str = ""                     # YAML/JSON mapping key -> person id: one key per person
    admin_key: str | None = None            # the operator's key: admin routes (rollback, ...)
    policy_api_key: str | None = None       # bearer key sent to the policy and judge pools (their --api-key)
    # Per person (a key of keys_file; with a shared key or none, the X-Person-Id a client sends;
    # gateway/client_limits.py): beyond these, a new session ends that person's own least recently active
    # idle one, a connection gets 429, a request waits for one of the person's own generation slots (keep
    # max_inflight_per_person below pool_max_concurrency, so that others always find room in the pool).
    max_sessions_per_person: int = 1000
    max_connections_per_person: int = 64
    max_inflight_per_person: int = 32
    max_pending_judgements_per_person: int = 512   # beyond this the person's newest scored turn is dropped
    max_body_bytes: int = 8 << 20           # larger request bodies get HTTP 413
    max_json_depth: int = 64                # deeper JSON nesting gets HTTP 400
    body_timeout_s: float = 60.0            # the whole body must arrive within this (else 408)
    header_timeout_s: float = 10.0          # complete request headers within this of connecting (else 408, close)
    keepalive_timeout_s: float = 75.0       # idle keep-alive connections are closed after this
    max_connections: int = 1024             # open connections beyond this get 503 and are closed
    # Longest rendered prompt in tokens (HTTP 400 beyond it); a conversation with more characters
    # than could fit this many tokens in any tokenization is refused before rendering.
    max_prompt_tokens: int = 32768
    model: str = "smollm2"                  # tokenizer + chat template: an HF dir or "smollm2"
    model_name: str = ""                    # id shown in /v1/models ("" = derived from `model`)

    # --- policy pool (SGLang workers, a router, or the embedded server)
    policy_urls: tuple[str, ...] = ()
    worker_urls: tuple[str, ...] = ()       # every worker, for a rollback's weight update (empty = policy_urls)
    request_timeout_s: float = 300.0        # per pool request
    pool_max_concurrency: int = 64
    pool_max_retries: int = 3
    default_max_tokens: int = 1024          # when the request gives no max_tokens
    max_tokens_limit: int = 8192            # larger requested max_tokens are capped to this
    # A main turn asking for fewer new tokens gets HTTP 400 (OpenClaw asks for 1 when its prompt
    # fills its declared contextWindow); 1 turns the check off.
    min_main_turn_tokens: int = 2
    # Sampling of main (trained) turns. The trainer's temperature must equal the rollout's,
    # so by default a client's temperature/top_p only apply to side turns.
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    honor_client_sampling: bool = False

    # --- judge (PRM)
    # model: PRM votes on an SGLang judge pool (`judge_urls`, else the policy pool); openai: the same votes
    # on any OpenAI-compatible chat endpoint (`judge_base_url`, `judge_model`); rule: no model (offline)
    judge: Literal["model", "rule", "openai"] = "model"
    judge_urls: tuple[str, ...] = ()        # empty = judge on the policy pool
    # model: the judge's tokenizer/chat template ("" = same as `model`); openai: the model id to ask
    judge_model: str = ""
    judge_base_url: str = ""                # openai: the endpoint's base URL, e.g. https://api.openai.com/v1
    # openai: the environment variable holding the endpoint's key (the key itself never goes in a config)
    judge_api_key_env: str = "OPENCLAW_JUDGE_API_KEY"
    judge_votes: int = 3                    # m: eval votes and hint votes per scored turn
    judge_temperature: float = 0.6
    judge_max_new_tokens: int = 1024
    judge_timeout_s: float = 300.0
    judge_concurrency: int = 8              # turns judged at once (each runs 2*m pool calls)
    max_pending_judgements: int = 4096      # beyond this, new pairs are dropped (logged)
    max_candidates: int = 3                 # hint candidates kept per sample
    hint_min_chars: int = 10                # an accepted hint is longer than this (stripped)
    judge_hints: bool = True                # False: eval votes only, no hint votes (RL-only training)
    # The judge reads at most this many characters of a next state (the head and the tail of a longer one).
    judge_max_next_state_chars: int = 32768

    # --- images (wire/images.py ImageLimits; the pixel count is read from the header, before decoding)
    max_image_pixels: int = 16_777_216      # width x height of one image (4096 x 4096)
    max_images_per_request: int = 32
    max_request_image_pixels: int = 67_108_864   # summed over a request's images
    # Encoded images of turns waiting for their next state wait on disk (<store_dir>/image-spool), not in
    # memory; beyond these bounds a new turn's images are not kept (the turn is answered, never trained).
    image_spool_bytes: int = 1 << 30
    image_spool_bytes_per_person: int = 256 << 20

    # --- sessions and store
    store_dir: str = "runs/samples"
    session_idle_timeout_s: float = 6 * 3600.0   # idle sessions are ended (unscored turns dropped)
    # A turn-starting notice (our OpenClaw plugin's, as a person's message arrives) asks the policy servers to
    # hold their background work (recomputing prefixes for new weights, compiling ahead) until the turn's
    # request comes, this long at most, while the client builds its prompt (0: notices change nothing)
    turn_notice_hold_s: float = 10.0
    max_sessions: int = 100_000
    shutdown_grace_s: float = 30.0          # on SIGTERM, wait this long for running judgements
    segment_max_bytes: int = 64 << 20
    # The ids of scored turns decide which are held out for the promotion gate (samples/holdout.py): random
    # (None), or a reproducible sequence from this seed (`python -m openclaw_jax.train` passes the run's seed)
    sample_id_seed: int | None = None
    # A failed store write is retried with back-off (up to this many seconds apart) for as long as it
    # fails; meanwhile up to store_queue_max samples wait in memory (more are dropped and counted), and
    # after store_degraded_after_s of failure /healthz says "degraded" and /readyz answers 503.
    store_queue_max: int = 10_000
    store_retry_max_backoff_s: float = 5.0
    store_degraded_after_s: float = 1.0

    def __post_init__(self) -> None:
        require(bool(self.host), "gateway.host must be a bind address such as 127.0.0.1")
        require(0 <= self.port < 65536, f"gateway.port={self.port} must be in [0, 65535] (0 = ephemeral)")
        require(self.max_body_bytes >= 1024,
                 f"gateway.max_body_bytes={self.max_body_bytes} must be >= 1024 (a chat request needs room)")
        try:
            self.guard
        except ValueError as err:
            raise ConfigError(str(err)) from None
        require(self.max_prompt_tokens >= 16, f"gateway.max_prompt_tokens={self.max_prompt_tokens} must be >= 16")
        require(self.store_queue_max >= 1, f"gateway.store_queue_max={self.store_queue_max} must be >= 1")
        require(self.store_retry_max_backoff_s > 0,
                 f"gateway.store_retry_max_backoff_s={self.store_retry_max_backoff_s} must be > 0")
        require(self.store_degraded_after_s >= 0,
                 f"gateway.store_degraded_after_s={self.store_degraded_after_s} must be >= 0")
        require(bool(self.model), "gateway.model must name an HF model directory or 'smollm2'")
        for i, url in enumerate(self.policy_urls):
            _check_url(f"gateway.policy_urls[{i}]", url)
        for i, url in enumerate(self.worker_urls):
            _check_url(f"gateway.worker_urls[{i}]", url)
        for i, url in enumerate(self.judge_urls):
            _check_url(f"gateway.judge_urls[{i}]", url)
        require(self.request_timeout_s > 0, f"gateway.request_timeout_s={self.request_timeout_s} must be > 0")
        require(self.pool_max_concurrency > 0,
                 f"gateway.pool_max_concurrency={self.pool_max_concurrency} must be > 0")
        require(self.pool_max_retries >= 0, f"gateway.pool_max_retries={self.pool_max_retries} must be >= 0")
        require(self.default_max_tokens > 0, f"gateway.default_max_tokens={self.default_max_tokens} must be > 0")
        require(self.max_tokens_limit >= self.default_max_tokens,
                 f"gateway.max_tokens_limit={self.max_tokens_limit} must be >= gateway.default_max_tokens="
                 f"{self.default_max_tokens}")
        require(1 <= self.min_main_turn_tokens <= self.default_max_tokens,
                 f"gateway.min_main_turn_tokens={self.min_main_turn_tokens} must be in [1, gateway.default_max_tokens="
                 f"{self.default_max_tokens}] (1 = no check)")
        require(0 <= self.temperature <= 2, f"gateway.temperature={self.temperature} must be in [0, 2]")
        require(0 < self.top_p <= 1, f"gateway.top_p={self.top_p} must be in (0, 1]")
        require(self.top_k == -1 or self.top_k > 0, f"gateway.top_k={self.top_k} must be -1 (all) or > 0")
        require(self.judge in ("model", "rule", "openai"),
                 f"gateway.judge={self.judge!r} must be 'model', 'rule' or 'openai'")
        if self.judge == "openai":
            require(bool(self.judge_base_url), "gateway.judge=openai needs gateway.judge_base_url, the endpoint's "
                                               "base URL such as https://api.openai.com/v1 or http://127.0.0.1:8080/v1")
            _check_url("gateway.judge_base_url", self.judge_base_url)
            require(bool(self.judge_model), "gateway.judge=openai needs gateway.judge_model, the model id the "
                                            "endpoint serves (e.g. gpt-4.1-mini, or a local server's model name)")
        require(self.judge_votes > 0, f"gateway.judge_votes={self.judge_votes} must be > 0")
        require(0 <= self.judge_temperature <= 2,
                 f"gateway.judge_temperature={self.judge_temperature} must be in [0, 2]")
        require(self.judge_max_new_tokens > 0,
                 f"gateway.judge_max_new_tokens={self.judge_max_new_tokens} must be > 0")
        require(self.judge_timeout_s > 0, f"gateway.judge_timeout_s={self.judge_timeout_s} must be > 0")
        require(self.judge_concurrency > 0, f"gateway.judge_concurrency={self.judge_concurrency} must be > 0")
        require(self.max_pending_judgements > 0,
                 f"gateway.max_pending_judgements={self.max_pending_judgements} must be > 0")
        require(self.max_candidates > 0, f"gateway.max_candidates={self.max_candidates} must be > 0")
        require(self.hint_min_chars >= 0, f"gateway.hint_min_chars={self.hint_min_chars} must be >= 0")
        require(bool(self.store_dir), "gateway.store_dir must name a directory for the sample store")
        require(self.session_idle_timeout_s > 0,
                 f"gateway.session_idle_timeout_s={self.session_idle_timeout_s} must be > 0")
        require(0 <= self.turn_notice_hold_s <= 600,
                 f"gateway.turn_notice_hold_s={self.turn_notice_hold_s} must be between 0 and 600 seconds")
        require(self.max_sessions > 0, f"gateway.max_sessions={self.max_sessions} must be > 0")
        require(self.shutdown_grace_s >= 0, f"gateway.shutdown_grace_s={self.shutdown_grace_s} must be >= 0")
        require(self.segment_max_bytes >= 1 << 16,
                 f"gateway.segment_max_bytes={self.segment_max_bytes} must be >= 65536")
        for name in ("max_sessions_per_person", "max_connections_per_person", "max_inflight_per_person",
                     "max_pending_judgements_per_person", "max_images_per_request", "max_image_pixels",
                     "max_request_image_pixels", "image_spool_bytes", "image_spool_bytes_per_person"):
            require(getattr(self, name) >= 1, f"gateway.{name}={getattr(self, name)} must be >= 1")
        require(self.judge_max_next_state_chars >= 256,
                 f"gateway.judge_max_next_state_chars={self.judge_max_next_state_chars} must be >= 256")
        require(self.max_request_image_pixels >= self.max_image_pixels,
                 f"gateway.max_request_image_pixels={self.max_request_image_pixels} must be >= "
                 f"gateway.max_image_pixels={self.max_image_pixels}")

    @property
    def guard(self) -> GuardConfig:
        """The HTTP limits (body, JSON depth, timeouts, connections) as the shared guard's config."""
        return GuardConfig(max_body_bytes=self.max_body_bytes, body_timeout_s=self.body_timeout_s,
                           max_json_depth=self.max_json_depth, header_timeout_s=self.header_timeout_s,
                           keepalive_timeout_s=self.keepalive_timeout_s, max_connections=self.max_connections,
                           prefix="gateway")

    @property
    def image_limits(self) -> ImageLimits:
        return ImageLimits(max_image_pixels=self.max_image_pixels, max_images=self.max_images_per_request,
                           max_total_pixels=self.max_request_image_pixels, max_total_bytes=self.max_body_bytes,
                           prefix="gateway")

    def with_environment(self, environ: Mapping[str, str]) -> "GatewayConfig":
        """The keys left unset here taken from the environment (see ``KEY_ENVIRONMENT``)."""
        changes = {field: environ[var] for field, var in KEY_ENVIRONMENT.items()
                   if not getattr(self, field) and environ.get(var)}
        return self.replace(**changes) if changes else self

    def check_exposure(self) -> None:
        """A gateway reachable from other machines must check keys: ConfigError otherwise."""
        if not is_loopback_host(self.host) and not (self.api_key or self.keys_file):
            raise ConfigError(f"gateway.host={self.host!r} is reachable from other machines, and the gateway has no "
                              "client key: set gateway.keys_file (one key per person) or gateway.api_key (or "
                              f"{KEY_ENVIRONMENT['api_key']}), or bind 127.0.0.1")

    @property
    def judge_pool_urls(self) -> tuple[str, ...]:
        return self.judge_urls or self.policy_urls

    @property
    def served_model_name(self) -> str:
        if self.model_name:
            return self.model_name
        return self.model.rstrip("/").rsplit("/", 1)[-1] or self.model

    def replace(self, **changes: Any) -> "GatewayConfig":
        return dataclasses.replace(self, **changes)
