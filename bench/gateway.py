"""Gateway benchmark: added latency over calling the policy server directly, and throughput.

    python bench/gateway.py                      # fast fake SGLang worker (isolates gateway overhead)
    python bench/gateway.py --embedded MODEL_DIR # the embedded JAX server on a real/tiny model
    python bench/gateway.py --policy-url URL     # any running SGLang-compatible worker
    python bench/gateway.py --embedded random --weight-sync   # + latency with a weight sync every second

Every server is a separate process: the worker, and the gateway (`python -m
openclaw_jax.gateway`, rule judge, a temporary sample store, so recording, judging and the
fsynced appends are part of what is measured). The load generator is this process.

1. Latency: ``--requests`` sequential requests, alternating (a) ``POST /generate`` on the
   worker with the prompt ids the gateway would send and (b) the same conversation through
   the gateway's ``/v1/chat/completions`` as a main turn. Added latency = gateway - direct,
   at p50 and p99.
2. Throughput: ``--sessions`` (100) concurrent sessions, each ``--turns`` main turns (every
   request is the next state of the previous turn, so the judge and the store work too);
   requests/s, latency percentiles, samples stored; and the same load sent directly to the
   worker for comparison.
3. With ``--weight-sync`` (embedded server only): request latency through the gateway under
   ``--sync-sessions`` concurrent sessions for ``--sync-seconds``, first without weight updates,
   then with ``/update_weights_from_disk`` every ``--sync-interval`` seconds (serving must not
   pause: p99 with syncs / p99 without is the number to watch).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- fake worker
def serve_fake_worker(port: int, vocab: int, out_tokens: int) -> None:
    """A minimal SGLang `/generate` (non-streaming) with a fixed number of output tokens."""
    from aiohttp import web

    async def generate(request: web.Request) -> web.Response:
        payload = await request.json()
        rng = random.Random(len(payload.get("input_ids") or []))
        ids = [rng.randrange(97, 123) for _ in range(out_tokens)]
        lps = [-rng.random() for _ in ids]
        meta = {"id": "b", "finish_reason": {"type": "length", "length": out_tokens},
                "prompt_tokens": len(payload.get("input_ids") or []), "completion_tokens": len(ids),
                "cached_tokens": 0, "weight_version": "0", "e2e_latency": 0.0,
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)]}
        return web.json_response({"text": "".join(chr(t) for t in ids), "output_ids": ids, "meta_info": meta})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=lambda *a: print(f"READY http://127.0.0.1:{port}", flush=True),
                access_log=None)


# ----------------------------------------------------------------------------- processes
def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], marker: str, timeout_s: float = 300.0) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if marker in line:
            return proc, line.strip().split()[-1]
    proc.kill()
    raise RuntimeError(f"{cmd[:4]} did not start (no {marker!r} line)")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


# ----------------------------------------------------------------------------- measurements
def conversation(i: int, turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"Question {i}: what is {i} + {i}?"}]
    for t in range(turns):
        msgs += [{"role": "assistant", "content": f"It is {2 * i}, I think ({t})."},
                 {"role": "user", "content": "Thanks, perfect!" if t % 2 else "No, that's wrong. You should check."}]
    return msgs


def direct_payload(tokenizer, ids: list[int], max_tokens: int, temperature: float) -> dict:
    """Exactly what the gateway sends to the worker for a main turn (same work on both paths)."""
    return {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 0, "logprob_start_len": -1,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": temperature, "top_p": 1.0,
                                "top_k": -1, "skip_special_tokens": True,
                                "stop_token_ids": sorted(set(tokenizer.eos_token_ids))}}


async def latency(gw_url: str, worker_url: str, tokenizer, n: int, max_tokens: int, temperature: float):
    direct, via_gateway = [], []
    async with aiohttp.ClientSession() as http:
        for i in range(n + 10):  # the first 10 of each are warm-up
            msgs = conversation(i, i % 4)
            ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
            t0 = time.perf_counter()
            async with http.post(worker_url + "/generate",
                                 json=direct_payload(tokenizer, ids, max_tokens, temperature)) as r:
                await r.read()
                assert r.status == 200, r.status
            t1 = time.perf_counter()
            async with http.post(gw_url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": max_tokens},
                                 headers={"X-Session-Id": f"lat{i}", "X-Turn-Type": "main"}) as r:
                await r.read()
                assert r.status == 200, r.status
            t2 = time.perf_counter()
            if i >= 10:
                direct.append((t1 - t0) * 1e3)
                via_gateway.append((t2 - t1) * 1e3)
    return direct, via_gateway


async def throughput(url: str, sessions: int, turns: int, max_tokens: int, direct_tokenizer=None):
    """`sessions` concurrent sessions of `turns` sequential requests each; via the gateway unless
    `direct_tokenizer` is given (then /generate on the worker with the same prompts)."""
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=sessions + 10)

    async def one_session(http, k: int):
        for t in range(turns):
            msgs = conversation(k, t)
            t0 = time.perf_counter()
            if direct_tokenizer is None:
                async with http.post(url + "/v1/chat/completions", json={"messages": msgs, "max_tokens": max_tokens},
                                     headers={"X-Session-Id": f"tp{k}", "X-Turn-Type": "main"}) as r:
                    await r.read()
                    assert r.status == 200, (r.status, await r.text())
            else:
                ids = direct_tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
                async with http.post(url + "/generate", json=direct_payload(direct_tokenizer, ids, max_tokens,
                                                                           temperature=1.0)) as r:
                    await r.read()
                    assert r.status == 200, r.status
            latencies.append((time.perf_counter() - t0) * 1e3)

    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(one_session(http, k) for k in range(sessions)))
        elapsed = time.perf_counter() - t0
    return len(latencies) / elapsed, latencies, elapsed


async def latency_under_syncs(gw_url: str, worker_url: str, model_dir: str, sessions: int, seconds: float,
                              interval: float | None, max_tokens: int) -> tuple[list[float], int]:
    """Latencies of main turns from `sessions` concurrent sessions for `seconds`; with `interval`,
    a weight update (same files, a new version) is sent to the worker every `interval` seconds."""
    latencies: list[float] = []
    syncs = 0
    deadline = time.perf_counter() + seconds

    async def session(http, k: int):
        t = 0
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            async with http.post(gw_url + "/v1/chat/completions",
                                 json={"messages": conversation(k, t % 3), "max_tokens": max_tokens},
                                 headers={"X-Session-Id": f"sync{k}-{t // 3}", "X-Turn-Type": "side"}) as r:
                await r.read()
                assert r.status == 200, (r.status, await r.text())
            latencies.append((time.perf_counter() - t0) * 1e3)
            t += 1

    async def updater(http):
        nonlocal syncs
        while time.perf_counter() < deadline:
            await asyncio.sleep(interval)
            async with http.post(worker_url + "/update_weights_from_disk",
                                 json={"model_path": model_dir, "weight_version": f"sync{syncs}"}) as r:
                body = await r.json()
                assert r.status == 200 and body["success"], body
            syncs += 1

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        tasks = [session(http, k) for k in range(sessions)]
        if interval:
            tasks.append(updater(http))
        await asyncio.gather(*tasks)
    return latencies, syncs


def make_random_model(out_dir: str, hidden: int = 256, layers: int = 4) -> str:
    """A random Qwen3-shaped HF checkpoint with the tiny test tokenizer (bigger than the tests')."""
    from flax import nnx

    from openclaw_jax.models.config import ModelConfig
    from openclaw_jax.models.decoder import Decoder
    from openclaw_jax.models.tokenizer import tiny_test_tokenizer
    from openclaw_jax.models.weights import save_hf_checkpoint

    tok = tiny_test_tokenizer()
    cfg = ModelConfig(family="qwen3", vocab_size=tok.vocab_size, hidden_size=hidden, intermediate_size=4 * hidden,
                      num_layers=layers, num_heads=8, num_kv_heads=4, head_dim=hidden // 8, qk_norm=True,
                      max_position_embeddings=2048, eos_token_id=tuple(tok.eos_token_ids))
    save_hf_checkpoint(Decoder(cfg, rngs=nnx.Rngs(0)), cfg, out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


async def store_count(gw_url: str) -> int:
    async with aiohttp.ClientSession() as http:
        async with http.get(gw_url + "/healthz") as r:
            body = await r.json()
    return body["store"]["samples"]


async def wait_for_judgements(gw_url: str, timeout_s: float = 120.0) -> None:
    deadline = time.time() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.time() < deadline:
            async with http.get(gw_url + "/healthz") as r:
                body = await r.json()
            if body["queued_judgements"] == 0 and body["running_judgements"] == 0:
                return
            await asyncio.sleep(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--policy-url", help="an already running SGLang-compatible worker")
    src.add_argument("--embedded", metavar="MODEL_DIR", help="start the embedded JAX server on this HF model dir")
    ap.add_argument("--model", default="tiny", help="gateway tokenizer/template (with the fake worker: tiny)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--fake-out-tokens", type=int, default=8)
    ap.add_argument("--weight-sync", action="store_true",
                    help="with --embedded: latency with and without a weight update every --sync-interval s")
    ap.add_argument("--sync-sessions", type=int, default=8)
    ap.add_argument("--sync-seconds", type=float, default=30.0)
    ap.add_argument("--sync-interval", type=float, default=1.0)
    ap.add_argument("--skip-throughput", action="store_true", help="only the latency sections")
    ap.add_argument("--serve-fake-worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_fake_worker:
        serve_fake_worker(args.serve_fake_worker, 320, args.fake_out_tokens)
        return 0

    sys.path.insert(0, ROOT)
    from openclaw_jax.models.tokenizer import tokenizer_by_name

    procs = []
    store_dir = tempfile.mkdtemp(prefix="gwbench-")
    try:
        if args.policy_url:
            worker_url, kind = args.policy_url, "external worker"
        elif args.embedded:
            if args.embedded == "random":
                args.embedded = make_random_model(os.path.join(store_dir, "random_model"))
            # the sync measurement reloads the same directory, which the server allows from its weight dirs only
            weight_dir = ["--weight-dir", os.path.dirname(os.path.abspath(args.embedded))] \
                if os.path.isdir(args.embedded) else []
            proc, worker_url = start([sys.executable, "-m", "openclaw_jax.inference", "--model", args.embedded,
                                      "--port", "0", "--log-level", "warning", *weight_dir], "READY")
            procs.append(proc)
            args.model = args.embedded if args.model == "tiny" else args.model
            kind = f"embedded JAX server ({args.embedded})"
        else:
            proc, worker_url = start([sys.executable, os.path.abspath(__file__), "--serve-fake-worker",
                                      str(free_port()), "--fake-out-tokens", str(args.fake_out_tokens)], "READY")
            procs.append(proc)
            kind = f"fake worker ({args.fake_out_tokens} tokens, no compute)"
        proc, gw_url = start([sys.executable, "-m", "openclaw_jax.gateway", "--policy-url", worker_url, "--judge",
                              "rule", "--model", args.model, "--store", store_dir, "--port", "0",
                              "--log-level", "WARNING", "--set", f"pool_max_concurrency={args.sessions + 16}",
                              "--set", "temperature=1.0"], "listening on")
        procs.append(proc)
        tokenizer = tokenizer_by_name(args.model)

        direct, gw = asyncio.run(latency(gw_url, worker_url, tokenizer, args.requests, args.max_tokens, 1.0))
        added = [g - d for g, d in zip(gw, direct)]
        print(f"policy: {kind}; gateway: rule judge, fsynced store; cpus: {os.cpu_count()}")
        print(f"latency over {args.requests} sequential requests (ms):")
        print(f"  direct /generate       p50 {pct(direct, 50):7.2f}  p99 {pct(direct, 99):7.2f}")
        print(f"  via gateway            p50 {pct(gw, 50):7.2f}  p99 {pct(gw, 99):7.2f}")
        print(f"  added by the gateway   p50 {pct(gw, 50) - pct(direct, 50):7.2f}  p99 {pct(gw, 99) - pct(direct, 99):7.2f}"
              f"   (paired differences: p50 {pct(added, 50):.2f}, p99 {pct(added, 99):.2f}, "
              f"mean {statistics.mean(added):.2f})")

        if args.weight_sync:
            if not args.embedded:
                raise SystemExit("--weight-sync needs --embedded (a worker whose weights this benchmark may update)")
            # warm-up, untimed: compiles the batch/length buckets and exercises the update path once
            asyncio.run(latency_under_syncs(gw_url, worker_url, args.embedded, args.sync_sessions,
                                            args.sync_seconds, args.sync_interval, args.max_tokens))
            base, _ = asyncio.run(latency_under_syncs(gw_url, worker_url, args.embedded, args.sync_sessions,
                                                      args.sync_seconds, None, args.max_tokens))
            synced, n_syncs = asyncio.run(latency_under_syncs(gw_url, worker_url, args.embedded, args.sync_sessions,
                                                              args.sync_seconds, args.sync_interval, args.max_tokens))
            print(f"latency under weight syncs, {args.sync_sessions} concurrent sessions, {args.sync_seconds:.0f} s "
                  f"each (ms):")
            print(f"  no syncs               p50 {pct(base, 50):7.1f}  p99 {pct(base, 99):7.1f}   ({len(base)} requests)")
            print(f"  sync every {args.sync_interval:g} s       p50 {pct(synced, 50):7.1f}  p99 {pct(synced, 99):7.1f}"
                  f"   ({len(synced)} requests, {n_syncs} syncs)")
            print(f"  ratio                  p50 {pct(synced, 50) / pct(base, 50):7.2f}  "
                  f"p99 {pct(synced, 99) / pct(base, 99):7.2f}")
        if args.skip_throughput:
            return 0

        # Warm-up at full concurrency (a JAX worker compiles its batch/length buckets here), untimed.
        asyncio.run(throughput(worker_url, args.sessions, args.turns, args.max_tokens, direct_tokenizer=tokenizer))
        asyncio.run(wait_for_judgements(gw_url))
        before = asyncio.run(store_count(gw_url))
        rps, lats, elapsed = asyncio.run(throughput(gw_url, args.sessions, args.turns, args.max_tokens))
        asyncio.run(wait_for_judgements(gw_url))
        stored = asyncio.run(store_count(gw_url)) - before
        drps, dlats, _ = asyncio.run(throughput(worker_url, args.sessions, args.turns, args.max_tokens,
                                                direct_tokenizer=tokenizer))
        n = args.sessions * args.turns
        print(f"throughput, {args.sessions} concurrent sessions x {args.turns} main turns ({n} requests):")
        print(f"  via gateway   {rps:8.1f} req/s   latency p50 {pct(lats, 50):7.1f} ms  p99 {pct(lats, 99):7.1f} ms"
              f"   samples stored: {stored} (expected {args.sessions * (args.turns - 1)})")
        print(f"  direct        {drps:8.1f} req/s   latency p50 {pct(dlats, 50):7.1f} ms  p99 {pct(dlats, 99):7.1f} ms")
    finally:
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(store_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
