#!/usr/bin/env bash
# Several GPU nodes: one JAX trainer process per node (multi-controller, jax.distributed), SGLang
# policy workers behind one sglang_router on node 0, SGLang PRM (judge) workers. Run this script
# on every node with its NODE_RANK (by hand, pdsh, or srun). See launch/README.md.
set -euo pipefail

LAUNCH_NAME=multi_node
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
    cat <<'EOF'
Usage: NODE_RANK=<i> NNODES=<n> NODE_ADDRS=<addr0,addr1,...> launch/multi_node.sh [--dry-run] [--help]
           [--] [trainer key=value overrides ...]

Run it on every node. Each node gets the same per-node GPU split (TRAINER_GPUS for its trainer
process, POLICY_GPUS/PRM_GPUS for SGLang workers when the node is in POLICY_NODES/PRM_NODES).
Node i starts its SGLang workers and waits for their /health. Node 0 then waits for every
worker on every node, starts the sglang_router in front of all policy workers (on its loopback:
only trainer process 0, on node 0, talks to it) and waits for it; the other nodes wait for every
worker of every node. Then each node starts its trainer process with
JAX_COORDINATOR_ADDRESS=MASTER_ADDR:JAX_COORDINATOR_PORT, JAX_NUM_PROCESSES=NNODES and
JAX_PROCESS_ID=NODE_RANK (read by openclaw_jax.parallel.mesh.maybe_initialize_distributed);
the trainer's process 0 hosts the gateway. RUN_DIR and WEIGHT_SYNC_DIR must be on a filesystem
every node shares (checkpoints; weights read by every SGLang worker). The workers require a key
(POOL_API_KEY; when unset, the first node to start writes one to RUN_DIR/.pool_api_key, mode 600,
and every node reads it from there).

Under Slurm, NODE_RANK, NNODES and NODE_ADDRS default to SLURM_NODEID, SLURM_NNODES and the
hosts of SLURM_JOB_NODELIST.

Options:
  --dry-run, -n   print the plan and every node's commands; start nothing
  --help, -h      this text and the current settings
  key=value       extra trainer overrides (also everything after --), appended last

Example (two nodes):
  node0$ NODE_RANK=0 NNODES=2 NODE_ADDRS=10.0.0.1,10.0.0.2 MODEL_PATH=/shared/Qwen3-4B \
         RUN_DIR=/shared/runs/exp1 launch/multi_node.sh
  node1$ NODE_RANK=1 NNODES=2 NODE_ADDRS=10.0.0.1,10.0.0.2 MODEL_PATH=/shared/Qwen3-4B \
         RUN_DIR=/shared/runs/exp1 launch/multi_node.sh

EOF
    define_settings
    print_settings
}

define_settings() {
    setting LAYOUT disjoint "disjoint | colocated (per node)"
    require_choice LAYOUT disjoint colocated
    setting NNODES "${SLURM_NNODES:-2}" "number of nodes (one trainer process each)"
    require_int NNODES 1
    setting NODE_RANK "${SLURM_NODEID:-}" "this node's rank 0..NNODES-1 (required for a real run)"
    local slurm_addrs=""
    if [[ -n ${SLURM_JOB_NODELIST:-} ]] && command -v scontrol >/dev/null 2>&1; then
        slurm_addrs=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)
    fi
    setting NODE_ADDRS "$slurm_addrs" "every node's address, comma separated, in rank order (required for a real run)"
    NODE_ADDR_LIST=()
    if [[ -n $NODE_ADDRS ]]; then
        IFS=, read -r -a NODE_ADDR_LIST <<<"$NODE_ADDRS"
        ((${#NODE_ADDR_LIST[@]} == NNODES)) ||
            die "NODE_ADDRS=$NODE_ADDRS names ${#NODE_ADDR_LIST[@]} nodes but NNODES=$NNODES; give one address per node in rank order"
    else
        local r
        for ((r = 0; r < NNODES; r++)); do NODE_ADDR_LIST+=("node$r"); done
        NODE_ADDRS_PLACEHOLDER=1
    fi
    setting MASTER_ADDR "${NODE_ADDR_LIST[0]}" "node 0's address for the JAX coordinator, router and gateway"
    setting JAX_COORDINATOR_PORT 29500 "jax.distributed coordinator port on MASTER_ADDR"
    setting GPUS_PER_NODE 8 "GPUs on each node"
    require_int GPUS_PER_NODE 1
    define_layout_settings "$GPUS_PER_NODE"
    setting POLICY_NODES all "ranks that run policy workers (all, or e.g. 0,1)"
    setting PRM_NODES all "ranks that run PRM workers (all, or e.g. 1)"
    define_common_settings
    setting SGLANG_HOST 0.0.0.0 "bind address of SGLang workers (reached from node 0's router)"
    setting ROUTER_HOST 127.0.0.1 "bind address of the router on node 0 (only trainer process 0 uses it)"
    setting RUN_DIR runs/multi_node "trainer run_dir, on a shared filesystem"
    RUN_DIR=$(abspath "$RUN_DIR")
    setting LOG_DIR "$RUN_DIR/logs" "logs go to LOG_DIR/node<rank>/<component>.log"
    setting WEIGHT_SYNC_DIR "$RUN_DIR/weight_sync" "weights for /update_weights_from_disk, on a shared filesystem"
    LOG_DIR=$(abspath "$LOG_DIR")
    WEIGHT_SYNC_DIR=$(abspath "$WEIGHT_SYNC_DIR")
}

# node_list NAME -> RANKS array from "all" or "0,2"
node_list() {
    local name=$1 value=${!1} r
    RANKS=()
    if [[ $value == all ]]; then
        for ((r = 0; r < NNODES; r++)); do RANKS+=("$r"); done
        return 0
    fi
    IFS=, read -r -a RANKS <<<"$value"
    for r in "${RANKS[@]}"; do
        if ! [[ $r =~ ^[0-9]+$ ]] || ((r >= NNODES)); then
            die "$name=$value: '$r' is not a node rank in 0..$((NNODES - 1))"
        fi
    done
}

contains() {  # WORD LIST...
    local word=$1 item
    shift
    for item in "$@"; do [[ $item == "$word" ]] && return 0; done
    return 1
}

# The plan, identical on every node: worker URLs per node and the trainer's URL lists.
build_cluster_plan() {
    node_list POLICY_NODES
    POLICY_RANKS=("${RANKS[@]}")
    node_list PRM_NODES
    PRM_RANKS=("${RANKS[@]}")
    ((${#POLICY_RANKS[@]} > 0)) || die "POLICY_NODES=$POLICY_NODES names no node; at least one node must run policy workers"
    if ((PRM_GPUS == 0)); then PRM_RANKS=(); fi

    local r i
    POLICY_WORKER_URLS=()
    PRM_WORKER_URLS=()
    declare -gA NODE_POLICY_URLS=() NODE_PRM_URLS=()
    for ((r = 0; r < NNODES; r++)); do
        local policy_urls=() prm_urls=()
        if contains "$r" "${POLICY_RANKS[@]}"; then
            for i in "${!POLICY_WORKER_DEVICES[@]}"; do policy_urls+=("http://${NODE_ADDR_LIST[r]}:$((POLICY_BASE_PORT + i))"); done
        fi
        if ((${#PRM_RANKS[@]} > 0)) && contains "$r" "${PRM_RANKS[@]}"; then
            for i in "${!PRM_WORKER_DEVICES[@]}"; do prm_urls+=("http://${NODE_ADDR_LIST[r]}:$((PRM_BASE_PORT + i))"); done
        fi
        NODE_POLICY_URLS[$r]="${policy_urls[*]}"
        NODE_PRM_URLS[$r]="${prm_urls[*]}"
        POLICY_WORKER_URLS+=("${policy_urls[@]}")
        PRM_WORKER_URLS+=("${prm_urls[@]}")
    done
    ROUTER_URL="http://127.0.0.1:$ROUTER_PORT"   # node 0's own router, for node 0's trainer process
    if ((${#PRM_WORKER_URLS[@]} > 0)); then
        JUDGE_URLS=("${PRM_WORKER_URLS[@]}")
    else
        JUDGE_URLS=("$ROUTER_URL")  # no PRM workers: the judge shares the policy pool
    fi
}

# node_port_specs RANK -> PORT_SPECS ("port:name@bind-address") of what listens on that node.
node_port_specs() {
    local r=$1 i url
    PORT_SPECS=()
    if ((r == 0)); then
        PORT_SPECS+=("$ROUTER_PORT:router@$ROUTER_HOST" "$GATEWAY_PORT:gateway@$GATEWAY_HOST"
            "$JAX_COORDINATOR_PORT:jax-coordinator@0.0.0.0")
    fi
    i=0
    for url in ${NODE_POLICY_URLS[$r]}; do PORT_SPECS+=("${url##*:}:policy$i@$SGLANG_HOST"); i=$((i + 1)); done
    i=0
    for url in ${NODE_PRM_URLS[$r]}; do PORT_SPECS+=("${url##*:}:prm$i@$SGLANG_HOST"); i=$((i + 1)); done
}

print_plan() {
    local r i url
    echo "plan (LAYOUT=$LAYOUT, $NNODES nodes x $GPUS_PER_NODE GPUs, coordinator $MASTER_ADDR:$JAX_COORDINATOR_PORT):"
    for ((r = 0; r < NNODES; r++)); do
        echo "  node $r (${NODE_ADDR_LIST[r]}):"
        printf '    %-9s GPUs %-16s JAX_PROCESS_ID=%s XLA_PYTHON_CLIENT_MEM_FRACTION=%s\n' trainer "$TRAINER_DEVICES" "$r" "$TRAINER_MEM_FRACTION"
        i=0
        for url in ${NODE_POLICY_URLS[$r]}; do
            printf '    %-9s GPUs %-16s %s\n' "policy$i" "${POLICY_WORKER_DEVICES[i]}" "$url"
            i=$((i + 1))
        done
        i=0
        for url in ${NODE_PRM_URLS[$r]}; do
            printf '    %-9s GPUs %-16s %s\n' "prm$i" "${PRM_WORKER_DEVICES[i]}" "$url"
            i=$((i + 1))
        done
        if ((r == 0)); then
            printf '    %-9s %s -> %d policy workers\n' router "$ROUTER_URL" "${#POLICY_WORKER_URLS[@]}"
            printf '    %-9s http://%s:%s (trainer process 0)\n' gateway "$GATEWAY_HOST" "$GATEWAY_PORT"
        fi
    done
    printf '  judge urls: %s\n  logs: %s/node<rank>/\n' "$(join_by ' ' "${JUDGE_URLS[@]}")" "$LOG_DIR"
}

# node_prereqs RANK: what node RANK needs (checked, or printed in a dry run).
node_prereqs() {
    local r=$1
    node_port_specs "$r"
    prereq "setsid is available" check_command setsid "util-linux; starts each component in its own process group"
    prereq "python '$PYTHON' (>= 3.11) runs" check_python
    prereq "'$PYTHON' can import sglang, sglang_router and $TRAINER_MODULE" check_python_modules_all
    prereq "nvidia-smi lists at least $GPUS_PER_NODE GPUs" check_gpus "$GPUS_PER_NODE"
    prereq "CONFIG=$CONFIG exists" check_config_file
    if [[ -n ${NODE_POLICY_URLS[$r]} ]]; then
        prereq "MODEL_PATH=$MODEL_PATH is a directory or an HF id" check_model_path MODEL_PATH
    fi
    if [[ -n ${NODE_PRM_URLS[$r]} ]]; then
        prereq "PRM_MODEL_PATH=$PRM_MODEL_PATH is a directory or an HF id" check_model_path PRM_MODEL_PATH
    fi
    prereq "TRAINER_MODEL_PATH=$TRAINER_MODEL_PATH is a local directory (or in the HF cache)" check_trainer_model_path
    prereq "ports free: ${PORT_SPECS[*]}" check_ports_free "${PORT_SPECS[@]}"
    prereq "RUN_DIR, LOG_DIR/node$r and WEIGHT_SYNC_DIR can be created (RUN_DIR shared by all nodes)" \
        check_dirs_creatable "$RUN_DIR" "$LOG_DIR/node$r" "$WEIGHT_SYNC_DIR"
}

# node_actions RANK: start (or, in a dry run, print) everything node RANK runs, in order.
node_actions() {
    local r=$1 i url log_dir="$LOG_DIR/node$1" prefix=""
    ((DRY_RUN)) && prefix="node$r/"
    i=0
    for url in ${NODE_POLICY_URLS[$r]}; do
        build_sglang_cmd "${POLICY_WORKER_DEVICES[i]}" "$MODEL_PATH" "$SGLANG_HOST" "${url##*:}" \
            "$POLICY_TP" "$POLICY_MEM_FRACTION" "$POLICY_EXTRA_ARGS"
        start_component "${prefix}policy$i" "$log_dir/policy$i.log" "${CMD[@]}"
        i=$((i + 1))
    done
    i=0
    for url in ${NODE_PRM_URLS[$r]}; do
        build_sglang_cmd "${PRM_WORKER_DEVICES[i]}" "$PRM_MODEL_PATH" "$SGLANG_HOST" "${url##*:}" \
            "$PRM_TP" "$PRM_MEM_FRACTION" "$PRM_EXTRA_ARGS"
        start_component "${prefix}prm$i" "$log_dir/prm$i.log" "${CMD[@]}"
        i=$((i + 1))
    done
    i=0
    for url in ${NODE_POLICY_URLS[$r]}; do wait_for_health "${prefix}policy$i" "$url/health"; i=$((i + 1)); done
    i=0
    for url in ${NODE_PRM_URLS[$r]}; do wait_for_health "${prefix}prm$i" "$url/health"; i=$((i + 1)); done

    if ((r == 0)); then
        local other
        for ((other = 1; other < NNODES; other++)); do
            i=0
            for url in ${NODE_POLICY_URLS[$other]}; do wait_for_health "node$other/policy$i" "$url/health"; i=$((i + 1)); done
            i=0
            for url in ${NODE_PRM_URLS[$other]}; do wait_for_health "node$other/prm$i" "$url/health"; i=$((i + 1)); done
        done
        build_router_cmd "$ROUTER_HOST" "$ROUTER_PORT" "${POLICY_WORKER_URLS[@]}"
        start_component "${prefix}router" "$log_dir/router.log" "${CMD[@]}"
    fi
    # Node 0 waits for its router, which it starts only once the whole pool is healthy; every other
    # node waits for the whole pool too, so no trainer process starts (and times out in
    # jax.distributed.initialize) long before the others.
    if ((r == 0)); then
        wait_for_health "${prefix}router" "$ROUTER_URL/health"
    else
        local other
        for ((other = 0; other < NNODES; other++)); do
            ((other == r)) && continue
            i=0
            for url in ${NODE_POLICY_URLS[$other]}; do wait_for_health "node$other/policy$i" "$url/health"; i=$((i + 1)); done
            i=0
            for url in ${NODE_PRM_URLS[$other]}; do wait_for_health "node$other/prm$i" "$url/health"; i=$((i + 1)); done
        done
    fi

    TRAINER_ENV=("CUDA_VISIBLE_DEVICES=$TRAINER_DEVICES" "XLA_PYTHON_CLIENT_MEM_FRACTION=$TRAINER_MEM_FRACTION"
        "JAX_COORDINATOR_ADDRESS=$MASTER_ADDR:$JAX_COORDINATOR_PORT" "JAX_NUM_PROCESSES=$NNODES" "JAX_PROCESS_ID=$r")
    build_trainer_cmd
    start_component "${prefix}trainer" "$log_dir/trainer.log" "${CMD[@]}"
}

main() {
    parse_args usage "$@"
    NODE_ADDRS_PLACEHOLDER=0
    define_settings
    validate_common_settings
    require_port JAX_COORDINATOR_PORT
    resolve_gpu_ids GPUS_PER_NODE
    plan_gpu_split GPUS_PER_NODE
    build_cluster_plan

    local r
    for ((r = 0; r < NNODES; r++)); do
        node_port_specs "$r"
        ports_unique "${PORT_SPECS[@]}"
    done

    if ((DRY_RUN)); then echo "openclaw_jax multi-node launch (dry run: nothing is started)"; else echo "openclaw_jax multi-node launch"; fi
    print_settings
    print_plan

    if ((DRY_RUN)); then
        ((NODE_ADDRS_PLACEHOLDER == 0)) || log_warn "NODE_ADDRS is not set; the dry run uses the placeholder names ${NODE_ADDR_LIST[*]}"
        check_gateway_exposure
        ensure_pool_api_key "$RUN_DIR/.pool_api_key"
        for ((r = 0; r < NNODES; r++)); do
            echo "[dry-run] node $r (${NODE_ADDR_LIST[r]}): NODE_RANK=$r launch/multi_node.sh"
            node_prereqs "$r"
            node_actions "$r"
        done
        echo "[dry-run] then: every node waits for its trainer; on its exit, Ctrl-C or SIGTERM it stops the trainer, then its router/workers"
        return 0
    fi

    [[ -n $NODE_RANK ]] || die "NODE_RANK is not set: run this script on every node with NODE_RANK=0..$((NNODES - 1)) (0 on $MASTER_ADDR)"
    require_int NODE_RANK 0
    ((NODE_RANK < NNODES)) || die "NODE_RANK=$NODE_RANK must be below NNODES=$NNODES"
    ((NNODES == 1 || NODE_ADDRS_PLACEHOLDER == 0)) ||
        die "NODE_ADDRS is not set: give every node's address (reachable from the others), comma separated in rank order, e.g. NODE_ADDRS=10.0.0.1,10.0.0.2"

    node_prereqs "$NODE_RANK"
    report_missing
    check_gateway_exposure
    make_dirs "$RUN_DIR" "$LOG_DIR/node$NODE_RANK" "$WEIGHT_SYNC_DIR"
    ensure_pool_api_key "$RUN_DIR/.pool_api_key"
    warn_if_no_jax_cuda
    install_traps

    node_actions "$NODE_RANK"
    log_info "node $NODE_RANK: all components up; following the trainer (log $LOG_DIR/node$NODE_RANK/trainer.log)"
    monitor_components
}

main "$@"
