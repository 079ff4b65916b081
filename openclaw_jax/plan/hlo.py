"""FLOPs of the planned programs: matmul FLOPs counted in a compiled HLO module's text (loops by their trip
counts, which XLA's own cost analysis counts once), and the blockwise attention's causal loops, whose trip
counts are known only at run time, estimated from the shapes."""

from __future__ import annotations

import math
import re

_COMP_RE = re.compile(r"^(?:ENTRY\s+)?%(\S+)\s+\((.*)\)\s+->\s+.*\{\s*$")
_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%(\S+)\s+=\s+(\(.*?\)|\S+?)(?:\{[^}]*\})?\s+([\w\-]+)\((.*)$")
_SHAPE_RE = re.compile(r"^[a-z0-9]+\[([0-9,]*)\]")


def _dims(shape: str) -> list[int] | None:
    m = _SHAPE_RE.match(shape)
    if not m:
        return None
    return [int(d) for d in m.group(1).split(",") if d]


def hlo_loops_without_trip_count(hlo_text: str) -> int:
    """While loops whose trip count XLA does not know (e.g. the blockwise attention's causal
    loops, whose bounds depend on the block index): `hlo_matmul_flops` counts their body once."""
    return sum(1 for line in hlo_text.splitlines()
               if re.search(r"\swhile\(", line) and "known_trip_count" not in line)


def hlo_matmul_flops(hlo_text: str) -> float:
    """Matmul FLOPs (2 x output elements x contracted size) of a compiled HLO module; while
    loops count `known_trip_count` times (once when unknown), fusions and calls once per execution."""
    comps: dict[str, list[str]] = {}
    params: dict[str, dict[str, list[int]]] = {}
    entry = None
    current = None
    for line in hlo_text.splitlines():
        m = _COMP_RE.match(line)
        if m:
            current = m.group(1)
            comps[current] = []
            params[current] = {}
            if line.startswith("ENTRY"):
                entry = current
            for p in re.finditer(r"(\S+?):\s+([a-z0-9]+\[[0-9,]*\])", m.group(2)):
                params[current][p.group(1)] = _dims(p.group(2)) or []
            continue
        if current is not None:
            if line.strip() == "}":
                current = None
            else:
                comps[current].append(line)
    memo: dict[str, float] = {}

    def flops(name: str) -> float:
        if name in memo:
            return memo[name]
        memo[name] = 0.0
        shapes = dict(params.get(name, {}))
        total = 0.0
        for line in comps.get(name, []):
            m = _INSTR_RE.match(line)
            if not m:
                continue
            var, shape, op, rest = m.groups()
            dims = _dims(shape)
            if dims is not None:
                shapes[var] = dims
            if op == "dot":
                operands = re.findall(r"%([\w.\-]+)", rest.split(")")[0])
                lhs = shapes.get(operands[0]) if operands else None
                contract = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", rest)
                if lhs is not None and dims is not None and contract:
                    k = math.prod(lhs[int(i)] for i in contract.group(1).split(",") if i)
                    total += 2.0 * math.prod(dims) * k
            elif op == "while":
                body = re.search(r"body=%([\w.\-]+)", rest)
                trip = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', rest)
                if body:
                    total += (int(trip.group(1)) if trip else 1) * flops(body.group(1))
            elif op == "conditional":
                branches = re.findall(r"%([\w.\-]+)", rest.split("branch_computations=")[-1].split("}")[0])
                total += max((flops(b) for b in branches), default=0.0)
            else:
                for callee in re.findall(r"calls=%([\w.\-]+)", rest):
                    total += flops(callee)
        memo[name] = total
        return total

    return flops(entry) if entry else 0.0


def causal_attention_flops_per_token(mcfg, seq_len: int) -> float:
    """Train-step FLOPs per token of the blockwise causal attention kernel (not in the HLO count).

    Per visited (query block, key block) pair and head: forward 2 matmuls (QK^T, PV), recomputed
    once more by the layer remat, backward 5 (QK^T again, dV, dP, dQ, dK): 9 matmuls of
    2 * block^2 * head_dim. A query visits about (seq_len + block) / 2 keys under the causal mask.
    """
    from openclaw_jax.models.attention import default_block_size   # imports JAX: after main's XLA_FLAGS

    block = getattr(mcfg, "attention_block_size", 0) or default_block_size()
    visited = (seq_len + min(block, seq_len)) / 2.0
    return 9 * 2.0 * visited * mcfg.head_dim * mcfg.num_heads * mcfg.num_layers

