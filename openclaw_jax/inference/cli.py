"""The embedded server's command line: ``python -m openclaw_jax.inference --help``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Sequence

from aiohttp import web

from openclaw_jax.compile_cache import AUTO, enable_compile_cache
from openclaw_jax.inference.engine import Engine, EngineConfig
from openclaw_jax.inference.loading import context_length_from, load_for_serving, load_vl_for_serving
from openclaw_jax.inference.vision import VisionGenerator
from openclaw_jax.inference.server import API_KEY_ENV, InferenceServer, check_exposure
from openclaw_jax.http import http_guard as G
from openclaw_jax.http.offload import freeze_startup_heap, return_large_blocks_to_the_os
from openclaw_jax.logs import configure_logging
from openclaw_jax.models.config import LORA_TARGETS
from openclaw_jax.wire.images import ImageLimits

logger = logging.getLogger(__name__)


def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m openclaw_jax.inference",
                                 description="SGLang-compatible server around the JAX engine")
    ap.add_argument("--model", "--model-path", dest="model", required=True,
                    help="an HF checkpoint directory (config.json, safetensors, tokenizer.json) or 'smollm2'")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000, help="0 picks a free port (printed on stdout)")
    ap.add_argument("--context-length", type=int, default=None, help="default: from the model config")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--api-key", default=None,
                    help=f"require 'Authorization: Bearer <key>' on every route but /health (default: ${API_KEY_ENV}); "
                         "required when --host is not a loopback address")
    ap.add_argument("--weight-dir", action="append", default=[], metavar="DIR",
                    help="a directory /update_weights_from_disk may load from (repeatable; none: weight updates over "
                         "HTTP are refused)")
    ap.add_argument("--weight-version", default="default")
    ap.add_argument("--dtype", default=None, choices=[None, "float32", "bfloat16"])
    ap.add_argument("--max-running-requests", type=int, default=16, help="largest decode batch")
    ap.add_argument("--min-prompt-bucket", type=int, default=16)
    ap.add_argument("--min-cache-bucket", type=int, default=64)
    ap.add_argument("--min-batch-bucket", type=int, default=1)
    ap.add_argument("--min-prefill-rows", type=int, default=0,
                    help="smallest prefill call in rows (0: --min-batch-bucket)")
    ap.add_argument("--max-prefill-rows", type=int, default=0,
                    help="at most this many prompts per prefill call (0: as many as fit)")
    ap.add_argument("--kv-cache-budget-gb", type=float, default=2.0)
    ap.add_argument("--prefix-cache-mb", type=float, default=1024.0,
                    help="memory for K/V of cached prompt prefixes (system prompt, earlier turns); 0: off")
    ap.add_argument("--prefix-refresh-tokens", type=int, default=EngineConfig.prefix_refresh_tokens,
                    help="at a weight update, the most recently used cached prefixes holding up to this many tokens "
                         "are recomputed with the new weights before they serve (0: the update empties the cache)")
    ap.add_argument("--prefix-refresh-entries", type=int, default=EngineConfig.prefix_refresh_entries,
                    help="at most this many prefixes (sessions) recomputed per weight update (0: none)")
    ap.add_argument("--prefix-refresh-wait", type=float, default=EngineConfig.prefix_refresh_wait_s,
                    help="seconds the refresh waits at most, before each prefix it recomputes, for no request to run")
    ap.add_argument("--prefix-refresh-chunk", type=int, default=EngineConfig.prefix_refresh_chunk_tokens,
                    help="the refresh recomputes a prefix this many tokens at a time (whole blocks), waiting before "
                         "each chunk: a turn that arrives shares the CPU with the rest of one chunk at most")
    lora = ap.add_argument_group("per-person LoRA adapters (a request names its adapter in lora_path)")
    lora.add_argument("--lora-slots", type=int, default=0,
                      help="adapters resident at once, least recently used evicted (0: serve the base model only)")
    lora.add_argument("--lora-max-rank", type=int, default=16, help="largest adapter rank (smaller ones are padded)")
    lora.add_argument("--lora-targets", type=_names, default=LORA_TARGETS,
                      help="projections adapters may adapt, comma-separated (default: all)")
    lora.add_argument("--lora-dir", default=None,
                      help="directory of adapters, one per person in PEFT's layout: DIR/<person>/adapter_config.json + "
                           "adapter_model.safetensors")
    ap.add_argument("--no-compile-ahead", dest="compile_ahead", action="store_false",
                    help="do not compile, in idle time, the prefill / extend shapes the next turns and the next weight "
                         "swap's recompute will call (they then compile when first called)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--compile-cache-dir", default=AUTO,
                    help="JAX's persistent compilation cache ('auto': ~/.cache/openclaw_jax/xla; '': off; "
                         "JAX_COMPILATION_CACHE_DIR wins)")
    ap.add_argument("--shutdown-timeout", type=float, default=30.0)
    ap.add_argument("--log-level", default="info")
    limits = G.add_cli_arguments(ap)
    limits.add_argument("--max-text-chars", type=int, default=None,
                        help="longest text/prompt/messages in characters (400 before tokenizing; default: the most "
                             "characters that could fit the context length in any tokenization)")
    limits.add_argument("--max-request-tokens", type=int, default=None,
                        help="most prompt + completion tokens over all sequences of one request (400; default: "
                             "1024 x the context length)")
    d = ImageLimits()
    limits.add_argument("--max-image-pixels", type=int, default=d.max_image_pixels,
                        help="largest image, width x height from its header (400 before decoding)")
    limits.add_argument("--max-images-per-request", type=int, default=d.max_images, help="most images in a request")
    limits.add_argument("--max-request-image-pixels", type=int, default=d.max_total_pixels,
                        help="most image pixels in a request, summed")
    return ap


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names."""
    return tuple(t.strip() for t in text.split(",") if t.strip())


def engine_config_from(args: argparse.Namespace) -> EngineConfig:
    """The engine's settings from the parsed flags."""
    return EngineConfig(max_batch_size=args.max_running_requests, min_prompt_bucket=args.min_prompt_bucket,
                        min_cache_bucket=args.min_cache_bucket, min_batch_bucket=args.min_batch_bucket,
                        min_prefill_rows=args.min_prefill_rows, max_prefill_rows=args.max_prefill_rows,
                        kv_cache_budget_bytes=int(args.kv_cache_budget_gb * (1 << 30)),
                        prefix_cache_bytes=int(args.prefix_cache_mb * (1 << 20)),
                        prefix_refresh_tokens=args.prefix_refresh_tokens,
                        prefix_refresh_entries=args.prefix_refresh_entries,
                        prefix_refresh_wait_s=args.prefix_refresh_wait,
                        prefix_refresh_chunk_tokens=args.prefix_refresh_chunk, compile_ahead=args.compile_ahead,
                        lora_slots=args.lora_slots, lora_max_rank=args.lora_max_rank, lora_targets=args.lora_targets,
                        lora_dir=args.lora_dir)


def image_limits_from(args: argparse.Namespace) -> ImageLimits:
    return ImageLimits(max_image_pixels=args.max_image_pixels, max_images=args.max_images_per_request,
                       max_total_pixels=args.max_request_image_pixels, max_total_bytes=args.max_body_bytes,
                       prefix="--")


def _bind_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def serve(server: InferenceServer, sock: socket.socket, shutdown_timeout: float) -> None:
    return_large_blocks_to_the_os()
    app = server.make_app()
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=shutdown_timeout,
                           **server.guard.runner_kwargs())
    await runner.setup()
    site = G.GuardedSite(runner, sock, server.connections)
    await site.start()
    freeze_startup_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    host, port = sock.getsockname()[:2]
    # One machine-readable line for launchers and tests.
    print(f"READY http://{host}:{port}", flush=True)
    logger.info("serving %s on http://%s:%d", server.state.served_model_name, host, port)
    await stop.wait()
    logger.info("signal received: shutting down gracefully")
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_arg_parser()
    args = ap.parse_args(argv)
    try:
        guard = G.config_from_cli(args)
        for flag in ("max_text_chars", "max_request_tokens"):
            if getattr(args, flag) is not None and getattr(args, flag) < 1:
                raise ValueError(f"--{flag.replace('_', '-')}={getattr(args, flag)} must be >= 1")
        if args.prefix_cache_mb < 0:  # checked here: EngineConfig sees bytes, not the flag's MiB
            raise ValueError(f"--prefix-cache-mb={args.prefix_cache_mb} must be >= 0 (0 turns the prefix cache off)")
        image_limits = image_limits_from(args)
        args.api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
        check_exposure(args.host, args.api_key)
        engine_config = engine_config_from(args)  # EngineConfig checks every engine flag (cache, refresh, rows, adapters)
        if args.lora_dir is not None and not Path(args.lora_dir).is_dir():
            raise ValueError(f"--lora-dir {args.lora_dir}: not a directory")
        for directory in args.weight_dir:
            if not Path(directory).is_dir():
                raise ValueError(f"--weight-dir {directory}: not a directory")
    except ValueError as exc:
        ap.error(str(exc))
    configure_logging(args.log_level)
    enable_compile_cache(args.compile_cache_dir)
    vl = load_vl_for_serving(args.model, dtype=args.dtype)   # a Qwen2.5-VL directory: images served too
    if vl is not None:
        vl_model, tokenizer, hf_config, source = vl
        model = vl_model.language_model
    else:
        model, tokenizer, hf_config, source = load_for_serving(args.model, dtype=args.dtype)
    context_length = context_length_from(hf_config, model.cfg, args.context_length)
    engine = Engine(model, tokenizer, context_length=context_length, weight_version=args.weight_version,
                    seed=args.seed,
                    config=engine_config)
    name = args.served_model_name or (args.model if args.model == "smollm2" else str(Path(args.model).name))
    server = InferenceServer(engine, tokenizer, model_path=source, served_model_name=name, api_key=args.api_key,
                             guard=guard, max_text_chars=args.max_text_chars,
                             max_request_tokens=args.max_request_tokens, weight_dirs=args.weight_dir,
                             image_limits=image_limits)
    if vl is not None:
        server.vision = VisionGenerator(vl_model, weight_version=engine.weight_version,
                                        max_batch=args.max_running_requests)
    sock = _bind_socket(args.host, args.port)
    try:
        asyncio.run(serve(server, sock, args.shutdown_timeout))
    finally:
        engine.shutdown()
    return 0
