"""The references the benchmarks time ours against, on the same weights: HF transformers (PyTorch CPU) and
the real SGLang server on CPU (`scripts/sglang_cpu.sh serve`, its own venv), plus what they share: the
packaged SmolLM2-135M exported once as an HF directory, a median timer, and the ISA each side runs with.

Both references load the weights our `load_pretrained("smollm2")` dequantises from the packaged GGUF:
transformers from that same state dict, SGLang from an HF directory written by `save_hf_checkpoint`.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
SGLANG_SCRIPT = REPO / "scripts" / "sglang_cpu.sh"


def add_sglang_arguments(parser) -> None:
    """--no-sglang and --hf-dir, as every benchmark against the SGLang server takes them."""
    parser.add_argument("--no-sglang", action="store_true", help="skip the SGLang server reference")
    parser.add_argument("--hf-dir", default=os.path.join(tempfile.gettempdir(), "openclaw_bench_smollm2_hf"),
                        help="where the weights are exported for SGLang (reused when present)")


DTYPES = ("float32", "bfloat16")


def add_dtype_argument(parser) -> None:
    """--dtype: the dtype of the weights and matmuls on every side."""
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="weights and matmuls in this dtype on every side (ours: model.dtype, with float32 "
                             "accumulation, norms, softmax and logits; transformers: the torch dtype; SGLang: "
                             "--dtype); default float32")


def served_model(pre, dtype: str):
    """Our model in `dtype` (weights and compute): `pre.model` for float32, else the packaged weights loaded so."""
    if dtype == "float32":
        return pre.model
    from openclaw_jax.models.hub import load_pretrained
    return load_pretrained("smollm2", dtype=dtype, param_dtype=dtype, tokenizer=False).model


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# Idle time before each timed call of `interleaved_medians`. Thread pools keep spinning for a while after a
# call returns (PyTorch's OpenMP threads do), and took the cores from whatever ran next: on the 2-core
# EPYC a 16-row decode step of ours took 57 ms alone, 67-75 ms right after a transformers `generate`, and
# 57 ms again with half a second between them.
SETTLE_S = 0.5


def interleaved_medians(fns: dict[str, Callable[[], Any]], repeats: int,
                        settle_s: float = SETTLE_S) -> dict[str, float]:
    """Median seconds of each function, timed in turn (one call of each per round): on a shared machine
    a burst of other work then falls on every implementation alike rather than on one. Each call starts
    after `settle_s` idle seconds, so none runs beside the spinning threads of the one before."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            time.sleep(settle_s)
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def transformers_model(dtype: str = "float32"):
    """(HF transformers LlamaForCausalLM in `dtype` on the packaged SmolLM2 weights, its HF config dict)."""
    import torch
    import transformers

    from openclaw_jax.models.gguf import gguf_to_hf, smollm2_gguf_path

    hf_config, hf_state = gguf_to_hf(smollm2_gguf_path())
    config = transformers.AutoConfig.for_model(**{k: v for k, v in hf_config.items() if k != "architectures"})
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in hf_state.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model, hf_config


def isa_report() -> dict[str, str]:
    """The vector ISA each side runs with: XLA's cap (`XLA_FLAGS=--xla_cpu_max_isa=...`, else the CPU's best),
    PyTorch's ATen kernels (`ATEN_CPU_CAPABILITY`), and the CPU model and its AVX-512 support."""
    import torch

    cpu_flags, model = set(), "unknown CPU"
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu_flags = set(re.search(r"^flags\s*:\s*(.*)$", info, re.M).group(1).split())
        model = re.search(r"^model name\s*:\s*(.*)$", info, re.M).group(1).strip()
    except (OSError, AttributeError):
        pass
    best = "AVX512" if "avx512f" in cpu_flags else "AVX2" if "avx2" in cpu_flags else "SSE4"
    cap = re.search(r"--xla_cpu_max_isa=(\S+)", os.environ.get("XLA_FLAGS", ""))
    return {"cpu": model, "cpu_best_isa": best,
            "xla_isa": cap.group(1).upper() if cap else f"{best} (no cap)",
            "torch_isa": torch.backends.cpu.get_cpu_capability().upper()}


class SGLangServer:
    """`scripts/sglang_cpu.sh serve` on a free port in its own process group (killed by `stop`)."""

    def __init__(self, model_dir: Path, log_path: Path, threads: int, extra: Sequence[str] = ()):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(["bash", str(SGLANG_SCRIPT), "serve", "--model", str(model_dir),
                                          "--port", str(self.port), *extra], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=str(REPO), env=env, start_new_session=True)

    def wait(self, timeout: float = 600.0) -> None:
        import requests
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang exited with {self.proc.returncode}; log {self.log_path}:\n"
                                   + self.log_path.read_text(errors="replace")[-3000:])
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"SGLang not healthy after {timeout:.0f}s (log {self.log_path})")

    def generate(self, prompts: list[list[int]], n: int) -> list[dict]:
        """One `/generate` request of token-id prompts, greedy, exactly n new tokens; the response objects."""
        import requests
        body = {"input_ids": prompts, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
        resp = requests.post(self.url + "/generate", json=body, timeout=1800)
        resp.raise_for_status()
        outs = resp.json()
        outs = outs if isinstance(outs, list) else [outs]
        assert all(len(o["output_ids"]) == n for o in outs), [len(o["output_ids"]) for o in outs]
        return outs

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


def start_sglang(args, pre, name: str, extra: Sequence[str] = ()) -> tuple["SGLangServer | None", str]:
    """The SGLang server on the exported weights (None and a note when --no-sglang or its venv is missing),
    stopped at exit, also on SIGTERM."""
    if args.no_sglang:
        return None, "SGLang skipped (--no-sglang)"
    if not sglang_ready():
        return None, "SGLang skipped: no CPU venv (bash scripts/sglang_cpu.sh setup)"
    hf_dir = export_hf(pre, Path(args.hf_dir))
    server = SGLangServer(hf_dir, Path(tempfile.gettempdir()) / f"bench_{name}_sglang.log", os.cpu_count() or 1,
                          extra=extra)
    atexit.register(server.stop)  # also when killed with SIGTERM (handler below) or a setup error
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return server, ""


def sglang_ready() -> bool:
    return subprocess.run(["bash", str(SGLANG_SCRIPT), "check"], capture_output=True).returncode == 0


def export_hf(pre, out_dir: Path) -> Path:
    """The served weights as an HF checkpoint directory (config.json + safetensors + tokenizer), once."""
    from openclaw_jax.models.weights import save_hf_checkpoint
    if (out_dir / "config.json").exists():
        return out_dir
    save_hf_checkpoint(pre.model, None, out_dir, extra_config=pre.hf_config)
    pre.tokenizer.save_pretrained(out_dir)
    return out_dir
