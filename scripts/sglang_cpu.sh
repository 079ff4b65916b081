#!/usr/bin/env bash
# The real SGLang server (and sglang_router) on CPU, in its own virtual environment.
#
# For the SGLang integration tests (pytest -m sglang) and configs/tiny_sglang_cpu.yaml. GPU nodes
# do not use this script: they install sglang with the `gpu` extra (launch/).
#
#   scripts/sglang_cpu.sh setup                      create the venv once (idempotent, quiet, locked)
#   scripts/sglang_cpu.sh check                      exit 0 when the venv is ready, 1 (and why) if not
#   scripts/sglang_cpu.sh serve --model DIR --port P [more sglang args]
#                                                    an SGLang worker on 127.0.0.1:P (foreground)
#   scripts/sglang_cpu.sh router --port P --worker-urls URL [URL ...]
#                                                    sglang_router on 127.0.0.1:P (foreground)
#   scripts/sglang_cpu.sh wait URL [URL ...]         until each URL answers GET /health with 200
#   scripts/sglang_cpu.sh python [args]              the venv's python (with the CPU kernel stand-in)
#   scripts/sglang_cpu.sh tiny-model [CONFIG [key=value ...]]
#                                                    write the random base model of CONFIG (default
#                                                    configs/tiny_sglang_cpu.yaml) to <run_dir>/base_model
#                                                    with the project's python (python3, or $PYTHON)
#
# The venv lives in <repo>/.venv-sglang (git-ignored; override with SGLANG_CPU_VENV). It holds the
# pinned sglang (whose wheel pulls a CUDA build of torch: it runs fine without a GPU, ~11 GB) and
# sglang-router. The published kernel package (`sglang-kernel`, import name `sgl_kernel`) holds CUDA
# builds only and fails to import without a GPU; `serve`/`python` put tests/sglang_cpu first on
# PYTHONPATH, whose pure-torch `sgl_kernel` stand-in provides the one function SGLang's CPU path
# calls and raises a clear error for any other (test harness only). The same directory's
# sitecustomize.py lets SGLang's LoRA code ask for pinned host memory without a GPU (pinning is a no-op
# there; it changes no value), so workers started with --enable-lora run on CPU too.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SGLANG_CPU_VENV:-$REPO/.venv-sglang}"
STAND_IN="$REPO/tests/sglang_cpu"
REQUIREMENTS=("sglang==0.5.23" "sglang-router==0.3.2")
STAMP="$VENV/.openclaw-sglang-ready"
PY_BIN="${SGLANG_CPU_PYTHON:-python3}"

die() { echo "sglang_cpu.sh: $*" >&2; exit 1; }

usage() { sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

ready() { [[ -f "$STAMP" && "$(cat "$STAMP")" == "${REQUIREMENTS[*]}" && -x "$VENV/bin/python" ]]; }

cmd_check() {
  if ready; then echo "$VENV"; return 0; fi
  echo "sglang_cpu.sh: no ready SGLang venv at $VENV; create it with: bash scripts/sglang_cpu.sh setup" >&2
  return 1
}

cmd_setup() {
  mkdir -p "$(dirname "$VENV")"
  exec 9>"$VENV.lock"
  # a second `setup` (another shell, a parallel job) waits for the first
  if command -v flock >/dev/null; then flock 9; fi
  if ready; then
    echo "SGLang venv ready: $VENV ($(du -sh "$VENV" 2>/dev/null | cut -f1))"
    return 0
  fi
  local log="$VENV.install.log" start=$SECONDS
  rm -rf "$VENV"  # a half-made venv (interrupted install, other pins) is rebuilt from scratch
  # The venv is ~11 GB and pip unpacks its wheels (a CUDA torch among them) beside it: a full disk
  # otherwise fails three slow attempts with only "No space left on device" to show for it.
  local need_gb="${SGLANG_CPU_MIN_FREE_GB:-16}" free_gb
  free_gb=$(df -Pk "$(dirname "$VENV")" | awk 'NR==2 {print int($4 / 1048576)}')
  if [[ -n "$free_gb" && "$free_gb" -lt "$need_gb" ]]; then
    die "only ${free_gb} GB free under $(dirname "$VENV"); the SGLang venv needs about ${need_gb} GB while it \
installs (~11 GB after). Free disk space (old run directories under runs/, pip's cache: pip cache purge) \
or point SGLANG_CPU_VENV at a larger disk."
  fi
  echo "creating the SGLang venv in $VENV (${REQUIREMENTS[*]}; several minutes, ~11 GB; log: $log)"
  "$PY_BIN" -m venv "$VENV" >"$log" 2>&1 || { tail -20 "$log" >&2; die "python -m venv failed (log: $log)"; }
  # sglang pins torch==2.14.1 and pulls its own torchvision: the machine's torch constraint file must
  # not apply inside this separate venv (PIP_CONSTRAINT=/dev/null replaces the configured one).
  # --no-cache-dir: pip's cache would keep a second copy of the ~5 GB of wheels after the install.
  local attempt ok=0
  for attempt in 1 2 3; do
    if PIP_CONSTRAINT=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 \
        "$VENV/bin/python" -m pip install -q --no-cache-dir --progress-bar off "${REQUIREMENTS[@]}" >>"$log" 2>&1; then
      ok=1; break
    fi
    echo "pip install failed (attempt $attempt of 3), retrying" >>"$log"
    sleep $((attempt * 5))
  done
  if [[ $ok != 1 ]]; then
    grep -v "^WARNING: Location" "$log" | tail -30 >&2
    die "pip install ${REQUIREMENTS[*]} failed 3 times (full log: $log)"
  fi
  # Smoke check: sglang imports with the stand-in kernel module first on the path.
  if ! PYTHONPATH="$STAND_IN" SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c \
      "import sgl_kernel, sglang, sglang_router; assert getattr(sgl_kernel, 'STAND_IN', False)" >>"$log" 2>&1; then
    tail -20 "$log" >&2
    die "the new venv cannot import sglang with the CPU kernel stand-in (log: $log)"
  fi
  echo "${REQUIREMENTS[*]}" >"$STAMP"
  echo "SGLang venv ready: $VENV (created in $((SECONDS - start)) s, $(du -sh "$VENV" | cut -f1))"
}

sglang_env() {
  export PYTHONPATH="$STAND_IN${PYTHONPATH:+:$PYTHONPATH}"
  export SGLANG_USE_CPU_ENGINE=1
  # Tiny models: one thread per process keeps several workers from fighting over the cores.
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
}

cmd_python() {
  cmd_check >/dev/null || exit 1
  sglang_env
  exec "$VENV/bin/python" "$@"
}

cmd_serve() {
  local model="" port="" extra=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --model|--model-path) model="$2"; shift 2 ;;
      --port) port="$2"; shift 2 ;;
      *) extra+=("$1"); shift ;;
    esac
  done
  [[ -n "$model" && -n "$port" ]] || die "serve needs --model DIR and --port P (got model='$model' port='$port')"
  [[ -f "$model/config.json" ]] || die "serve: $model has no config.json (an HF checkpoint directory is needed)"
  cmd_check >/dev/null || exit 1
  sglang_env
  exec "$VENV/bin/python" -m sglang.launch_server --model-path "$model" --host 127.0.0.1 --port "$port" \
    --device cpu --attention-backend torch_native --dtype float32 --max-total-tokens 4096 --sleep-on-idle \
    --log-level warning "${extra[@]}"
}

cmd_router() {
  local port="" urls=() extra=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --port) port="$2"; shift 2 ;;
      --worker-urls) shift; while [[ $# -gt 0 && "$1" != --* ]]; do urls+=("$1"); shift; done ;;
      *) extra+=("$1"); shift ;;
    esac
  done
  [[ -n "$port" && ${#urls[@]} -gt 0 ]] || die "router needs --port P and --worker-urls URL [URL ...]"
  cmd_check >/dev/null || exit 1
  exec "$VENV/bin/python" -m sglang_router.launch_router --host 127.0.0.1 --port "$port" \
    --worker-urls "${urls[@]}" "${extra[@]}"
}

cmd_wait() {
  local timeout="${SGLANG_CPU_WAIT_S:-300}" url
  [[ $# -gt 0 ]] || die "wait needs at least one URL"
  for url in "$@"; do
    local deadline=$((SECONDS + timeout))
    until [[ "$(curl -s -o /dev/null -w '%{http_code}' "${url%/}/health" || true)" == 200 ]]; do
      [[ $SECONDS -lt $deadline ]] || die "$url did not answer /health with 200 within ${timeout}s"
      sleep 1
    done
    echo "healthy: $url"
  done
}

cmd_tiny_model() {
  local config="${1:-$REPO/configs/tiny_sglang_cpu.yaml}"
  [[ $# -gt 0 ]] && shift
  # The project's own code writes the model (config.json, safetensors, tokenizer files), exactly as
  # `python -m openclaw_jax.train` would for model.path=random; the run then loads this directory.
  "${PYTHON:-python3}" - "$config" "$@" <<'PY'
import sys
from pathlib import Path
from openclaw_jax.config import load_experiment_config
from openclaw_jax.train import load_base_model
cfg = load_experiment_config([sys.argv[1]], sys.argv[2:])
out = Path(cfg.model.path)
if (out / "config.json").exists():
    print(f"base model already there: {out}")
    sys.exit(0)
if out != Path(cfg.run_dir) / "base_model":
    sys.exit(f"tiny-model writes <run_dir>/base_model, but model.path={cfg.model.path!r}; set model.path to "
             f"{Path(cfg.run_dir) / 'base_model'}")
load_base_model(load_experiment_config([sys.argv[1]], [*sys.argv[2:], "model.path=random"]))
print(f"wrote the random base model to {out}")
PY
}

case "${1:-}" in
  setup) shift; cmd_setup "$@" ;;
  check) shift; cmd_check "$@" ;;
  serve) shift; cmd_serve "$@" ;;
  router) shift; cmd_router "$@" ;;
  wait) shift; cmd_wait "$@" ;;
  python) shift; cmd_python "$@" ;;
  tiny-model) shift; cmd_tiny_model "$@" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
