"""Tests of launch/single_node.sh and launch/multi_node.sh.

Dry runs are parsed line by line (`[dry-run] run NAME (log FILE): env VAR=... argv`) and the
commands are checked against the GPU split, ports and URLs they must agree on. Real runs use
stand-ins that speak the same command lines: a fake `nvidia-smi`, fake `sglang.launch_server`
and `sglang_router.launch_router` modules (real HTTP servers with /health on the requested port)
and a fake trainer module, so the orchestration (prerequisite checks, health waits, logs,
shutdown of only the started process groups) runs for real on a machine without GPUs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SINGLE = REPO / "launch" / "single_node.sh"
MULTI = REPO / "launch" / "multi_node.sh"
BASH = shutil.which("bash")

RUN_RE = re.compile(r"^\[dry-run\] run (?P<name>\S+) \(log (?P<log>[^)]*)\): (?P<cmd>.*)$")
WAIT_RE = re.compile(r"^\[dry-run\] wait (?P<name>\S+) (?P<url>\S+) \(timeout (?P<timeout>\d+)s\)$")
ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _setting_names() -> set[str]:
    names = set()
    for script in (REPO / "launch").glob("*.sh"):
        names.update(re.findall(r"^\s*setting ([A-Z_][A-Z0-9_]*) ", script.read_text(), flags=re.M))
    return names


SETTING_NAMES = _setting_names()


def clean_env(**overrides: str) -> dict[str, str]:
    """The caller's environment without anything the scripts read, plus `overrides`."""
    env = {k: v for k, v in os.environ.items()
           if k not in SETTING_NAMES and k != "CUDA_VISIBLE_DEVICES" and not k.startswith("SLURM_")}
    env.update(overrides)
    return env


def run_script(script: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run([BASH, str(script), *args], env=env if env is not None else clean_env(),
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


class Action:
    def __init__(self, kind: str, name: str, **kw):
        self.kind, self.name = kind, name
        self.__dict__.update(kw)

    def __repr__(self):
        return f"Action({self.kind}, {self.name})"


def parse_dry_run(stdout: str) -> list[Action]:
    actions = []
    for line in stdout.splitlines():
        if m := RUN_RE.match(line):
            words = shlex.split(m["cmd"])
            assert words[0] == "env", line
            words = words[1:]
            env = {}
            while words and ENV_WORD.match(words[0]):
                key, value = words.pop(0).split("=", 1)
                env[key] = value
            actions.append(Action("run", m["name"], log=m["log"], env=env, argv=words))
        elif m := WAIT_RE.match(line):
            actions.append(Action("wait", m["name"], url=m["url"], timeout=int(m["timeout"])))
        elif line.startswith("[dry-run] check: "):
            actions.append(Action("check", line[len("[dry-run] check: "):]))
    return actions


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def flag_list(argv: list[str], name: str) -> list[str]:
    """Values after `name` up to the next --flag."""
    i = argv.index(name) + 1
    out = []
    while i < len(argv) and not argv[i].startswith("--"):
        out.append(argv[i])
        i += 1
    return out


def trainer_overrides(argv: list[str]) -> dict:
    assert argv[1:3] == ["-m", "openclaw_jax.train"], argv
    assert argv[3] == "--config"
    out = {}
    for word in argv[5:]:
        key, raw = word.split("=", 1)
        out[key] = yaml.safe_load(raw)  # the trainer reads override values as YAML
    return out


def devices(action: Action) -> list[str]:
    return action.env["CUDA_VISIBLE_DEVICES"].split(",")


def check_single_node_plan(actions: list[Action], *, n_policy: int, n_prm: int, policy_tp: int = 1,
                           prm_tp: int = 1, trainer_gpus: int, layout: str, total: int = 8,
                           gpu_ids: list[str] | None = None) -> dict:
    """Checks shared by every single-node dry run; returns the parsed pieces."""
    gpu_ids = gpu_ids or [str(i) for i in range(total)]
    runs = {a.name: a for a in actions if a.kind == "run"}
    policy = [runs[f"policy{i}"] for i in range(n_policy)]
    prm = [runs[f"prm{i}"] for i in range(n_prm)]
    assert set(runs) == {f"policy{i}" for i in range(n_policy)} | {f"prm{i}" for i in range(n_prm)} | {
        "router", "trainer"}
    router, trainer = runs["router"], runs["trainer"]

    # every SGLang worker: the interface's flags, its own GPUs, its own port
    for worker, tp in [(w, policy_tp) for w in policy] + [(w, prm_tp) for w in prm]:
        argv = worker.argv
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        assert int(flag(argv, "--tp-size")) == tp == len(devices(worker))
        assert flag(argv, "--host") == "127.0.0.1"
        assert flag(argv, "--api-key") == "***"   # required, and never printed
    worker_devs = [d for w in policy + prm for d in devices(w)]
    assert len(worker_devs) == len(set(worker_devs)), "two SGLang workers share a GPU"
    ports = [int(flag(w.argv, "--port")) for w in policy + prm] + [int(flag(router.argv, "--port"))]
    assert len(ports) == len(set(ports))

    trainer_devs = devices(trainer)
    assert len(trainer_devs) == trainer_gpus
    if layout == "disjoint":
        assert not set(trainer_devs) & set(worker_devs), "disjoint layout shares a GPU"
        assert set(trainer_devs) | set(worker_devs) <= set(gpu_ids)
        if trainer_gpus + len(worker_devs) == total:
            assert sorted(trainer_devs + worker_devs, key=gpu_ids.index) == gpu_ids  # covering
    else:
        assert sorted(trainer_devs, key=gpu_ids.index) == gpu_ids  # spans every GPU
        assert set(worker_devs) <= set(gpu_ids)

    # router fronts exactly the policy workers
    policy_urls = [f"http://127.0.0.1:{flag(w.argv, '--port')}" for w in policy]
    prm_urls = [f"http://127.0.0.1:{flag(w.argv, '--port')}" for w in prm]
    assert router.argv[1:3] == ["-m", "sglang_router.launch_router"]
    assert flag_list(router.argv, "--worker-urls") == policy_urls
    router_url = f"http://127.0.0.1:{flag(router.argv, '--port')}"

    ov = trainer_overrides(trainer.argv)
    assert ov["policy.mode"] == "external"
    assert ov["policy.urls"] == [router_url]
    assert ov["policy.worker_urls"] == policy_urls
    assert ov["gateway.judge"] == "model"
    assert ov["gateway.judge_urls"] == (prm_urls or [router_url])
    assert ov["mesh.data"] == 1 and ov["mesh.fsdp"] == -1 and ov["mesh.tp"] == 1

    # order: workers started, each waited for, then the router, its wait, then the trainer last
    order = [(a.kind, a.name) for a in actions if a.kind in ("run", "wait")]
    pos = {item: i for i, item in enumerate(order)}
    for w in policy + prm:
        assert pos[("run", w.name)] < pos[("wait", w.name)] < pos[("run", "router")]
    assert pos[("run", "router")] < pos[("wait", "router")] < pos[("run", "trainer")] == len(order) - 1
    waits = {a.name: a.url for a in actions if a.kind == "wait"}
    assert waits["router"] == router_url + "/health"
    assert [waits[w.name] for w in policy + prm] == [u + "/health" for u in policy_urls + prm_urls]

    logs = [a.log for a in actions if a.kind == "run"]
    assert len(set(logs)) == len(logs)
    return dict(policy=policy, prm=prm, router=router, trainer=trainer, overrides=ov)


# ---------------------------------------------------------------------------------- dry runs


def test_single_node_dry_run_default_split():
    res = run_script(SINGLE, "--dry-run")
    assert res.returncode == 0, res.stderr
    actions = parse_dry_run(res.stdout)
    parts = check_single_node_plan(actions, n_policy=2, n_prm=2, trainer_gpus=4, layout="disjoint")
    for w in parts["policy"] + parts["prm"]:
        assert flag(w.argv, "--mem-fraction-static") == "0.85"
        assert flag(w.argv, "--model-path") == "Qwen/Qwen3-4B"
        assert flag(w.argv, "--dtype") == "bfloat16"
        assert "--context-length" not in w.argv
    assert parts["trainer"].env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.9"
    assert flag(parts["router"].argv, "--policy") == "cache_aware"
    ov = parts["overrides"]
    assert ov["gateway.port"] == 8000 and ov["gateway.host"] == "127.0.0.1"
    assert ov["run_dir"] == str(REPO / "runs" / "single_node")
    assert ov["policy.weight_sync_dir"] == str(REPO / "runs" / "single_node" / "weight_sync")
    # the defaults are printed at start, each marked as a default
    assert re.search(r"^\s+TRAINER_GPUS\s+= 4\s+\[default\]", res.stdout, flags=re.M)
    assert re.search(r"^\s+POLICY_GPUS\s+= 2\s+\[default\]", res.stdout, flags=re.M)
    # a dry run names the checks a real run would make, and starts nothing
    checks = [a.name for a in actions if a.kind == "check"]
    assert any("nvidia-smi" in c for c in checks) and any("sglang" in c for c in checks)
    assert not (REPO / "runs" / "single_node" / "logs" / "policy0.log").exists()


def test_single_node_dry_run_custom_split(tmp_path):
    env = clean_env(POLICY_GPUS="3", PRM_GPUS="1", TRAINER_GPUS="4", ROUTER_PORT="31000",
                    POLICY_BASE_PORT="31100", PRM_BASE_PORT="31200", GATEWAY_PORT="9000",
                    RUN_DIR=str(tmp_path / "run"), MODEL_PATH=str(tmp_path), CONTEXT_LENGTH="8192",
                    POLICY_MEM_FRACTION="0.8", ROUTER_POLICY="round_robin")
    res = run_script(SINGLE, "--dry-run", "trainer.max_steps=7", "--", "judge.votes=5", env=env)
    assert res.returncode == 0, res.stderr
    parts = check_single_node_plan(parse_dry_run(res.stdout), n_policy=3, n_prm=1, trainer_gpus=4,
                                   layout="disjoint")
    assert [flag(w.argv, "--port") for w in parts["policy"]] == ["31100", "31101", "31102"]
    assert flag(parts["prm"][0].argv, "--port") == "31200"
    assert flag(parts["router"].argv, "--port") == "31000"
    assert flag(parts["router"].argv, "--policy") == "round_robin"
    assert all(flag(w.argv, "--context-length") == "8192" for w in parts["policy"] + parts["prm"])
    assert [flag(w.argv, "--mem-fraction-static") for w in parts["policy"]] == ["0.8"] * 3
    assert flag(parts["prm"][0].argv, "--mem-fraction-static") == "0.85"
    assert all(flag(w.argv, "--model-path") == str(tmp_path) for w in parts["policy"] + parts["prm"])
    ov = parts["overrides"]
    assert ov["gateway.port"] == 9000
    assert ov["model.path"] == str(tmp_path)
    assert ov["run_dir"] == str(tmp_path / "run")
    # extra overrides come last, in the order given
    assert parts["trainer"].argv[-2:] == ["trainer.max_steps=7", "judge.votes=5"]
    assert re.search(r"^\s+POLICY_GPUS\s+= 3\s+\[env\]", res.stdout, flags=re.M)
    assert all(a.log.startswith(str(tmp_path / "run" / "logs")) for a in parse_dry_run(res.stdout)
               if a.kind == "run")


def test_single_node_dry_run_tensor_parallel_workers():
    env = clean_env(TRAINER_GPUS="2", POLICY_GPUS="4", POLICY_TP="2", PRM_GPUS="2", PRM_TP="2")
    res = run_script(SINGLE, "--dry-run", env=env)
    assert res.returncode == 0, res.stderr
    parts = check_single_node_plan(parse_dry_run(res.stdout), n_policy=2, n_prm=1, policy_tp=2, prm_tp=2,
                                   trainer_gpus=2, layout="disjoint")
    assert [devices(w) for w in parts["policy"]] == [["2", "3"], ["4", "5"]]
    assert devices(parts["prm"][0]) == ["6", "7"]


def test_single_node_dry_run_colocated_default():
    res = run_script(SINGLE, "--dry-run", env=clean_env(LAYOUT="colocated"))
    assert res.returncode == 0, res.stderr
    parts = check_single_node_plan(parse_dry_run(res.stdout), n_policy=4, n_prm=4, trainer_gpus=8,
                                   layout="colocated")
    trainer_frac = float(parts["trainer"].env["XLA_PYTHON_CLIENT_MEM_FRACTION"])
    for w in parts["policy"] + parts["prm"]:
        # the trainer and the worker on each GPU together leave headroom
        assert trainer_frac + float(flag(w.argv, "--mem-fraction-static")) <= 0.95
    assert trainer_frac == 0.5


def test_single_node_dry_run_colocated_custom_fractions():
    env = clean_env(LAYOUT="colocated", POLICY_GPUS="6", PRM_GPUS="2", TRAINER_MEM_FRACTION="0.55",
                    POLICY_MEM_FRACTION="0.3", PRM_MEM_FRACTION="0.25")
    res = run_script(SINGLE, "--dry-run", env=env)
    assert res.returncode == 0, res.stderr
    parts = check_single_node_plan(parse_dry_run(res.stdout), n_policy=6, n_prm=2, trainer_gpus=8,
                                   layout="colocated")
    assert parts["trainer"].env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.55"
    assert [flag(w.argv, "--mem-fraction-static") for w in parts["policy"]] == ["0.3"] * 6
    assert [flag(w.argv, "--mem-fraction-static") for w in parts["prm"]] == ["0.25"] * 2
    assert [devices(w) for w in parts["policy"] + parts["prm"]] == [[str(i)] for i in range(8)]


def test_single_node_prm_gpus_zero_judge_uses_policy_pool():
    res = run_script(SINGLE, "--dry-run", env=clean_env(PRM_GPUS="0", POLICY_GPUS="4"))
    assert res.returncode == 0, res.stderr
    parts = check_single_node_plan(parse_dry_run(res.stdout), n_policy=4, n_prm=0, trainer_gpus=4,
                                   layout="disjoint")
    assert parts["overrides"]["gateway.judge_urls"] == parts["overrides"]["policy.urls"]


def test_single_node_inherited_cuda_visible_devices():
    res = run_script(SINGLE, "--dry-run", env=clean_env(CUDA_VISIBLE_DEVICES="2,3,5,7", TRAINER_GPUS="2",
                                                         POLICY_GPUS="1", PRM_GPUS="1"))
    assert res.returncode == 0, res.stderr
    parts = check_single_node_plan(parse_dry_run(res.stdout), n_policy=1, n_prm=1, trainer_gpus=2,
                                   layout="disjoint", total=4, gpu_ids=["2", "3", "5", "7"])
    assert devices(parts["trainer"]) == ["2", "3"]
    assert devices(parts["policy"][0]) == ["5"] and devices(parts["prm"][0]) == ["7"]


@pytest.mark.parametrize("env, message", [
    (dict(POLICY_GPUS="3", PRM_GPUS="2", TRAINER_GPUS="4"),
     "TRAINER_GPUS=4 + POLICY_GPUS=3 + PRM_GPUS=2 = 9 > NUM_GPUS=8"),
    (dict(LAYOUT="colocated", POLICY_GPUS="5", PRM_GPUS="4"), "POLICY_GPUS=5 + PRM_GPUS=4 = 9 > NUM_GPUS=8"),
    (dict(LAYOUT="colocated", TRAINER_GPUS="4"), "the trainer spans all NUM_GPUS=8 GPUs, but TRAINER_GPUS=4"),
    (dict(LAYOUT="colocated", TRAINER_MEM_FRACTION="0.7", POLICY_MEM_FRACTION="0.4"),
     "TRAINER_MEM_FRACTION=0.7 + POLICY_MEM_FRACTION=0.4 = 1.1 exceeds MEM_FRACTION_LIMIT=0.95"),
    (dict(POLICY_GPUS="3", POLICY_TP="2", TRAINER_GPUS="3"), "POLICY_GPUS=3 is not a multiple of POLICY_TP=2"),
    (dict(LAYOUT="split"), "LAYOUT='split' is not allowed; choose one of: disjoint colocated"),
    (dict(POLICY_GPUS="two"), "POLICY_GPUS='two' must be a whole number"),
    (dict(POLICY_GPUS="0"), "POLICY_GPUS=0 must be >= 1"),
    (dict(TRAINER_MEM_FRACTION="1.5"), "TRAINER_MEM_FRACTION=1.5 must be strictly between 0 and 1"),
    (dict(ROUTER_PORT="30100"), "port 30100 is given to both"),
    (dict(CUDA_VISIBLE_DEVICES="0,1,2,3", NUM_GPUS="8"), "names only 4 devices"),
])
def test_single_node_invalid_settings_fail_clearly(env, message):
    res = run_script(SINGLE, "--dry-run", env=clean_env(**env))
    assert res.returncode != 0
    assert message in res.stderr, res.stderr
    assert "[dry-run] run" not in res.stdout


def test_unknown_option_and_help():
    res = run_script(SINGLE, "--bogus")
    assert res.returncode != 0 and "unknown option '--bogus'" in res.stderr
    for script in (SINGLE, MULTI):
        res = run_script(script, "--help")
        assert res.returncode == 0, res.stderr
        assert "--dry-run" in res.stdout and "LAYOUT" in res.stdout and "TRAINER_GPUS" in res.stdout
        assert "[dry-run]" not in res.stdout


def multi_runs(actions: list[Action]) -> dict[int, dict[str, Action]]:
    per_node: dict[int, dict[str, Action]] = {}
    for a in actions:
        if a.kind == "run":
            node, name = a.name.split("/")
            per_node.setdefault(int(node.removeprefix("node")), {})[name] = a
    return per_node


def check_multi_node_plan(stdout: str, *, addrs: list[str], master: str, coord_port: int,
                          policy_nodes: list[int], prm_nodes: list[int], n_policy: int, n_prm: int,
                          trainer_gpus: int) -> dict[int, dict[str, Action]]:
    actions = parse_dry_run(stdout)
    nodes = multi_runs(actions)
    assert sorted(nodes) == list(range(len(addrs)))
    all_policy, all_prm = [], []
    for r, runs in nodes.items():
        expected = {"trainer"} | ({f"policy{i}" for i in range(n_policy)} if r in policy_nodes else set()) | (
            {f"prm{i}" for i in range(n_prm)} if r in prm_nodes else set()) | ({"router"} if r == 0 else set())
        assert set(runs) == expected, (r, sorted(runs))
        workers = [a for n, a in runs.items() if n.startswith(("policy", "prm"))]
        devs = [d for w in workers for d in devices(w)]
        assert len(devs) == len(set(devs))
        assert not set(devs) & set(devices(runs["trainer"]))
        assert len(devices(runs["trainer"])) == trainer_gpus
        for w in workers:
            assert flag(w.argv, "--host") == "0.0.0.0"
            assert flag(w.argv, "--api-key") == "***"   # required, and never printed
        all_policy += [f"http://{addrs[r]}:{flag(runs[f'policy{i}'].argv, '--port')}"
                       for i in range(n_policy) if r in policy_nodes]
        all_prm += [f"http://{addrs[r]}:{flag(runs[f'prm{i}'].argv, '--port')}"
                    for i in range(n_prm) if r in prm_nodes]
        # the multi-controller JAX environment of this node's trainer process
        env = runs["trainer"].env
        assert env["JAX_COORDINATOR_ADDRESS"] == f"{master}:{coord_port}"
        assert env["JAX_NUM_PROCESSES"] == str(len(addrs))
        assert env["JAX_PROCESS_ID"] == str(r)
        assert all(a.log.rsplit("/", 2)[1] == f"node{r}" for a in runs.values())
    router = nodes[0]["router"]
    assert sorted(flag_list(router.argv, "--worker-urls")) == sorted(all_policy)
    # on node 0's loopback: only trainer process 0 talks to it (the router can add and remove workers)
    assert flag(router.argv, "--host") == "127.0.0.1" and flag(router.argv, "--api-key") == "***"
    router_url = f"http://127.0.0.1:{flag(router.argv, '--port')}"
    overrides = [trainer_overrides(nodes[r]["trainer"].argv) for r in nodes]
    assert all(ov == overrides[0] for ov in overrides), "trainer processes disagree on their config"
    ov = overrides[0]
    assert ov["policy.urls"] == [router_url]
    assert sorted(ov["policy.worker_urls"]) == sorted(all_policy)
    assert sorted(ov["gateway.judge_urls"]) == sorted(all_prm or [router_url])
    # node 0 waits for every worker of every node before starting the router; the others wait
    # for every worker of every node before starting their trainer
    lines = stdout.splitlines()
    sections = [i for i, line in enumerate(lines) if re.match(r"^\[dry-run\] node \d+ ", line)] + [len(lines)]
    node0 = parse_dry_run("\n".join(lines[sections[0]:sections[1]]))
    waited = {a.url for a in node0 if a.kind == "wait"}
    assert {u + "/health" for u in all_policy + all_prm} | {router_url + "/health"} <= waited
    for r in range(1, len(addrs)):
        section = parse_dry_run("\n".join(lines[sections[r]:sections[r + 1]]))
        kinds = [(a.kind, getattr(a, "url", a.name)) for a in section if a.kind in ("run", "wait")]
        assert {("wait", u + "/health") for u in all_policy + all_prm} <= set(kinds[:-1])
        assert ("wait", router_url + "/health") not in kinds
        assert kinds[-1][0] == "run" and section[-1].name == f"node{r}/trainer"
    return nodes


def test_multi_node_dry_run_two_nodes_default():
    env = clean_env(NNODES="2", NODE_ADDRS="10.0.0.1,10.0.0.2")
    res = run_script(MULTI, "--dry-run", env=env)
    assert res.returncode == 0, res.stderr
    nodes = check_multi_node_plan(res.stdout, addrs=["10.0.0.1", "10.0.0.2"], master="10.0.0.1", coord_port=29500,
                                  policy_nodes=[0, 1], prm_nodes=[0, 1], n_policy=2, n_prm=2, trainer_gpus=4)
    assert devices(nodes[1]["trainer"]) == ["0", "1", "2", "3"]
    assert "[dry-run] node 1 (10.0.0.2): NODE_RANK=1" in res.stdout


def test_multi_node_dry_run_custom_split_and_placement():
    env = clean_env(NNODES="3", NODE_ADDRS="gpu-a,gpu-b,gpu-c", MASTER_ADDR="ib-a", JAX_COORDINATOR_PORT="4321",
                    POLICY_GPUS="3", PRM_GPUS="1", TRAINER_GPUS="4", PRM_NODES="2", POLICY_NODES="0,1")
    res = run_script(MULTI, "--dry-run", "trainer.max_steps=3", env=env)
    assert res.returncode == 0, res.stderr
    nodes = check_multi_node_plan(res.stdout, addrs=["gpu-a", "gpu-b", "gpu-c"], master="ib-a", coord_port=4321,
                                  policy_nodes=[0, 1], prm_nodes=[2], n_policy=3, n_prm=1, trainer_gpus=4)
    assert nodes[2]["trainer"].argv[-1] == "trainer.max_steps=3"


def test_multi_node_dry_run_without_addresses_uses_placeholders():
    res = run_script(MULTI, "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "placeholder" in res.stderr
    check_multi_node_plan(res.stdout, addrs=["node0", "node1"], master="node0", coord_port=29500,
                          policy_nodes=[0, 1], prm_nodes=[0, 1], n_policy=2, n_prm=2, trainer_gpus=4)


def test_multi_node_dry_run_colocated():
    env = clean_env(LAYOUT="colocated", NODE_ADDRS="a,b", TRAINER_MEM_FRACTION="0.45", PRM_MEM_FRACTION="0.4")
    res = run_script(MULTI, "--dry-run", env=env)
    assert res.returncode == 0, res.stderr
    nodes = multi_runs(parse_dry_run(res.stdout))
    for r, runs in nodes.items():
        assert devices(runs["trainer"]) == [str(i) for i in range(8)]
        assert runs["trainer"].env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.45"
        assert runs["trainer"].env["JAX_PROCESS_ID"] == str(r)
        workers = [a for n, a in runs.items() if n.startswith(("policy", "prm"))]
        assert sorted(d for w in workers for d in devices(w)) == [str(i) for i in range(8)]
        assert {n: flag(a.argv, "--mem-fraction-static") for n, a in runs.items() if n in ("policy0", "prm0")} == {
            "policy0": "0.35", "prm0": "0.4"}


@pytest.mark.parametrize("env, message", [
    (dict(NNODES="3", NODE_ADDRS="a,b"), "NODE_ADDRS=a,b names 2 nodes but NNODES=3"),
    (dict(PRM_NODES="0,5"), "PRM_NODES=0,5: '5' is not a node rank in 0..1"),
    (dict(TRAINER_GPUS="6"), "= 10 > GPUS_PER_NODE=8"),
    (dict(JAX_COORDINATOR_PORT="30100"), "port 30100 is given to both"),
])
def test_multi_node_invalid_settings_fail_clearly(env, message):
    res = run_script(MULTI, "--dry-run", env=clean_env(**env))
    assert res.returncode != 0
    assert message in res.stderr, res.stderr


def test_multi_node_real_run_needs_rank_and_addresses():
    res = run_script(MULTI, env=clean_env(NODE_ADDRS="a,b"))
    assert res.returncode != 0 and "NODE_RANK is not set" in res.stderr
    res = run_script(MULTI, env=clean_env(NODE_RANK="0"))
    assert res.returncode != 0 and "NODE_ADDRS is not set" in res.stderr
    res = run_script(MULTI, env=clean_env(NODE_RANK="2", NODE_ADDRS="a,b"))
    assert res.returncode != 0 and "NODE_RANK=2 must be below NNODES=2" in res.stderr


# ---------------------------------------------------------------------- missing prerequisites


def test_missing_nvidia_smi_stops_with_clear_message(tmp_path):
    env = clean_env(NVIDIA_SMI=str(tmp_path / "no-such" / "nvidia-smi"), RUN_DIR=str(tmp_path / "run"))
    res = run_script(SINGLE, env=env)
    assert res.returncode != 0
    assert "nvidia-smi not found" in res.stderr
    assert "nothing was started" in res.stderr
    assert not (tmp_path / "run").exists()  # not even the run directory


def _path_without_python(tmp_path: Path) -> str:
    """A PATH with the tools the scripts use but no python (and no nvidia-smi)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "env", "setsid", "awk", "date", "dirname", "mkdir", "tail", "sleep", "grep", "paste",
                 "cat", "kill"):
        if found := shutil.which(tool):
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


@pytest.mark.parametrize("script", [SINGLE, MULTI])
def test_missing_python_reports_every_missing_prerequisite(tmp_path, script):
    env = clean_env(PATH=_path_without_python(tmp_path), RUN_DIR=str(tmp_path / "run"), NODE_RANK="0",
                    NODE_ADDRS="127.0.0.1,127.0.0.2")
    res = run_script(script, env=env)
    assert res.returncode != 0
    assert "python interpreter 'python3' not found" in res.stderr, res.stderr
    assert "nvidia-smi not found" in res.stderr  # all problems are listed together


def test_missing_sglang_named(tmp_path):
    fakes = make_fakes(tmp_path, with_sglang=False)
    # `python -S` sees no site-packages, so sglang is missing even where it is installed
    no_site = tmp_path / "python-no-site"
    no_site.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    no_site.chmod(0o755)
    env = fake_env(tmp_path, fakes, base_port=free_port_block(1), PYTHON=str(no_site))
    res = run_script(SINGLE, env=env)
    assert res.returncode != 0
    assert "python module 'sglang' not importable" in res.stderr
    assert "python module 'sglang_router' not importable" in res.stderr
    assert "nvidia-smi not found" not in res.stderr


# ------------------------------------------------------------------ real runs with stand-ins

FAKE_SERVER = r'''
"""Stand-in for `python -m sglang.launch_server` / `sglang_router.launch_router`: /health on --port."""
import argparse, json, os, subprocess, sys, threading, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

def main(kind):
    parser = argparse.ArgumentParser()
    parser.add_argument("--host"); parser.add_argument("--port", type=int)
    parser.add_argument("--worker-urls", nargs="*", default=[])
    args, _ = parser.parse_known_args()
    if os.environ.get("FAKE_FAIL_PORT") == str(args.port):
        print("RuntimeError: CUDA out of memory (fake)", flush=True)
        sys.exit(1)
    # like SGLang's scheduler subprocesses: a child in the same process group
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    record = {"kind": kind, "argv": sys.argv, "pid": os.getpid(), "child_pid": child.pid,
              "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "pgid": os.getpgid(0)}
    path = os.path.join(os.environ["FAKE_RECORD_DIR"], f"{kind}-{args.host}-{args.port}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)

    def workers_ok():
        for url in args.worker_urls:
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
            except Exception:
                return False
        return True

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/health" and workers_ok()
            self.send_response(200 if ok else 503)
            self.end_headers()
        def log_message(self, *a):
            pass

    print(f"{kind} listening on {args.host}:{args.port}", flush=True)
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
'''

FAKE_TRAINER = r'''
"""Stand-in for `python -m openclaw_jax.train`: records what it was given and what was healthy."""
import json, os, signal, sys, time, urllib.request
import yaml

def healthy(url):
    try:
        return urllib.request.urlopen(url + "/health", timeout=2).status == 200
    except Exception:
        return False

overrides = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
urls = {k: yaml.safe_load(overrides[k]) for k in ("policy.urls", "policy.worker_urls", "gateway.judge_urls")}
every = urls["policy.urls"] + urls["policy.worker_urls"] + urls["gateway.judge_urls"]
record = {"argv": sys.argv, "pid": os.getpid(), "urls": urls, "pool_key": os.environ.get("OPENCLAW_POLICY_API_KEY"),
          "env": {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                  "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if k in os.environ},
          "healthy_at_start": {u: healthy(u) for u in every}}
rank = os.environ.get("JAX_PROCESS_ID")
path = os.path.join(os.environ["FAKE_RECORD_DIR"], f"trainer-{rank}.json" if rank else "trainer.json")

def dump():
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)

def on_term(signum, frame):
    # the launcher must stop the trainer before the workers its judge may still be using:
    # a graceful shutdown takes a while, and the pool must still serve at its end
    time.sleep(0.5)
    record["healthy_at_sigterm"] = {u: healthy(u) for u in every}
    dump()
    sys.exit(0)

signal.signal(signal.SIGTERM, on_term)
dump()
print("fake trainer started", flush=True)
mode = os.environ.get("FAKE_TRAINER_MODE", "exit:0")
if mode.startswith("exit:"):
    sys.exit(int(mode.split(":")[1]))
if mode.startswith("sleep:"):
    time.sleep(float(mode.split(":")[1]))
    sys.exit(0)
while True:
    time.sleep(0.1)
'''


def make_fakes(tmp_path: Path, *, with_sglang: bool = True) -> Path:
    fakes = tmp_path / "fakes"
    if with_sglang:
        for pkg, module, kind in (("sglang", "launch_server", "sglang"), ("sglang_router", "launch_router", "router")):
            (fakes / pkg).mkdir(parents=True)
            (fakes / pkg / "__init__.py").write_text("")
            (fakes / pkg / "_fake.py").write_text(FAKE_SERVER)
            (fakes / pkg / f"{module}.py").write_text(f"from {pkg}._fake import main\nmain({kind!r})\n")
    fakes.mkdir(exist_ok=True)
    (fakes / "fake_trainer.py").write_text(FAKE_TRAINER)
    smi = fakes / "nvidia-smi"
    smi.write_text(textwrap.dedent("""\
        #!/usr/bin/env bash
        [[ $1 == -L ]] || exit 2
        for i in 0 1 2 3; do echo "GPU $i: Fake GPU (UUID: GPU-fake-$i)"; done
        """))
    smi.chmod(0o755)
    return fakes


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def free_port_block(width: int) -> int:
    """A base port with `width` * 3 + 2 free ports at base..base+width, +100.., +200.."""
    for base in range(41000 + os.getpid() % 500 * 20, 60000, 311):
        ports = [base + k for k in range(2)] + [base + 100 + k for k in range(width)] + [
            base + 200 + k for k in range(width)]
        if all(port_free(p) for p in ports):
            return base
    raise RuntimeError("no free port block found")


def fake_env(tmp_path: Path, fakes: Path, base_port: int, **extra: str) -> dict[str, str]:
    records = tmp_path / "records"
    records.mkdir(exist_ok=True)
    config = tmp_path / "config.yaml"
    config.write_text("# stand-in config\n")
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    env = clean_env(
        PYTHONPATH=os.pathsep.join([str(fakes), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        PYTHON=sys.executable, NVIDIA_SMI=str(fakes / "nvidia-smi"), TRAINER_MODULE="fake_trainer",
        FAKE_RECORD_DIR=str(records), CONFIG=str(config), MODEL_PATH=str(model), RUN_DIR=str(tmp_path / "run"),
        NUM_GPUS="4", TRAINER_GPUS="2", POLICY_GPUS="1", PRM_GPUS="1",
        ROUTER_PORT=str(base_port), GATEWAY_PORT=str(base_port + 1), POLICY_BASE_PORT=str(base_port + 100),
        PRM_BASE_PORT=str(base_port + 200), HEALTH_TIMEOUT="60", HEALTH_INTERVAL="0.1",
        MONITOR_INTERVAL="0.1", STOP_TIMEOUT="10")
    env.update(extra)
    return env


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie left for its parent to reap counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def processes_with_argv(words: list[str]) -> list[int]:
    """Live processes whose command line contains every word."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if all(w in argv for w in words) and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def read_records(records: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in records.glob("*.json")}


@pytest.fixture
def bystander():
    """An unrelated process that the launcher must leave alone."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_real_run_with_stand_ins_starts_in_order_and_stops_what_it_started(tmp_path, bystander):
    fakes = make_fakes(tmp_path)
    base = free_port_block(1)
    env = fake_env(tmp_path, fakes, base, FAKE_TRAINER_MODE="exit:3")
    res = run_script(SINGLE, env=env)
    assert res.returncode == 3, res.stderr  # the trainer's exit status
    records = read_records(tmp_path / "records")
    policy_key, prm_key, router_key = (f"sglang-127.0.0.1-{base + 100}", f"sglang-127.0.0.1-{base + 200}",
                                       f"router-127.0.0.1-{base}")
    assert set(records) == {policy_key, prm_key, router_key, "trainer"}
    policy, prm, router, trainer = records[policy_key], records[prm_key], records[router_key], records["trainer"]
    # the GPU split reached each process
    assert trainer["env"] == {"CUDA_VISIBLE_DEVICES": "0,1", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}
    assert policy["cvd"] == "2" and prm["cvd"] == "3"
    # each component got its own process group
    assert policy["pgid"] == policy["pid"] and router["pgid"] == router["pid"]
    # the trainer started only after the router and every worker were healthy
    assert trainer["urls"]["policy.urls"] == [f"http://127.0.0.1:{base}"]
    assert trainer["urls"]["policy.worker_urls"] == [f"http://127.0.0.1:{base + 100}"]
    assert trainer["urls"]["gateway.judge_urls"] == [f"http://127.0.0.1:{base + 200}"]
    assert all(trainer["healthy_at_start"].values()), trainer["healthy_at_start"]
    # one generated key: every worker and the router require it, the trainer has it in its environment
    key = trainer["pool_key"]
    assert re.fullmatch(r"[0-9a-f]{64}", key), key
    assert all(flag(r["argv"], "--api-key") == key for r in (policy, prm, router))
    assert "--api-key" not in trainer["argv"] and key not in " ".join(trainer["argv"])
    # logs per component, each opening with its command line (the key redacted)
    logs = tmp_path / "run" / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["policy0.log", "prm0.log", "router.log", "trainer.log"]
    assert (logs / "policy0.log").read_text().startswith("# env CUDA_VISIBLE_DEVICES=2 ")
    assert all(key not in p.read_text() for p in logs.iterdir()) and key not in res.stdout + res.stderr
    assert "fake trainer started" in (logs / "trainer.log").read_text()
    # on exit every started process group is gone (children too); the bystander is untouched
    started = [r[k] for r in (policy, prm, router) for k in ("pid", "child_pid")]
    assert wait_gone(started) == []
    assert bystander.poll() is None


def test_sigterm_stops_trainer_first_then_the_rest(tmp_path, bystander):
    fakes = make_fakes(tmp_path)
    base = free_port_block(1)
    env = fake_env(tmp_path, fakes, base, FAKE_TRAINER_MODE="wait")
    proc = subprocess.Popen([BASH, str(SINGLE)], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        trainer_record = tmp_path / "records" / "trainer.json"
        while not trainer_record.exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "trainer never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, stderr
    assert "received SIGTERM" in stderr
    records = read_records(tmp_path / "records")
    trainer = records["trainer"]
    # when the trainer got SIGTERM, the router and workers were still serving
    assert trainer.get("healthy_at_sigterm") and all(trainer["healthy_at_sigterm"].values()), trainer
    started = [r[k] for name, r in records.items() if name != "trainer" for k in ("pid", "child_pid")]
    assert wait_gone(started + [trainer["pid"]]) == []
    assert bystander.poll() is None


def test_worker_dying_before_healthy_is_reported_with_its_log(tmp_path):
    fakes = make_fakes(tmp_path)
    base = free_port_block(1)
    env = fake_env(tmp_path, fakes, base, FAKE_FAIL_PORT=str(base + 100))
    res = run_script(SINGLE, env=env)
    assert res.returncode != 0
    assert "policy0 exited before it became healthy" in res.stderr
    assert "CUDA out of memory (fake)" in res.stderr  # the tail of its log
    records = read_records(tmp_path / "records")
    assert "trainer" not in records and f"router-127.0.0.1-{base}" not in records
    # prm0 was started alongside (it may not have got as far as its record) and then stopped
    assert "stopping prm0" in res.stderr
    prm_words = ["sglang.launch_server", "--port", str(base + 200)]
    deadline = time.monotonic() + 10
    while processes_with_argv(prm_words) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with_argv(prm_words) == []


def test_busy_port_is_named(tmp_path):
    fakes = make_fakes(tmp_path)
    base = free_port_block(1)
    env = fake_env(tmp_path, fakes, base)
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", base + 100))
        holder.listen()
        res = run_script(SINGLE, env=env)
    assert res.returncode != 0
    assert f"port {base + 100} (policy0) cannot be bound on 127.0.0.1" in res.stderr, res.stderr
    assert not (tmp_path / "records").exists() or not list((tmp_path / "records").iterdir())


def test_gpu_count_checked_against_nvidia_smi(tmp_path):
    fakes = make_fakes(tmp_path)  # the fake nvidia-smi lists 4 GPUs
    env = fake_env(tmp_path, fakes, free_port_block(1), NUM_GPUS="8", TRAINER_GPUS="4", POLICY_GPUS="2",
                   PRM_GPUS="2")
    res = run_script(SINGLE, env=env)
    assert res.returncode != 0
    assert "the split needs 8 GPUs but nvidia-smi lists 4" in res.stderr, res.stderr


def test_multi_node_real_run_two_nodes_on_loopback_addresses(tmp_path, bystander):
    """Two "nodes" on one machine (127.0.0.1 and 127.0.0.2), both scripts running at once."""
    fakes = make_fakes(tmp_path)
    base = free_port_block(2)
    assert port_free(base + 2)
    procs = []
    try:
        for rank, addr in ((1, "127.0.0.2"), (0, "127.0.0.1")):
            env = fake_env(tmp_path, fakes, base, NNODES="2", NODE_RANK=str(rank), NODE_ADDRS="127.0.0.1,127.0.0.2",
                           GPUS_PER_NODE="4", SGLANG_HOST=addr, ROUTER_HOST="127.0.0.1",
                           JAX_COORDINATOR_PORT=str(base + 2), FAKE_TRAINER_MODE="sleep:1.5")
            del env["NUM_GPUS"]
            procs.append(subprocess.Popen([BASH, str(MULTI)], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        results = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err
    records = read_records(tmp_path / "records")
    policy_urls = [f"http://{a}:{base + 100}" for a in ("127.0.0.1", "127.0.0.2")]
    prm_urls = [f"http://{a}:{base + 200}" for a in ("127.0.0.1", "127.0.0.2")]
    router = records[f"router-127.0.0.1-{base}"]
    assert router["argv"][router["argv"].index("--worker-urls") + 1:][:2] == policy_urls
    assert not any(k.startswith("router-127.0.0.2") for k in records)
    for addr in ("127.0.0.1", "127.0.0.2"):
        assert records[f"sglang-{addr}-{base + 100}"]["cvd"] == "2"
        assert records[f"sglang-{addr}-{base + 200}"]["cvd"] == "3"
    for rank in (0, 1):
        trainer = records[f"trainer-{rank}"]
        assert trainer["env"] == {"CUDA_VISIBLE_DEVICES": "0,1", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9",
                                  "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{base + 2}", "JAX_NUM_PROCESSES": "2",
                                  "JAX_PROCESS_ID": str(rank)}
        assert trainer["urls"] == {"policy.urls": [f"http://127.0.0.1:{base}"], "policy.worker_urls": policy_urls,
                                   "gateway.judge_urls": prm_urls}
        # every worker of both nodes (and, for process 0, the router) was up before a trainer process started
        up = trainer["healthy_at_start"]
        assert all(ok for u, ok in up.items() if rank == 0 or u in policy_urls + prm_urls), up
        logs = tmp_path / "run" / "logs" / f"node{rank}"
        expected = {"policy0.log", "prm0.log", "trainer.log"} | ({"router.log"} if rank == 0 else set())
        assert {p.name for p in logs.iterdir()} == expected
    # both nodes use the one key the first of them wrote to the shared RUN_DIR (mode 600)
    key_file = tmp_path / "run" / ".pool_api_key"
    key = key_file.read_text()
    assert key_file.stat().st_mode & 0o777 == 0o600 and re.fullmatch(r"[0-9a-f]{64}", key)
    assert {records[f"trainer-{rank}"]["pool_key"] for rank in (0, 1)} == {key}
    assert all(flag(r["argv"], "--api-key") == key for name, r in records.items() if not name.startswith("trainer"))
    started = [r[k] for name, r in records.items() if not name.startswith("trainer") for k in ("pid", "child_pid")]
    assert wait_gone(started) == []
    assert bystander.poll() is None


# ---------------------------------------------------------------------------------- config contract


@pytest.mark.parametrize("extra_env", [{}, {"LAYOUT": "colocated"}, {"POLICY_GPUS": "3", "PRM_GPUS": "1",
                                                                    "TRAINER_GPUS": "4"}])
def test_single_node_trainer_command_is_a_valid_experiment_config(extra_env):
    """The trainer command the launcher prints must load with our real config schema."""
    from openclaw_jax.config import load_experiment_config

    res = run_script(SINGLE, "--dry-run", env={**os.environ, **extra_env})
    assert res.returncode == 0, res.stderr
    trainer = next(a for a in parse_dry_run(res.stdout) if a.kind == "run" and a.name == "trainer")
    config_file = trainer.argv[4]
    words = trainer.argv[5:]
    cfg = load_experiment_config([REPO / config_file if not os.path.isabs(config_file) else config_file], words)
    assert cfg.policy.mode == "external"
    assert cfg.policy.worker_urls and cfg.gateway.judge == "model" and cfg.gateway.judge_urls
