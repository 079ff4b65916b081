# shellcheck shell=bash
# Globals set here are read by the scripts that source this file:
# shellcheck disable=SC2034
# Shared functions for launch/single_node.sh and launch/multi_node.sh (sourced, never run).
#
# What lives here: logging, the settings registry (every size comes from an environment
# variable with a printed default), GPU-split planning, the commands of each component
# (SGLang worker, sglang_router, trainer), prerequisite checks, starting components in their
# own process groups with a log file each, waiting for /health, and stopping on exit only
# the process groups this script started.
#
# Dry-run output (stdout) is one line per action, meant for people and for tests:
#   [dry-run] check: <what a real run would verify>
#   [dry-run] run <name> (log <file>): env VAR=value ... <argv>
#   [dry-run] wait <name> <url> (timeout <s>s)
# The part after "run ...: " is a valid shell command line.

if ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 4))); then
    echo "ERROR: bash >= 4.4 is required (this is bash ${BASH_VERSION}); install a newer bash" >&2
    exit 1
fi

command -v awk >/dev/null 2>&1 || { echo "ERROR: awk not found on PATH (the launch scripts use it for arithmetic)" >&2; exit 1; }

LAUNCH_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LAUNCH_NAME=${LAUNCH_NAME:-launch}
DRY_RUN=0
# Extra `key=value` trainer overrides given on the command line.
TRAINER_OVERRIDES=()

# Outputs of plan_gpu_split, read by the launch scripts.
TRAINER_DEVICES=""
POLICY_WORKER_DEVICES=()
PRM_WORKER_DEVICES=()

# Process groups this script started (the leader's PID is the group id), in start order.
STARTED_PIDS=()
STARTED_NAMES=()
STARTED_LOGS=()
TRAINER_INDEX=-1
_CLEANUP_DONE=0

# Settings registry: names in declaration order, their help text and where the value came from.
SETTING_NAMES=()
declare -A SETTING_HELP=()
declare -A SETTING_SOURCE=()

# Problems found by the prerequisite checks; all are reported together.
MISSING=()

# ---------------------------------------------------------------------------------- logging

_ts() { date '+%H:%M:%S'; }
log_info() { printf '[%s %s] %s\n' "$(_ts)" "$LAUNCH_NAME" "$*" >&2; }
log_warn() { printf '[%s %s] WARNING: %s\n' "$(_ts)" "$LAUNCH_NAME" "$*" >&2; }
die() {
    printf '[%s %s] ERROR: %s\n' "$(_ts)" "$LAUNCH_NAME" "$*" >&2
    exit 1
}

# Shell-quote words for display: plain words stay as they are, anything else gets single quotes
# (brackets too, so `policy.urls=[...]` is never taken for a glob when the line is pasted).
quote_words() {
    local out=() word
    for word in "$@"; do
        if [[ $word =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then
            out+=("$word")
        else
            out+=("'${word//\'/\'\\\'\'}'")
        fi
    done
    printf '%s' "${out[*]}"
}

# ---------------------------------------------------------------------------------- settings

# setting NAME DEFAULT HELP: NAME keeps its value from the environment when set there (even
# empty), otherwise it gets DEFAULT. Recorded for the settings table and --help.
setting() {
    local name=$1 default=$2 help=$3
    SETTING_NAMES+=("$name")
    SETTING_HELP[$name]=$help
    if [[ -n ${!name+x} ]]; then
        SETTING_SOURCE[$name]="env"
    else
        printf -v "$name" '%s' "$default"
        SETTING_SOURCE[$name]=default
    fi
}

print_settings() {
    local name value
    echo "settings (environment variable = value [source]):"
    for name in "${SETTING_NAMES[@]}"; do
        value=${!name}
        if [[ $name == *_KEY && -n $value ]]; then value="***"; fi  # secrets are never printed
        printf '  %-22s = %-34s [%s] %s\n' "$name" "$value" "${SETTING_SOURCE[$name]}" "${SETTING_HELP[$name]}"
    done
}

require_int() {  # NAME MIN
    local name=$1 min=$2 value=${!1}
    [[ $value =~ ^[0-9]+$ ]] || die "$name='$value' must be a whole number >= $min"
    ((10#$value >= min)) || die "$name=$value must be >= $min"
    printf -v "$name" '%d' "$((10#$value))"
}

require_port() {  # NAME
    require_int "$1" 1
    ((${!1} < 65536)) || die "$1=${!1} must be a TCP port below 65536"
}

require_fraction() {  # NAME: a number in (0, 1)
    local name=$1 value=${!1}
    [[ $value =~ ^[0-9]*\.?[0-9]+$ ]] || die "$name='$value' must be a decimal fraction such as 0.85"
    awk -v x="$value" 'BEGIN { exit !(x > 0 && x < 1) }' || die "$name=$value must be strictly between 0 and 1"
}

require_choice() {  # NAME CHOICE...
    local name=$1 value=${!1} choice
    shift
    for choice in "$@"; do [[ $value == "$choice" ]] && return 0; done
    die "$name='$value' is not allowed; choose one of: $*"
}

# "a b c" -> a,b,c (for CUDA_VISIBLE_DEVICES); join_by SEP WORD...
join_by() {
    local sep=$1 joined="" word
    shift
    for word in "$@"; do joined+="${joined:+$sep}$word"; done
    printf '%s' "$joined"
}

# URL list in YAML flow syntax, one shell word: [http://a:1,http://b:2]
yaml_list() { printf '[%s]' "$(join_by , "$@")"; }

# ------------------------------------------------------------------------------ arguments

# parse_args USAGE_FUNCTION ARGS...: --dry-run, --help, and trainer overrides (key=value, also
# everything after --).
parse_args() {
    local usage_fn=$1 after_dashes=0 arg
    shift
    for arg in "$@"; do
        if ((after_dashes)); then
            TRAINER_OVERRIDES+=("$arg")
            continue
        fi
        case $arg in
            --dry-run | -n) DRY_RUN=1 ;;
            --help | -h)
                "$usage_fn"
                exit 0
                ;;
            --) after_dashes=1 ;;
            -*) die "unknown option '$arg'; see --help" ;;
            *=*) TRAINER_OVERRIDES+=("$arg") ;;
            *) die "unexpected argument '$arg': trainer overrides look like section.key=value; see --help" ;;
        esac
    done
}

# ------------------------------------------------------------------------------- GPU split

# GPU_IDS: the devices this script may hand out. When CUDA_VISIBLE_DEVICES is already set
# (e.g. by a scheduler), its entries are the devices; indices in the split refer to them.
resolve_gpu_ids() {  # COUNT_VAR_NAME
    local count_var=$1
    GPU_IDS=()
    INHERITED_CVD=""
    if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
        INHERITED_CVD=$CUDA_VISIBLE_DEVICES
        IFS=, read -r -a GPU_IDS <<<"$CUDA_VISIBLE_DEVICES"
        if ((${!count_var} > ${#GPU_IDS[@]})); then
            die "$count_var=${!count_var} but CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES (inherited) names only ${#GPU_IDS[@]} devices; lower $count_var or unset CUDA_VISIBLE_DEVICES"
        fi
        GPU_IDS=("${GPU_IDS[@]:0:${!count_var}}")
    else
        local i
        for ((i = 0; i < ${!count_var}; i++)); do GPU_IDS+=("$i"); done
    fi
}

# plan_gpu_split TOTAL_VAR_NAME: from LAYOUT, TRAINER/POLICY/PRM_GPUS and POLICY/PRM_TP, sets
#   TRAINER_DEVICES            comma list for the trainer's CUDA_VISIBLE_DEVICES
#   POLICY_WORKER_DEVICES[i]   comma list per policy worker (POLICY_TP GPUs each)
#   PRM_WORKER_DEVICES[i]      comma list per PRM worker (PRM_TP GPUs each)
# disjoint: trainer, then policy, then PRM GPUs, no GPU shared.
# colocated: the trainer spans every GPU; policy GPUs then PRM GPUs from index 0, so each GPU
# holds the trainer plus at most one SGLang worker.
plan_gpu_split() {
    local total_var=$1 total=${!1} first i
    ((POLICY_GPUS % POLICY_TP == 0)) ||
        die "POLICY_GPUS=$POLICY_GPUS is not a multiple of POLICY_TP=$POLICY_TP (each policy worker uses POLICY_TP GPUs)"
    ((PRM_GPUS % PRM_TP == 0)) ||
        die "PRM_GPUS=$PRM_GPUS is not a multiple of PRM_TP=$PRM_TP (each PRM worker uses PRM_TP GPUs)"
    if [[ $LAYOUT == disjoint ]]; then
        local need=$((TRAINER_GPUS + POLICY_GPUS + PRM_GPUS))
        ((need <= total)) ||
            die "GPU split does not fit: TRAINER_GPUS=$TRAINER_GPUS + POLICY_GPUS=$POLICY_GPUS + PRM_GPUS=$PRM_GPUS = $need > $total_var=$total; lower one of them (LAYOUT=disjoint gives every GPU to one component)"
        ((need == total)) || log_warn "$((total - need)) of $total GPUs are left unused by the split TRAINER_GPUS=$TRAINER_GPUS POLICY_GPUS=$POLICY_GPUS PRM_GPUS=$PRM_GPUS"
        first=$((TRAINER_GPUS))
    else
        ((TRAINER_GPUS == total)) ||
            die "LAYOUT=colocated: the trainer spans all $total_var=$total GPUs, but TRAINER_GPUS=$TRAINER_GPUS; unset TRAINER_GPUS or use LAYOUT=disjoint"
        ((POLICY_GPUS + PRM_GPUS <= total)) ||
            die "GPU split does not fit: POLICY_GPUS=$POLICY_GPUS + PRM_GPUS=$PRM_GPUS = $((POLICY_GPUS + PRM_GPUS)) > $total_var=$total (LAYOUT=colocated puts at most one SGLang worker on each GPU)"
        local sum_policy sum_prm
        sum_policy=$(awk -v a="$TRAINER_MEM_FRACTION" -v b="$POLICY_MEM_FRACTION" 'BEGIN { print a + b }')
        sum_prm=$(awk -v a="$TRAINER_MEM_FRACTION" -v b="$PRM_MEM_FRACTION" 'BEGIN { print a + b }')
        awk -v s="$sum_policy" -v lim="$MEM_FRACTION_LIMIT" 'BEGIN { exit !(s <= lim) }' ||
            die "LAYOUT=colocated: TRAINER_MEM_FRACTION=$TRAINER_MEM_FRACTION + POLICY_MEM_FRACTION=$POLICY_MEM_FRACTION = $sum_policy exceeds MEM_FRACTION_LIMIT=$MEM_FRACTION_LIMIT of each GPU; lower them"
        ((PRM_GPUS == 0)) || awk -v s="$sum_prm" -v lim="$MEM_FRACTION_LIMIT" 'BEGIN { exit !(s <= lim) }' ||
            die "LAYOUT=colocated: TRAINER_MEM_FRACTION=$TRAINER_MEM_FRACTION + PRM_MEM_FRACTION=$PRM_MEM_FRACTION = $sum_prm exceeds MEM_FRACTION_LIMIT=$MEM_FRACTION_LIMIT of each GPU; lower them"
        first=0
    fi
    # colocated: TRAINER_GPUS equals the total, so this is every GPU.
    TRAINER_DEVICES=$(join_by , "${GPU_IDS[@]:0:TRAINER_GPUS}")
    POLICY_WORKER_DEVICES=()
    for ((i = 0; i < POLICY_GPUS / POLICY_TP; i++)); do
        POLICY_WORKER_DEVICES+=("$(join_by , "${GPU_IDS[@]:first + i * POLICY_TP:POLICY_TP}")")
    done
    first=$((first + POLICY_GPUS))
    PRM_WORKER_DEVICES=()
    for ((i = 0; i < PRM_GPUS / PRM_TP; i++)); do
        PRM_WORKER_DEVICES+=("$(join_by , "${GPU_IDS[@]:first + i * PRM_TP:PRM_TP}")")
    done
}

# --------------------------------------------------------------------------- model paths

# An HF hub id looks like owner/name (SGLang downloads it); anything else must be a directory.
is_hf_id() { [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$ ]] && [[ ! -e $1 ]]; }

# --------------------------------------------------------------------------- commands

# Each builder fills the global array CMD with `VAR=value ... argv...` (env assignments first).

# build_sglang_cmd DEVICES MODEL HOST PORT TP MEM_FRACTION EXTRA_ARGS_STRING
build_sglang_cmd() {
    local devices=$1 model=$2 host=$3 port=$4 tp=$5 mem=$6 extra=$7 extra_words=()
    CMD=("CUDA_VISIBLE_DEVICES=$devices" "$PYTHON" -m sglang.launch_server
        --model-path "$model" --host "$host" --port "$port"
        --mem-fraction-static "$mem" --tp-size "$tp" --dtype "$SGLANG_DTYPE" --api-key "$POOL_API_KEY")
    if [[ -n $CONTEXT_LENGTH ]]; then CMD+=(--context-length "$CONTEXT_LENGTH"); fi
    read -r -a extra_words <<<"$SGLANG_EXTRA_ARGS $extra"
    CMD+=("${extra_words[@]}")
}

# build_router_cmd HOST PORT WORKER_URL...
build_router_cmd() {
    local host=$1 port=$2 extra_words=()
    shift 2
    CMD=("$PYTHON" -m sglang_router.launch_router --worker-urls "$@"
        --host "$host" --port "$port" --policy "$ROUTER_POLICY" --api-key "$POOL_API_KEY")
    read -r -a extra_words <<<"$ROUTER_EXTRA_ARGS"
    CMD+=("${extra_words[@]}")
}

# build_trainer_cmd: from the globals TRAINER_ENV (array of VAR=value), ROUTER_URL,
# POLICY_WORKER_URLS, JUDGE_URLS and the settings.
build_trainer_cmd() {
    CMD=("${TRAINER_ENV[@]}" "$PYTHON" -m "$TRAINER_MODULE" --config "$CONFIG"
        "run_dir=$RUN_DIR"
        "model.path=$TRAINER_MODEL_PATH"
        "policy.mode=external"
        "policy.urls=$(yaml_list "$ROUTER_URL")"
        "policy.worker_urls=$(yaml_list "${POLICY_WORKER_URLS[@]}")"
        "policy.weight_sync_dir=$WEIGHT_SYNC_DIR"
        "gateway.judge=model"
        "gateway.judge_urls=$(yaml_list "${JUDGE_URLS[@]}")"
        "mesh.data=$MESH_DATA" "mesh.fsdp=$MESH_FSDP" "mesh.tp=$MESH_TP"
        "gateway.host=$GATEWAY_HOST" "gateway.port=$GATEWAY_PORT")
    if [[ -n $GATEWAY_KEYS_FILE ]]; then CMD+=("gateway.keys_file=$GATEWAY_KEYS_FILE"); fi
    CMD+=("${TRAINER_OVERRIDES[@]}")
}

# ------------------------------------------------------------------------------- keys

# The workers' key reaches the trainer through its environment (OPENCLAW_POLICY_API_KEY), not its
# command line; SGLang and the router only take it as --api-key (redacted in logs and dry runs).
random_key() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }

# ensure_pool_api_key [SHARED_FILE]: POOL_API_KEY from the environment, else from SHARED_FILE (created
# once, mode 600, by whichever node gets there first: every node then uses the same key), else a new one.
ensure_pool_api_key() {
    local shared=${1:-} tmp
    if [[ -n $POOL_API_KEY ]]; then
        :
    elif ((DRY_RUN)); then
        printf '[dry-run] key: POOL_API_KEY is generated%s\n' "${shared:+ (shared through $shared)}"
        POOL_API_KEY=generated
    elif [[ -n $shared ]]; then
        mkdir -p "$(dirname "$shared")" || die "could not create $(dirname "$shared") for the pool key"
        tmp=$(umask 077 && mktemp "$shared.XXXXXX") || die "could not write a pool key next to $shared"
        random_key >"$tmp"
        ln "$tmp" "$shared" 2>/dev/null || true  # atomic: the first node's key wins
        rm -f "$tmp"
        POOL_API_KEY=$(<"$shared")
        [[ -n $POOL_API_KEY ]] || die "the pool key file $shared is empty; delete it and start again"
    else
        POOL_API_KEY=$(random_key)
    fi
    export OPENCLAW_POLICY_API_KEY=$POOL_API_KEY
}

# The gateway refuses to start beyond loopback without a client key: say so before anything starts.
check_gateway_exposure() {
    case $GATEWAY_HOST in
        127.* | localhost | ::1) return 0 ;;
    esac
    [[ -n ${OPENCLAW_GATEWAY_API_KEY:-} || -n $GATEWAY_KEYS_FILE ]] ||
        die "GATEWAY_HOST=$GATEWAY_HOST is reachable from other machines: set GATEWAY_KEYS_FILE (a key per person) or OPENCLAW_GATEWAY_API_KEY (one shared key), or keep GATEWAY_HOST=127.0.0.1"
    if [[ -n $GATEWAY_KEYS_FILE && ! -f $GATEWAY_KEYS_FILE ]]; then die "GATEWAY_KEYS_FILE=$GATEWAY_KEYS_FILE does not exist"; fi
}

# --------------------------------------------------------------------- prerequisite checks

# prereq DESCRIPTION FUNCTION [ARGS...]: in a dry run print what would be checked; otherwise run
# FUNCTION, which appends a message to MISSING when the prerequisite is not there.
prereq() {
    local description=$1
    shift
    if ((DRY_RUN)); then
        printf '[dry-run] check: %s\n' "$description"
    else
        "$@"
    fi
}

report_missing() {
    ((${#MISSING[@]} == 0)) && return 0
    local message="missing prerequisites (nothing was started):" item
    for item in "${MISSING[@]}"; do message+=$'\n'"  - $item"; done
    die "$message"
}

PYTHON_OK=0
check_python() {
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        MISSING+=("python interpreter '$PYTHON' not found (PYTHON=$PYTHON); install Python >= 3.11 or set PYTHON to one")
        return 0
    fi
    if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1; then
        MISSING+=("'$PYTHON' is not a working Python >= 3.11 (PYTHON=$PYTHON)")
        return 0
    fi
    PYTHON_OK=1
}

# check_python_module MODULE HINT
check_python_module() {
    ((PYTHON_OK)) || return 0
    local module=$1 hint=$2
    if ! "$PYTHON" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 1)' \
        "$module" >/dev/null 2>&1; then
        MISSING+=("python module '$module' not importable by '$PYTHON'; $hint")
    fi
}

check_python_modules_all() {
    check_python_module sglang "install the GPU extra: pip install -e '.[gpu]'"
    check_python_module sglang_router "install the GPU extra: pip install -e '.[gpu]' (package sglang-router)"
    check_python_module "$TRAINER_MODULE" "install this project: pip install -e . (or run from the repository root)"
}

warn_if_no_jax_cuda() {
    ((PYTHON_OK)) || return 0
    if ! "$PYTHON" -c 'import importlib.util, sys; sys.exit(0 if any(importlib.util.find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")) else 1)' >/dev/null 2>&1; then
        log_warn "no JAX CUDA plugin found for '$PYTHON': the trainer would run on CPU (pip install -e '.[gpu]')"
    fi
}

check_command() {  # COMMAND WHY
    command -v "$1" >/dev/null 2>&1 || MISSING+=("$1 not found on PATH ($2)")
}

# check_gpus NEEDED: nvidia-smi must list enough GPUs for the split (or every inherited
# CUDA_VISIBLE_DEVICES index must exist).
check_gpus() {
    local needed=$1 listing count id
    if ! command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
        MISSING+=("nvidia-smi not found (NVIDIA_SMI=$NVIDIA_SMI): no NVIDIA driver on this machine? the launch scripts need $needed GPUs")
        return 0
    fi
    if ! listing=$("$NVIDIA_SMI" -L 2>&1); then
        MISSING+=("'$NVIDIA_SMI -L' failed: ${listing//$'\n'/ }")
        return 0
    fi
    count=$(grep -c '^GPU ' <<<"$listing" || true)
    if [[ -n $INHERITED_CVD ]]; then
        for id in "${GPU_IDS[@]}"; do
            if [[ $id =~ ^[0-9]+$ ]] && ((id >= count)); then
                MISSING+=("CUDA_VISIBLE_DEVICES (inherited) names GPU $id but nvidia-smi lists only $count GPUs")
            fi
        done
    elif ((count < needed)); then
        MISSING+=("the split needs $needed GPUs but nvidia-smi lists $count; lower the GPU counts (see --help)")
    fi
}

check_config_file() {
    [[ -f $CONFIG ]] || MISSING+=("trainer config CONFIG=$CONFIG does not exist")
}

# check_model_path VAR_NAME: a directory, or an HF id SGLang can download.
check_model_path() {
    local name=$1 value=${!1}
    if [[ -d $value ]]; then return 0; fi
    if is_hf_id "$value"; then
        log_warn "$name=$value is not a local directory; SGLang will fetch it as a Hugging Face id"
        return 0
    fi
    MISSING+=("$name=$value is neither an existing directory nor a Hugging Face id (owner/name)")
}

# The trainer loads model.path from a local directory (or the packaged 'smollm2'). An HF id that
# is already in the local Hugging Face cache is replaced by its snapshot directory.
check_trainer_model_path() {
    [[ -d $TRAINER_MODEL_PATH || $TRAINER_MODEL_PATH == smollm2 ]] && return 0
    local snapshot
    if ((PYTHON_OK)) && is_hf_id "$TRAINER_MODEL_PATH" &&
        snapshot=$("$PYTHON" -c 'import sys; from huggingface_hub import snapshot_download; print(snapshot_download(sys.argv[1], local_files_only=True))' \
            "$TRAINER_MODEL_PATH" 2>/dev/null) && [[ -d $snapshot ]]; then
        log_info "TRAINER_MODEL_PATH=$TRAINER_MODEL_PATH found in the local Hugging Face cache: $snapshot"
        TRAINER_MODEL_PATH=$snapshot
        return 0
    fi
    MISSING+=("TRAINER_MODEL_PATH=$TRAINER_MODEL_PATH is not a local directory; the trainer reads HF checkpoints from disk: download the model first (e.g. huggingface-cli download $TRAINER_MODEL_PATH --local-dir DIR) and set MODEL_PATH=DIR")
}

# check_ports_free "PORT:NAME@HOST" ...: every port must be bindable on its bind address.
check_ports_free() {
    ((PYTHON_OK)) || return 0
    local busy
    busy=$("$PYTHON" - "$@" <<'PY'
import socket, sys
for spec in sys.argv[1:]:
    port, rest = spec.split(":", 1)
    name, _, host = rest.partition("@")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host or "0.0.0.0", int(port)))
    except OSError as err:
        print(f"port {port} ({name}) cannot be bound on {host or '0.0.0.0'}: {err.strerror}; stop what holds it or choose another port")
    finally:
        sock.close()
PY
    ) || true
    local line
    while IFS= read -r line; do
        if [[ -n $line ]]; then MISSING+=("$line"); fi
    done <<<"$busy"
}

# ports_unique "PORT:NAME@HOST" ...: the plan must not give one port to two components.
ports_unique() {
    local -A owner=()
    local spec port name
    for spec in "$@"; do
        port=${spec%%:*}
        name=${spec#*:}
        name=${name%@*}
        [[ -z ${owner[$port]:-} ]] || die "port $port is given to both ${owner[$port]} and $name; change the *_PORT settings"
        owner[$port]=$name
    done
}

# check_dirs_creatable DIR...: each exists as a writable directory or could be created (its
# nearest existing ancestor is a writable directory). Nothing is created here.
check_dirs_creatable() {
    local dir probe
    for dir in "$@"; do
        probe=$dir
        while [[ ! -e $probe && $probe != / ]]; do probe=$(dirname "$probe"); done
        if [[ ! -d $probe || ! -w $probe ]]; then
            MISSING+=("cannot create or write directory $dir ($probe is not a writable directory)")
        fi
    done
}

make_dirs() {  # DIR...
    mkdir -p "$@" || die "could not create the directories $*"
}

# ---------------------------------------------------------------- starting and stopping

# redacted_words ARGV...: the words, with the value after every --api-key replaced by *** (for printing).
redacted_words() {
    local word secret=0
    REDACTED=()
    for word in "$@"; do
        if ((secret)); then REDACTED+=("***"); else REDACTED+=("$word"); fi
        secret=0
        if [[ $word == --api-key ]]; then secret=1; fi
    done
}

# start_component NAME LOGFILE [VAR=value ...] ARGV...: in its own process group (setsid), output
# to LOGFILE (which starts with the command line, keys redacted), stdin from /dev/null.
start_component() {
    local name=$1 logfile=$2
    shift 2
    redacted_words "$@"
    if ((DRY_RUN)); then
        printf '[dry-run] run %s (log %s): env %s\n' "$name" "$logfile" "$(quote_words "${REDACTED[@]}")"
        return 0
    fi
    log_info "starting $name (log $logfile)"
    printf '# %s\n' "$(quote_words env "${REDACTED[@]}")" >"$logfile"
    setsid env "$@" >>"$logfile" 2>&1 </dev/null &
    STARTED_PIDS+=("$!")
    STARTED_NAMES+=("$name")
    STARTED_LOGS+=("$logfile")
    if [[ $name == *trainer* ]]; then TRAINER_INDEX=$((${#STARTED_PIDS[@]} - 1)); fi
}

_component_index() {  # NAME -> index in STARTED_* or -1
    local i
    for i in "${!STARTED_NAMES[@]}"; do
        [[ ${STARTED_NAMES[i]} == "$1" ]] && { echo "$i"; return 0; }
    done
    echo -1
}

_log_tail() {  # LOGFILE
    [[ -f $1 ]] || return 0
    printf '\n--- last lines of %s ---\n%s\n---' "$1" "$(tail -n "${LOG_TAIL_LINES:-20}" "$1")"
}

http_ok() {  # URL
    if command -v curl >/dev/null 2>&1; then
        curl -fsS -o /dev/null --max-time 5 "$1" >/dev/null 2>&1
    else
        "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$1" >/dev/null 2>&1
    fi
}

# wait_for_health NAME URL: poll URL until HTTP 200, up to HEALTH_TIMEOUT seconds. When NAME is a
# component this script started, stop early (with its log tail) if it exits.
wait_for_health() {
    local name=$1 url=$2
    if ((DRY_RUN)); then
        printf '[dry-run] wait %s %s (timeout %ss)\n' "$name" "$url" "$HEALTH_TIMEOUT"
        return 0
    fi
    local index start=$SECONDS
    index=$(_component_index "$name")
    log_info "waiting for $name at $url (timeout ${HEALTH_TIMEOUT}s)"
    while true; do
        if ((index >= 0)) && ! kill -0 "${STARTED_PIDS[index]}" 2>/dev/null; then
            die "$name exited before it became healthy at $url$(_log_tail "${STARTED_LOGS[index]}")"
        fi
        if http_ok "$url"; then
            log_info "$name is healthy after $((SECONDS - start))s"
            return 0
        fi
        if ((SECONDS - start >= HEALTH_TIMEOUT)); then
            local where=""
            ((index >= 0)) && where=$(_log_tail "${STARTED_LOGS[index]}")
            die "$name did not become healthy at $url within HEALTH_TIMEOUT=${HEALTH_TIMEOUT}s$where"
        fi
        sleep "$HEALTH_INTERVAL"
    done
}

# group_alive PGID: some process of the group is still running. Zombies do not count: a worker's
# orphaned children wait as zombies until init reaps them, and they hold no GPU memory.
group_alive() {
    if command -v ps >/dev/null 2>&1; then
        ps -eo pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
    else
        kill -0 -- "-$1" 2>/dev/null
    fi
}

# stop_groups TIMEOUT INDEX...: SIGTERM the process groups, wait up to TIMEOUT seconds, then SIGKILL
# what is left. Only groups this script started are ever signalled.
stop_groups() {
    local timeout=$1 i deadline alive
    shift
    (($# > 0)) || return 0
    for i in "$@"; do
        log_info "stopping ${STARTED_NAMES[i]} (process group ${STARTED_PIDS[i]})"
        kill -TERM -- "-${STARTED_PIDS[i]}" 2>/dev/null || true
    done
    deadline=$((SECONDS + timeout))
    while ((SECONDS < deadline)); do
        alive=0
        for i in "$@"; do
            if group_alive "${STARTED_PIDS[i]}"; then alive=1; fi
        done
        ((alive)) || break
        sleep 0.2
    done
    for i in "$@"; do
        if group_alive "${STARTED_PIDS[i]}"; then
            log_warn "${STARTED_NAMES[i]} did not stop within ${timeout}s; sending SIGKILL"
            kill -KILL -- "-${STARTED_PIDS[i]}" 2>/dev/null || true
        fi
        wait "${STARTED_PIDS[i]}" 2>/dev/null || true
    done
}

# Trainer first (it may flush samples and checkpoints, and its judge may still use the PRM
# workers), then everything else at once.
stop_all_components() {
    ((_CLEANUP_DONE)) && return 0
    _CLEANUP_DONE=1
    ((${#STARTED_PIDS[@]} > 0)) || return 0
    local rest=() i
    if ((TRAINER_INDEX >= 0)); then stop_groups "$STOP_TIMEOUT" "$TRAINER_INDEX"; fi
    for ((i = ${#STARTED_PIDS[@]} - 1; i >= 0; i--)); do
        ((i == TRAINER_INDEX)) || rest+=("$i")
    done
    stop_groups "$STOP_TIMEOUT" "${rest[@]}"
    log_info "all components stopped; logs in $LOG_DIR"
}

_on_signal() {  # SIGNAL_NAME EXIT_CODE
    log_warn "received SIG$1; stopping the components this script started"
    exit "$2"
}

install_traps() {
    trap stop_all_components EXIT
    trap '_on_signal INT 130' INT
    trap '_on_signal TERM 143' TERM
    trap '_on_signal HUP 129' HUP
}

# monitor: return when the trainer exits (with its status); fail when any other component dies.
monitor_components() {
    local i rc=0
    while true; do
        if ((TRAINER_INDEX >= 0)) && ! kill -0 "${STARTED_PIDS[TRAINER_INDEX]}" 2>/dev/null; then
            wait "${STARTED_PIDS[TRAINER_INDEX]}" || rc=$?
            log_info "trainer exited with status $rc (log ${STARTED_LOGS[TRAINER_INDEX]})"
            return "$rc"
        fi
        for i in "${!STARTED_PIDS[@]}"; do
            ((i == TRAINER_INDEX)) && continue
            if ! kill -0 "${STARTED_PIDS[i]}" 2>/dev/null; then
                log_warn "${STARTED_NAMES[i]} exited unexpectedly$(_log_tail "${STARTED_LOGS[i]}")"
                return 1
            fi
        done
        sleep "$MONITOR_INTERVAL"
    done
}

# --------------------------------------------------------------------- shared settings

# Settings common to both scripts (call after LAYOUT-independent ones are known).
define_common_settings() {
    setting PYTHON python3 "Python interpreter for every component"
    setting MODEL_PATH Qwen/Qwen3-4B "policy model: HF checkpoint dir or HF id (SGLang policy workers)"
    setting TRAINER_MODEL_PATH "$MODEL_PATH" "model.path for the trainer (a local dir; must hold MODEL_PATH's weights)"
    setting PRM_MODEL_PATH "$MODEL_PATH" "judge/PRM model served by the PRM workers"
    setting CONFIG "$LAUNCH_REPO_ROOT/configs/qwen3_4b_gpu.yaml" "trainer YAML config"
    setting TRAINER_MODULE openclaw_jax.train "trainer entry module (python -m ...)"
    setting POLICY_TP 1 "GPUs per policy worker (SGLang --tp-size)"
    setting PRM_TP 1 "GPUs per PRM worker (SGLang --tp-size)"
    setting SGLANG_DTYPE bfloat16 "SGLang --dtype"
    setting CONTEXT_LENGTH "" "SGLang --context-length (empty = the model's)"
    setting SGLANG_EXTRA_ARGS "" "extra flags for every SGLang worker (whitespace separated)"
    setting POLICY_EXTRA_ARGS "" "extra flags for policy workers"
    setting PRM_EXTRA_ARGS "" "extra flags for PRM workers"
    setting ROUTER_POLICY cache_aware "sglang_router --policy (cache_aware | round_robin | ...)"
    setting ROUTER_EXTRA_ARGS "" "extra flags for sglang_router"
    setting ROUTER_PORT 30000 "policy router port (the trainer's policy.urls)"
    setting POLICY_BASE_PORT 30100 "policy worker i listens on POLICY_BASE_PORT + i"
    setting PRM_BASE_PORT 30200 "PRM worker i listens on PRM_BASE_PORT + i"
    setting GATEWAY_HOST 127.0.0.1 "agent-facing gateway bind address (beyond loopback: set GATEWAY_KEYS_FILE or OPENCLAW_GATEWAY_API_KEY)"
    setting GATEWAY_KEYS_FILE "" "gateway.keys_file: YAML key -> person id (docs/security.md)"
    setting POOL_API_KEY "" "bearer key of every SGLang worker and the router (empty: generated)"
    setting GATEWAY_PORT 8000 "agent-facing gateway port"
    setting MESH_DATA 1 "trainer mesh.data"
    setting MESH_FSDP -1 "trainer mesh.fsdp (-1 = remaining devices)"
    setting MESH_TP 1 "trainer mesh.tp"
    setting HEALTH_TIMEOUT 900 "seconds to wait for each component's /health"
    setting HEALTH_INTERVAL 2 "seconds between health polls"
    setting STOP_TIMEOUT 60 "seconds between SIGTERM and SIGKILL on shutdown"
    setting MONITOR_INTERVAL 5 "seconds between liveness checks while training"
    setting NVIDIA_SMI nvidia-smi "nvidia-smi binary (GPU count check)"
}

# Layout-dependent defaults; call after LAYOUT and the GPU total are known.
define_layout_settings() {  # TOTAL_GPUS
    local total=$1
    if [[ $LAYOUT == colocated ]]; then
        setting TRAINER_GPUS "$total" "trainer GPUs (colocated: all of them)"
        setting POLICY_GPUS $((total / 2)) "GPUs for policy workers (colocated: shared with the trainer)"
        setting PRM_GPUS $((total - total / 2)) "GPUs for PRM workers (0 = the judge uses the policy pool)"
        setting TRAINER_MEM_FRACTION 0.5 "XLA_PYTHON_CLIENT_MEM_FRACTION of the trainer"
        setting POLICY_MEM_FRACTION 0.35 "SGLang --mem-fraction-static of policy workers"
        setting PRM_MEM_FRACTION 0.35 "SGLang --mem-fraction-static of PRM workers"
    else
        setting TRAINER_GPUS $((total / 2)) "trainer GPUs"
        setting POLICY_GPUS $((total / 4)) "GPUs for policy workers"
        setting PRM_GPUS $((total - total / 2 - total / 4)) "GPUs for PRM workers (0 = the judge uses the policy pool)"
        setting TRAINER_MEM_FRACTION 0.9 "XLA_PYTHON_CLIENT_MEM_FRACTION of the trainer"
        setting POLICY_MEM_FRACTION 0.85 "SGLang --mem-fraction-static of policy workers"
        setting PRM_MEM_FRACTION 0.85 "SGLang --mem-fraction-static of PRM workers"
    fi
    setting MEM_FRACTION_LIMIT 0.95 "colocated: trainer + SGLang fractions per GPU must stay <= this"
}

validate_common_settings() {
    require_choice LAYOUT disjoint colocated
    require_int TRAINER_GPUS 1
    require_int POLICY_GPUS 1
    require_int PRM_GPUS 0
    require_int POLICY_TP 1
    require_int PRM_TP 1
    require_port ROUTER_PORT
    require_port POLICY_BASE_PORT
    require_port PRM_BASE_PORT
    require_port GATEWAY_PORT
    require_int HEALTH_TIMEOUT 1
    require_int STOP_TIMEOUT 1
    require_fraction TRAINER_MEM_FRACTION
    require_fraction POLICY_MEM_FRACTION
    require_fraction PRM_MEM_FRACTION
    require_fraction MEM_FRACTION_LIMIT
    [[ $HEALTH_INTERVAL =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "HEALTH_INTERVAL='$HEALTH_INTERVAL' must be a number of seconds"
    [[ $MONITOR_INTERVAL =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "MONITOR_INTERVAL='$MONITOR_INTERVAL' must be a number of seconds"
    local name
    for name in MESH_DATA MESH_FSDP MESH_TP; do
        [[ ${!name} =~ ^(-1|[1-9][0-9]*)$ ]] || die "$name='${!name}' must be a positive whole number or -1"
    done
    [[ -n $MODEL_PATH ]] || die "MODEL_PATH is empty; set it to an HF checkpoint directory or HF id"
    ((POLICY_BASE_PORT + POLICY_GPUS < 65536 && PRM_BASE_PORT + PRM_GPUS < 65536)) ||
        die "worker ports run past 65535; lower POLICY_BASE_PORT/PRM_BASE_PORT"
}

# Absolute path from a possibly relative one (the directory need not exist yet).
abspath() {
    case $1 in
        /*) printf '%s' "$1" ;;
        *) printf '%s/%s' "$PWD" "${1#./}" ;;
    esac
}
