"""Check the package's import layering with `ast` (no imports of the package itself).

    python scripts/check_layering.py [--root openclaw_jax]

Every `import` / `from ... import` of the package counts, wherever it is written: at module top,
inside functions, in `if __name__ == "__main__":` blocks. Imports under `if TYPE_CHECKING:` never
run, but they are still dependencies a reader follows: they count for the layer rules and for a
cycle of their own ("type-only"), not for the NumPy-only rule.

Checks:
  * no import cycle between files (modules) and none between packages (the first level under the
    root: `envs`, `trainer`, ..., and the top-level modules `config`, `train`, ...), neither of
    imports that run nor of ones that close the cycle under `TYPE_CHECKING`;
  * the layer rules in `FORBIDDEN`;
  * the modules in `NUMPY_ONLY` (the trainer's batcher: host code, run on the input pipeline's
    threads) import no JAX (`JAX_PACKAGES`), neither themselves nor through any module of ours
    they import (their packages' `__init__` included);
  * a separate check: every function (methods and nested functions too, each on its own) at most
    `--max-function-lines` lines long (default 80), from its `def` to its last line; the ones in
    `LONG_FUNCTIONS_PENDING` are reported but do not fail.

Exits 1 and prints each problem when one is found.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

# package (first level under the root) -> packages it must not import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "envs": ("trainer", "gateway", "config"),   # environments take their own config section
    "trainer": ("gateway", "pool"),              # samples/ is the only meeting point with serving
}

# modules that must run without JAX, and what counts as JAX (a module importing one is "jitted")
NUMPY_ONLY: tuple[str, ...] = ("trainer.batcher",)
JAX_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax", "chex")

MAX_FUNCTION_LINES = 80
# over the limit, in files another change is editing right now: reported, not failed, until split
LONG_FUNCTIONS_PENDING: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Edge:
    src: str          # importing module, dotted
    dst: str          # imported module, dotted
    line: int
    type_checking: bool


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """(node, under TYPE_CHECKING) for every import statement, at any depth."""
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, tc = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, tc
            continue
        for child in ast.iter_child_nodes(node):
            stack.append((child, tc or (isinstance(node, ast.If) and _is_type_checking(node.test)
                                        and child in node.body)))


def collect_edges(root: Path) -> tuple[set[str], list[Edge]]:
    modules, edges, _ = collect_imports(root)
    return modules, edges


def collect_imports(root: Path) -> tuple[set[str], list[Edge], dict[str, set[str]]]:
    """(modules, edges between them, each module's runtime imports from outside the package by top-level
    name)."""
    files = sorted(root.rglob("*.py"))
    modules = {module_name(f, root): f for f in files}
    top = root.name
    edges: list[Edge] = []
    external: dict[str, set[str]] = {mod: set() for mod in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        try:
            tree = ast.parse(path.read_text(), filename=str(path))
        except SyntaxError as err:
            raise SystemExit(f"cannot check the layering: {err}") from None
        for node, tc in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                for alias in node.names:
                    sub = f"{prefix}.{alias.name}"
                    targets.append(sub if sub in modules else prefix)
            for t in targets:
                if t != top and not t.startswith(top + "."):
                    if not tc and not (isinstance(node, ast.ImportFrom) and node.level):
                        external[mod].add(t.split(".")[0])
                    continue
                while t not in modules and "." in t:  # `import a.b.name` -> the deepest module
                    t = t.rsplit(".", 1)[0]
                if t in modules and t != mod:
                    edges.append(Edge(mod, t, node.lineno, tc))
    return set(modules), sorted(set(edges), key=lambda e: (e.src, e.line, e.dst)), external


def package_of(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def cycles(nodes: set[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _cycle_problems(kind: str, nodes: set[str], edges: list[Edge], node_of) -> list[str]:
    """Import cycles among `nodes` (`node_of(module)`): those of imports that run, then those a
    `TYPE_CHECKING` import closes (reported as type-only)."""
    problems = []
    runtime_comps: list[list[str]] = []
    for only_runtime in (True, False):
        graph: dict[str, set[str]] = {}
        used = [e for e in edges if not (only_runtime and e.type_checking)]
        for e in used:
            a, b = node_of(e.src), node_of(e.dst)
            if a != b:
                graph.setdefault(a, set()).add(b)
        for comp in cycles(nodes, graph):
            if only_runtime:
                runtime_comps.append(comp)
            elif comp in runtime_comps:
                continue
            inside = [f"{e.src}:{e.line} -> {e.dst}{' (TYPE_CHECKING)' if e.type_checking else ''}" for e in used
                      if node_of(e.src) in comp and node_of(e.dst) in comp and node_of(e.src) != node_of(e.dst)]
            what = f"{kind} import cycle" if only_runtime else f"{kind} type-only import cycle"
            problems.append(f"{what}: " + " <-> ".join(comp) + "\n    " + "\n    ".join(inside))
    return problems


def numpy_only_problems(root: Path, modules: set[str], edges: list[Edge], external: dict[str, set[str]],
                        numpy_only: tuple[str, ...] = NUMPY_ONLY) -> list[str]:
    """A `NUMPY_ONLY` module that reaches a JAX import: the chain of our modules that leads to it."""
    top = root.name
    runtime: dict[str, list[str]] = {}
    for e in edges:
        if not e.type_checking:
            runtime.setdefault(e.src, []).append(e.dst)
    problems = []
    for name in numpy_only:
        start = f"{top}.{name}"
        if start not in modules:   # (a package under test without it)
            continue
        parent = {start: None}
        queue = [start]
        while queue:
            mod = queue.pop(0)
            # importing a module runs its packages' __init__ first
            parts = mod.split(".")
            nexts = runtime.get(mod, []) + [".".join(parts[:i]) for i in range(1, len(parts))]
            for dst in nexts:
                if dst in modules and dst not in parent:
                    parent[dst] = mod
                    queue.append(dst)
            jax_imports = sorted(external.get(mod, set()) & set(JAX_PACKAGES))
            if jax_imports:
                chain = [mod]
                while parent[chain[-1]] is not None:
                    chain.append(parent[chain[-1]])
                problems.append(f"NumPy-only rule: {start} must not import JAX, but imports {jax_imports[0]} through "
                                + " -> ".join(reversed(chain)))
                break
    return problems


def check(root: Path) -> list[str]:
    modules, edges, external = collect_imports(root)
    problems = _cycle_problems("file-level", modules, edges, lambda m: m)
    problems += _cycle_problems("package-level", {package_of(m) for m in modules}, edges, package_of)

    for e in edges:
        banned = FORBIDDEN.get(package_of(e.src), ())
        if package_of(e.dst) in banned and package_of(e.src) != package_of(e.dst):
            problems.append(f"layer rule: {package_of(e.src)}/ must not import {package_of(e.dst)}: "
                            f"{e.src}:{e.line} imports {e.dst}")
    problems += numpy_only_problems(root, modules, edges, external)
    return problems


def function_lengths(root: Path) -> list[tuple[str, int, int]]:
    """(`path::qualified.name`, first line, lines) of every function under `root` (`path` relative to it)."""
    out: list[tuple[str, int, int]] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        stack: list[tuple[ast.AST, str]] = [(ast.parse(path.read_text(), filename=str(path)), "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = prefix + child.name
                    if not isinstance(child, ast.ClassDef):
                        out.append((f"{rel}::{name}", child.lineno, child.end_lineno - child.lineno + 1))
                    stack.append((child, name + "."))
                else:
                    stack.append((child, prefix))
    return sorted(out)


def check_function_lengths(root: Path, limit: int = MAX_FUNCTION_LINES,
                           pending: frozenset[str] = LONG_FUNCTIONS_PENDING) -> tuple[list[str], list[str]]:
    """(problems, notes): the functions over `limit` lines; notes for the pending ones (still over, or split)."""
    problems, notes = [], []
    lengths = function_lengths(root)
    for name, line, n in lengths:
        if n > limit:
            (notes if name in pending else problems).append(
                f"function over {limit} lines: {root.name}/{name.split('::')[0]}:{line} {name.split('::')[1]} "
                f"({n} lines){' (pending: being split elsewhere)' if name in pending else ''}")
    notes += [f"{name} is no longer over {limit} lines: remove it from LONG_FUNCTIONS_PENDING"
              for name, _, n in lengths if name in pending and n <= limit]
    return problems, notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parent.parent / "openclaw_jax"),
                    help="the package directory (default: openclaw_jax beside scripts/)")
    ap.add_argument("--max-function-lines", type=int, default=MAX_FUNCTION_LINES,
                    help=f"the longest a function may be (default {MAX_FUNCTION_LINES})")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    problems = check(root)
    for p in problems:
        print(p)
    print(f"{len(problems)} layering problem(s)" if problems else "layering ok")
    print("NumPy-only (no JAX imported): " + ", ".join(f"{root.name}.{m}" for m in NUMPY_ONLY
                                                      if (root / (m.replace(".", "/") + ".py")).exists()))
    long_ones, notes = check_function_lengths(root, args.max_function_lines)
    for p in long_ones + notes:
        print(p)
    print(f"{len(long_ones)} function(s) over {args.max_function_lines} lines" if long_ones
          else f"function lengths ok (<= {args.max_function_lines} lines)")
    return 1 if problems or long_ones else 0


if __name__ == "__main__":
    sys.exit(main())
