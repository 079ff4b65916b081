"""The tool-call environment: math solved with a `python` tool (a code interpreter in the sandbox).

Task families (all generated offline, answers checked numerically):
  * `product`: a product of two large numbers ("What is 48213 * 9127?");
  * `sum`: a sum of many multi-digit terms;
  * `bigproduct`: a 7-9 digit by 5-6 digit product (answers up to 15 digits, still exact in a float);
  * `chain`: two dependent steps, "Let x = 48213 * 9127. What is x * d + 5213, where d is the last
    digit of x?" -- see below;
  * `gsm`: GSM-style word problems from reasoning-gym's offline `gsm_symbolic` generator
    (`envs/questions.py`, whose train / held-out splits are disjoint by seed).
The generated families are split into train / held-out by a hash of the problem text, so the two
never share a problem. The answer is the last number in the agent's final (tool-free) message; it
must equal the answer to within 1e-6 relative and 1e-3 absolute, so a big integer counts only when
exact (a bare 1e-6 relative tolerance would pass a 15-digit product guessed to its first 7 digits).

`chain`, and why it is two calls: the only tool runs Python, so no task can *need* two calls -- one
program can always compute step one and feed it to step two. What `chain` does guarantee is that the
second step needs values the question never states: x itself and d, its last digit (d is 2-9, so
the answer is neither x, nor x + c, nor c). An agent either reads x off the first call's output and
calls again with it (the demonstration: call `print(a * b)`, read x, call `print(x * (x % 10) + c)`,
answer -- three turns; the tool takes the digit), or writes the composition in one program, which
the checker accepts too, since it sees only the final number. Either way the product-style habit of
copying the question's numbers into one call does not solve it, which makes it harder than `product`.

`gsm` demonstrations: reasoning-gym keeps each problem's worked solution (`answer_cot`, lines like
"28 x 4 = 112 ... 132 - 112 = 20"). Its equations are read back into Python arithmetic (units and
words dropped, each one checked against the value the solution states), earlier results are
replaced by the expressions that computed them (unless the question itself states that number),
and the demonstration prints the last expression that evaluates to the answer. Problems whose
solution yields no such expression (percentages, algebra with unknowns) have no demonstration.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import operator
import random
import re
from typing import Any, Sequence

from openclaw_jax.envs import questions
from openclaw_jax.envs.agentic.catalog import register_environment
from openclaw_jax.envs.agentic.episode import Environment, NoDemonstration, Task, ToolError, format_tool_call
from openclaw_jax.envs.sandbox import SandboxLimits, run_code

FAMILIES = ("product", "sum", "bigproduct", "chain", "gsm")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    found = _NUMBER.findall(text or "")
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def numbers_match(value: float | None, answer: float) -> bool:
    # relative for float noise (773.9999999999999), capped so that big integers must be exact
    return value is not None and abs(value - answer) <= min(1e-6 * max(1.0, abs(answer)), 1e-3)


def _is_heldout(text: str) -> bool:
    return hashlib.sha256(text.encode()).digest()[0] % 4 == 0


def _generated(family: str, rng: random.Random) -> tuple[str, int, dict[str, Any]]:
    """(question, answer, task data: `expr` for one tool call, `calls` for several)."""
    if family == "product":
        a, b = rng.randint(1000, 99999), rng.randint(100, 9999)
        return f"What is {a} * {b}?", a * b, {"expr": f"{a} * {b}"}
    if family == "sum":
        terms = [rng.randint(100, 9999) for _ in range(rng.randint(4, 6))]
        expr = " + ".join(map(str, terms))
        return f"What is {expr}?", sum(terms), {"expr": expr}
    if family == "bigproduct":
        # <= 999999999 * 999999 < 2**53: the answer (and the agent's number, parsed as a float) is exact
        a, b = rng.randint(10**6, 10**9 - 1), rng.randint(10**4, 10**6 - 1)
        return f"What is {a} * {b}?", a * b, {"expr": f"{a} * {b}"}
    if family == "chain":
        while True:
            a, b, c = rng.randint(1000, 99999), rng.randint(100, 9999), rng.randint(100, 9999)
            x = a * b
            if x % 10 > 1:  # d = 0 or 1 would make the answer c or a * b + c, computable without x
                break
        d = x % 10
        question = f"Let x = {a} * {b}. What is x * d + {c}, where d is the last digit of x?"
        # the second call lets Python take the last digit: read off the printed x by a 135M model, d was
        # wrong in most failed chain episodes (configs/toolcall_hard_cpu.yaml), while copying x was not
        return question, x * d + c, {"calls": [f"{a} * {b}", f"{x} * ({x} % 10) + {c}"]}
    raise ValueError(f"unknown generated family {family!r}")


# ----------------------------------------------------------------------------- gsm worked solutions

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_CURRENCY = re.compile(r"[$€£¥]")
_UNIT_RATIO = re.compile(r"[A-Za-z]+/[A-Za-z]+")        # "orders/day": a unit, not a division
_PER_UNIT = re.compile(r"(?<=\d)\s*/\s*[A-Za-z]+")       # "£195/day": a rate, not a division
_TIMES = re.compile(r"(?<=[\d\s)])[x×](?=[\s\d(])")    # "28 x 4"
_WORDS = re.compile(r"[A-Za-z'’]+")
_ARITH_ONLY = re.compile(r"[\d.+\-*/() ]+")
_STATED = re.compile(r"\s*[$€£¥]?\s*(-?\d[\d,]*(?:\.\d+)?)")
_PLAIN_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_MAX_EXPR_CHARS = 100   # a gsm call of <= ~70 tokens: toolcall_cpu.yaml allows 72 per turn


def _evaluate(expr: str) -> float | None:
    """The value of an arithmetic expression (numbers, + - * /, parentheses), without eval()."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(ast.dump(node))

    try:
        return float(value(ast.parse(expr, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError):
        return None


def _arithmetic(text: str) -> list[str]:
    """Readings of one equation's left side as arithmetic, longest first ("he earns 4 eggs a day for
    48 days for a total of 4*48" -> "4 48 4*48" -> ["4*48"]); the caller keeps the one whose value the
    solution states."""
    if "%" in text:
        return []   # "50% * 50% = 25%": percentages do not read back as Python
    text = _UNIT_RATIO.sub(" ", _CURRENCY.sub("", text))
    text = _PER_UNIT.sub("", text)
    text = re.sub(r"(?<=\d),(?=\d{3})", "", _TIMES.sub("*", text.replace("÷", "/")))
    text = " ".join(_WORDS.sub(" ", text).split())
    starts = [i for i, ch in enumerate(text) if ch in "0123456789(" and (i == 0 or text[i - 1] == " ")]
    return [text[i:] for i in starts
            if _ARITH_ONLY.fullmatch(text[i:]) and re.search(r"\d\s*[-+*/]\s*[\d(]", text[i:])]


def _equations(solution: str):
    """(left side text, stated value) of each "... = <number>" in a worked solution."""
    parts = solution.split("=")
    for left, right in zip(parts, parts[1:]):
        stated = _STATED.match(right)
        if stated:
            # the left side starts after the last clause boundary ("Of the 48 graders, 21 are girls, so 48 - 21")
            yield re.split(r"\.\s|\n|:|;|,\s", left)[-1], float(stated.group(1).replace(",", ""))


def gsm_expression(question: str, solution: str, answer: float) -> str | None:
    """A Python expression computing `answer` from the worked `solution`'s equations, or None."""
    given = {float(n.replace(",", "")) for n in _NUMBER.findall(question)}
    steps: list[tuple[float, str, str]] = []   # (stated value, expression with earlier steps inlined, as written)
    for left, stated in _equations(solution.split("####")[0]):
        # a reading counts when it gives the value the solution states (to 1%: solutions round)
        readings = [e for e in _arithmetic(left)
                    if (v := _evaluate(e)) is not None and abs(v - stated) <= 0.01 * max(1.0, abs(stated))]
        if not readings:
            continue
        expr = readings[0]

        def inline(m: re.Match) -> str:
            x = float(m.group(0))
            if x in given:
                return m.group(0)
            earlier = [e for v, e, _ in steps if abs(v - x) <= 1e-9 * max(1.0, abs(x))]
            return f"({earlier[-1]})" if earlier else m.group(0)

        steps.append((stated, _PLAIN_NUMBER.sub(inline, expr), expr))
    for _, inlined, written in reversed(steps):
        for expr in (inlined, written):   # inlining a rounded intermediate can change the value
            if len(expr) <= _MAX_EXPR_CHARS and numbers_match(_evaluate(expr), answer):
                return expr
    return None


def _gsm_task(q: questions.Question, split: str, seed: int, i: int) -> Task:
    expr = gsm_expression(q.text, q.solution, float(q.answer)) if q.solution else None
    return Task(f"gsm/{split}/{seed}/{i}", q.text, float(q.answer), {"expr": expr} if expr else {}, "gsm")


def _format_answer(answer: float) -> str:
    return str(int(answer)) if float(answer).is_integer() else str(answer)


@register_environment("toolcall")
class ToolCallEnv(Environment):
    system_prompt = "Solve the math problem: compute it with the python tool, then give the answer as a number."
    tools = [{"type": "function", "function": {
        "name": "python", "description": "Run Python code in a sandbox and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python code"}},
                       "required": ["code"]}}}]

    def __init__(self, families: Sequence[str] = ("product", "sum"), sandbox: SandboxLimits | None = None):
        self.families = self.check_families(families, FAMILIES)
        self.sandbox = sandbox or SandboxLimits(timeout_s=5.0, memory_mb=256)

    @classmethod
    def from_config(cls, families: tuple[str, ...], sandbox: SandboxLimits) -> "ToolCallEnv":
        return cls(families or ("product", "sum"), sandbox)

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        self.check_split(split)
        out: list[Task] = []
        per = {f: n // len(self.families) + (i < n % len(self.families)) for i, f in enumerate(self.families)}
        for family, count in per.items():
            if family == "gsm":
                qs = questions.gsm_heldout(count, seed) if split == "heldout" else \
                    [q for _, q in zip(range(count), questions.gsm_train_stream(seed))]
                out += [_gsm_task(q, split, seed, i) for i, q in enumerate(qs)]
                continue
            rng = random.Random(f"{family}/{seed}")
            seen: set[str] = set()
            while len(seen) < count:
                question, answer, data = _generated(family, rng)
                if question in seen or _is_heldout(question) != (split == "heldout"):
                    continue
                seen.add(question)
                out.append(Task(f"{family}/{split}/{seed}/{len(seen) - 1}", question, answer, data, family))
        random.Random(seed).shuffle(out)
        return out

    async def call(self, state: Any, task: Task, name: str, arguments: dict[str, Any]) -> str:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ToolError('python needs {"code": "<python source>"}')
        result = await asyncio.to_thread(run_code, code, "python", self.sandbox)
        if result.timed_out:
            raise ToolError(f"the code timed out after {self.sandbox.timeout_s:g} s")
        if result.exit_code != 0:
            raise ToolError(f"exit code {result.exit_code}\n{result.stderr.strip()[-400:]}")
        return result.stdout.strip() or "(no output: print the value you want to see)"

    async def score(self, state: Any, task: Task, final_text: str) -> float:
        return 1.0 if numbers_match(last_number(final_text), float(task.answer)) else 0.0

    def demonstration(self, task: Task) -> list[str]:
        """One tool call per step (`chain`: two), then the answer."""
        calls = task.data.get("calls") or ([task.data["expr"]] if "expr" in task.data else [])
        if not calls:
            raise NoDemonstration(f"task {task.task_id} ({task.family}) has no demonstration: its worked solution "
                                  "gave no Python expression for the answer")
        return [format_tool_call("python", {"code": f"print({expr})"}) for expr in calls] + \
            [f"The answer is {_format_answer(task.answer)}."]
