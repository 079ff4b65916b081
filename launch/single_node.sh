#!/usr/bin/env bash
# One 8-GPU node: SGLang policy workers behind an sglang_router, SGLang PRM (judge) workers, and
# the JAX trainer (which hosts the gateway and the judge in-process). See launch/README.md.
set -euo pipefail

LAUNCH_NAME=single_node
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
    cat <<'EOF'
Usage: launch/single_node.sh [--dry-run] [--help] [--] [trainer key=value overrides ...]

Starts, in order: the SGLang policy and PRM workers (waits for /health), the sglang_router in
front of the policy workers (waits for /health), then the trainer
(python -m openclaw_jax.train). Stops only what it started when the trainer exits, on Ctrl-C
or on SIGTERM. Every size comes from an environment variable; the values are printed at start.

Layouts (LAYOUT=):
  disjoint   every GPU belongs to one component (CUDA_VISIBLE_DEVICES split):
             trainer GPUs first, then policy workers, then PRM workers (default 4 + 2 + 2).
  colocated  the trainer's mesh spans all GPUs; SGLang workers share them (policy workers on
             the first POLICY_GPUS, PRM workers on the next PRM_GPUS); memory is split by
             XLA_PYTHON_CLIENT_MEM_FRACTION (TRAINER_MEM_FRACTION) and SGLang's
             --mem-fraction-static (POLICY_MEM_FRACTION, PRM_MEM_FRACTION).

Options:
  --dry-run, -n   print the plan, the checks and every command; start nothing
  --help, -h      this text and the current settings
  key=value       extra trainer overrides (also everything after --), appended last

Examples:
  launch/single_node.sh --dry-run
  POLICY_GPUS=3 PRM_GPUS=1 TRAINER_GPUS=4 MODEL_PATH=/ckpt/Qwen3-4B launch/single_node.sh
  LAYOUT=colocated MODEL_PATH=/ckpt/Qwen3-4B launch/single_node.sh trainer.max_steps=100

EOF
    define_settings
    print_settings
}

define_settings() {
    setting LAYOUT disjoint "disjoint | colocated"
    require_choice LAYOUT disjoint colocated
    local default_gpus=8
    if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
        local ids
        IFS=, read -r -a ids <<<"$CUDA_VISIBLE_DEVICES"
        default_gpus=${#ids[@]}
    fi
    setting NUM_GPUS "$default_gpus" "GPUs this launch may use (8, or the inherited CUDA_VISIBLE_DEVICES count)"
    require_int NUM_GPUS 1
    define_layout_settings "$NUM_GPUS"
    define_common_settings
    setting SGLANG_HOST 127.0.0.1 "bind address of SGLang workers"
    setting ROUTER_HOST 127.0.0.1 "bind address of the router"
    setting RUN_DIR runs/single_node "trainer run_dir (TensorBoard, checkpoints, samples)"
    RUN_DIR=$(abspath "$RUN_DIR")
    setting LOG_DIR "$RUN_DIR/logs" "one log file per component"
    setting WEIGHT_SYNC_DIR "$RUN_DIR/weight_sync" "where the trainer writes weights for /update_weights_from_disk"
    LOG_DIR=$(abspath "$LOG_DIR")
    WEIGHT_SYNC_DIR=$(abspath "$WEIGHT_SYNC_DIR")
}

main() {
    parse_args usage "$@"
    define_settings
    validate_common_settings
    resolve_gpu_ids NUM_GPUS
    plan_gpu_split NUM_GPUS

    local i url port_specs=("$ROUTER_PORT:router@$ROUTER_HOST" "$GATEWAY_PORT:gateway@$GATEWAY_HOST")
    POLICY_WORKER_URLS=()
    for i in "${!POLICY_WORKER_DEVICES[@]}"; do
        POLICY_WORKER_URLS+=("http://127.0.0.1:$((POLICY_BASE_PORT + i))")
        port_specs+=("$((POLICY_BASE_PORT + i)):policy$i@$SGLANG_HOST")
    done
    PRM_WORKER_URLS=()
    for i in "${!PRM_WORKER_DEVICES[@]}"; do
        PRM_WORKER_URLS+=("http://127.0.0.1:$((PRM_BASE_PORT + i))")
        port_specs+=("$((PRM_BASE_PORT + i)):prm$i@$SGLANG_HOST")
    done
    ports_unique "${port_specs[@]}"
    ROUTER_URL="http://127.0.0.1:$ROUTER_PORT"
    if ((${#PRM_WORKER_URLS[@]} > 0)); then
        JUDGE_URLS=("${PRM_WORKER_URLS[@]}")
    else
        JUDGE_URLS=("$ROUTER_URL")  # PRM_GPUS=0: the judge shares the policy pool
    fi

    if ((DRY_RUN)); then echo "openclaw_jax single-node launch (dry run: nothing is started)"; else echo "openclaw_jax single-node launch"; fi
    print_settings
    echo "plan (LAYOUT=$LAYOUT, GPUs ${GPU_IDS[*]}${INHERITED_CVD:+, from the inherited CUDA_VISIBLE_DEVICES}):"
    printf '  %-9s GPUs %-16s XLA_PYTHON_CLIENT_MEM_FRACTION=%s mesh data=%s fsdp=%s tp=%s\n' \
        trainer "$TRAINER_DEVICES" "$TRAINER_MEM_FRACTION" "$MESH_DATA" "$MESH_FSDP" "$MESH_TP"
    for i in "${!POLICY_WORKER_DEVICES[@]}"; do
        printf '  %-9s GPUs %-16s %s --mem-fraction-static %s\n' "policy$i" "${POLICY_WORKER_DEVICES[i]}" "${POLICY_WORKER_URLS[i]}" "$POLICY_MEM_FRACTION"
    done
    for i in "${!PRM_WORKER_DEVICES[@]}"; do
        printf '  %-9s GPUs %-16s %s --mem-fraction-static %s\n' "prm$i" "${PRM_WORKER_DEVICES[i]}" "${PRM_WORKER_URLS[i]}" "$PRM_MEM_FRACTION"
    done
    printf '  %-9s %s -> %d policy workers\n' router "$ROUTER_URL" "${#POLICY_WORKER_URLS[@]}"
    printf '  %-9s %s (judge: %s)\n' gateway "http://$GATEWAY_HOST:$GATEWAY_PORT" "$(join_by ' ' "${JUDGE_URLS[@]}")"
    printf '  %-9s %s\n' logs "$LOG_DIR"

    prereq "setsid is available" check_command setsid "util-linux; starts each component in its own process group"
    prereq "python '$PYTHON' (>= 3.11) runs" check_python
    prereq "'$PYTHON' can import sglang, sglang_router and $TRAINER_MODULE" check_python_modules_all
    prereq "nvidia-smi lists at least $NUM_GPUS GPUs" check_gpus "$NUM_GPUS"
    prereq "CONFIG=$CONFIG exists" check_config_file
    prereq "MODEL_PATH=$MODEL_PATH is a directory or an HF id" check_model_path MODEL_PATH
    ((${#PRM_WORKER_URLS[@]} == 0)) || prereq "PRM_MODEL_PATH=$PRM_MODEL_PATH is a directory or an HF id" check_model_path PRM_MODEL_PATH
    prereq "TRAINER_MODEL_PATH=$TRAINER_MODEL_PATH is a local directory (or in the HF cache)" check_trainer_model_path
    prereq "ports free: ${port_specs[*]}" check_ports_free "${port_specs[@]}"
    prereq "RUN_DIR, LOG_DIR and WEIGHT_SYNC_DIR can be created" check_dirs_creatable "$RUN_DIR" "$LOG_DIR" "$WEIGHT_SYNC_DIR"
    report_missing
    check_gateway_exposure
    ((DRY_RUN)) || make_dirs "$RUN_DIR" "$LOG_DIR" "$WEIGHT_SYNC_DIR"
    ((DRY_RUN)) || { warn_if_no_jax_cuda; install_traps; }
    ensure_pool_api_key

    # SGLang first: in the colocated layout each worker sizes its KV cache from the memory
    # free when it starts, so the trainer's preallocation must come after.
    for i in "${!POLICY_WORKER_DEVICES[@]}"; do
        build_sglang_cmd "${POLICY_WORKER_DEVICES[i]}" "$MODEL_PATH" "$SGLANG_HOST" "$((POLICY_BASE_PORT + i))" \
            "$POLICY_TP" "$POLICY_MEM_FRACTION" "$POLICY_EXTRA_ARGS"
        start_component "policy$i" "$LOG_DIR/policy$i.log" "${CMD[@]}"
    done
    for i in "${!PRM_WORKER_DEVICES[@]}"; do
        build_sglang_cmd "${PRM_WORKER_DEVICES[i]}" "$PRM_MODEL_PATH" "$SGLANG_HOST" "$((PRM_BASE_PORT + i))" \
            "$PRM_TP" "$PRM_MEM_FRACTION" "$PRM_EXTRA_ARGS"
        start_component "prm$i" "$LOG_DIR/prm$i.log" "${CMD[@]}"
    done
    for i in "${!POLICY_WORKER_URLS[@]}"; do wait_for_health "policy$i" "${POLICY_WORKER_URLS[i]}/health"; done
    for i in "${!PRM_WORKER_URLS[@]}"; do wait_for_health "prm$i" "${PRM_WORKER_URLS[i]}/health"; done

    build_router_cmd "$ROUTER_HOST" "$ROUTER_PORT" "${POLICY_WORKER_URLS[@]}"
    start_component router "$LOG_DIR/router.log" "${CMD[@]}"
    wait_for_health router "$ROUTER_URL/health"

    TRAINER_ENV=("CUDA_VISIBLE_DEVICES=$TRAINER_DEVICES" "XLA_PYTHON_CLIENT_MEM_FRACTION=$TRAINER_MEM_FRACTION")
    build_trainer_cmd
    start_component trainer "$LOG_DIR/trainer.log" "${CMD[@]}"
    if ((DRY_RUN)); then
        echo "[dry-run] then: wait for the trainer; on its exit, Ctrl-C or SIGTERM stop the trainer, then the router and workers"
        return 0
    fi
    log_info "all components up; gateway at http://$GATEWAY_HOST:$GATEWAY_PORT; following the trainer (log $LOG_DIR/trainer.log)"
    monitor_components
}

main "$@"
