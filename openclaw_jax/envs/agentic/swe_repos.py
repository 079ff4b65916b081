"""The SWE environment's repositories: small correct functions, their tests, and one-line bugs.

A repository is one function (`lib.py`) with one of its bugs injected and the function's tests
(`test_lib.py`, one test per expression). The table is functions x bug kinds rather than hand-written
near-copies: a function carries 1-3 alternative bugs, so the training split sees the same function
broken in different ways. Held-out functions never appear in training, with any of their bugs.
Every bug breaks at least one test and most leave some passing, so a shaped reward has room between
"nothing fixed" and "all pass" (tests/envs/agentic/test_swe_env.py checks both for every repository).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

BUG_KINDS = {
    "comparison": "a comparison or membership test flipped or loosened",
    "off_by_one": "a range or bound off by one",
    "operator": "a wrong arithmetic operator",
    "constant": "a wrong constant or initial value",
    "index": "a wrong index or slice",
    "return": "a wrong value returned",
    "variable": "a wrong variable used",
}


@dataclass(frozen=True)
class Bug:
    kind: str
    good: str     # the correct line, stripped of its indentation
    bad: str      # what replaces it (same indentation)


@dataclass(frozen=True)
class Function:
    name: str
    source: str
    tests: tuple[str, ...]    # boolean expressions over the function; each becomes one test
    bugs: tuple[Bug, ...]

    def buggy_source(self, bug: Bug) -> str:
        lines = self.source.splitlines(keepends=True)
        i = next(k for k, line in enumerate(lines) if line.strip() == bug.good)
        lines[i] = lines[i].replace(bug.good, bug.bad, 1)
        return "".join(lines)


@dataclass(frozen=True)
class Repository:
    function: Function
    bug: Bug

    @property
    def key(self) -> str:
        return f"{self.function.name}/{self.bug.kind}"

    @property
    def buggy_source(self) -> str:
        return self.function.buggy_source(self.bug)


def _function(name: str, source: str, tests: list[str], *bugs: tuple[str, str, str]) -> Function:
    fn = Function(name, source.lstrip("\n"), tuple(tests), tuple(Bug(*b) for b in bugs))
    _check(fn)
    return fn


def _check(fn: Function) -> None:
    """The table's invariants that strings can show (behaviour is checked by the tests): the fix and
    the bug are each one unambiguous edit, so a demonstration's `edit_file` hits the right line."""
    if len(fn.tests) < 3 or not 1 <= len(fn.bugs) <= 3:
        raise ValueError(f"swe repository {fn.name}: needs >= 3 tests and 1-3 bugs, has {len(fn.tests)} and "
                         f"{len(fn.bugs)}")
    kinds = [b.kind for b in fn.bugs]
    for bug in fn.bugs:
        where = f"swe repository {fn.name}, bug {bug.kind} ({bug.good!r} -> {bug.bad!r})"
        if bug.kind not in BUG_KINDS or kinds.count(bug.kind) > 1:
            raise ValueError(f"{where}: the kind must be one of {sorted(BUG_KINDS)} and used once per function")
        whole_lines = [line for line in fn.source.splitlines() if line.strip() == bug.good]
        if len(whole_lines) != 1 or fn.source.count(bug.good) != 1:
            raise ValueError(f"{where}: the correct line must occur exactly once in the source, as a whole line")
        if bug.bad == bug.good or fn.buggy_source(bug).count(bug.bad) != 1:
            raise ValueError(f"{where}: the buggy text must differ from the correct one and occur once in the "
                             "buggy source; pick a more specific line")


FUNCTIONS: tuple[Function, ...] = (
    _function("total", """
def total(xs):
    s = 0
    for x in xs:
        s += x
    return s
""", ["total([1, 2, 3]) == 6", "total([]) == 0", "total([5]) == 5", "total([-2, 2]) == 0"],
        ("operator", "s += x", "s -= x"), ("return", "return s", "return x")),
    _function("is_even", """
def is_even(n):
    return n % 2 == 0
""", ["is_even(4)", "not is_even(7)", "is_even(0)", "not is_even(-3)"],
        ("constant", "return n % 2 == 0", "return n % 3 == 0")),
    _function("largest", """
def largest(xs):
    best = xs[0]
    for x in xs:
        if x > best:
            best = x
    return best
""", ["largest([3, 9, 2]) == 9", "largest([-1, -5]) == -1", "largest([4]) == 4", "largest([1, 2, 3]) == 3"],
        ("comparison", "if x > best:", "if x < best:"), ("index", "best = xs[0]", "best = xs[1]")),
    _function("vowels", """
def vowels(s):
    n = 0
    for ch in s:
        if ch in 'aeiou':
            n += 1
    return n
""", ["vowels('banana') == 3", "vowels('xyz') == 0", "vowels('you') == 2", "vowels('queue') == 4"],
        ("constant", "if ch in 'aeiou':", "if ch in 'aeio':"),
        ("comparison", "if ch in 'aeiou':", "if ch not in 'aeiou':")),
    _function("factorial", """
def factorial(n):
    out = 1
    for i in range(2, n + 1):
        out *= i
    return out
""", ["factorial(5) == 120", "factorial(0) == 1", "factorial(3) == 6", "factorial(1) == 1"],
        ("off_by_one", "for i in range(2, n + 1):", "for i in range(2, n):"), ("operator", "out *= i", "out += i")),
    _function("reverse", """
def reverse(s):
    return s[::-1]
""", ["reverse('abc') == 'cba'", "reverse('') == ''", "reverse('a') == 'a'", "reverse('ab') == 'ba'"],
        ("index", "return s[::-1]", "return s[::1]")),
    _function("mean", """
def mean(xs):
    return sum(xs) / len(xs)
""", ["mean([2, 4]) == 3", "mean([5]) == 5", "mean([1, 2, 3, 4]) == 2.5", "mean([0, 0]) == 0"],
        ("operator", "return sum(xs) / len(xs)", "return sum(xs) // len(xs)"),
        ("off_by_one", "return sum(xs) / len(xs)", "return sum(xs) / (len(xs) + 1)")),
    _function("last", """
def last(xs):
    return xs[-1]
""", ["last([1, 2, 3]) == 3", "last([7]) == 7", "last('abc') == 'c'", "last([0, 0]) == 0"],
        ("index", "return xs[-1]", "return xs[0]")),
    _function("square", """
def square(x):
    return x * x
""", ["square(3) == 9", "square(-2) == 4", "square(2) == 4", "square(0) == 0"],
        ("operator", "return x * x", "return x + x")),
    _function("count_positive", """
def count_positive(xs):
    n = 0
    for x in xs:
        if x > 0:
            n += 1
    return n
""", ["count_positive([1, -2, 3]) == 2", "count_positive([]) == 0", "count_positive([0, 5]) == 1",
      "count_positive([-1]) == 0"],
        ("comparison", "if x > 0:", "if x >= 0:"), ("constant", "n = 0", "n = 1")),
    _function("argmax", """
def argmax(xs):
    best = 0
    for i in range(1, len(xs)):
        if xs[i] > xs[best]:
            best = i
    return best
""", ["argmax([3, 9, 2]) == 1", "argmax([5]) == 0", "argmax([1, 2, 3]) == 2", "argmax([7, 1]) == 0"],
        ("off_by_one", "for i in range(1, len(xs)):", "for i in range(1, len(xs) - 1):"),
        ("comparison", "if xs[i] > xs[best]:", "if xs[i] < xs[best]:")),
    _function("find", """
def find(xs, target):
    for i in range(len(xs)):
        if xs[i] == target:
            return i
    return -1
""", ["find([4, 5, 6], 5) == 1", "find([], 3) == -1", "find([1, 2], 9) == -1", "find([7, 7], 7) == 0"],
        ("constant", "return -1", "return 0"), ("return", "return i", "return xs[i]"),
        ("comparison", "if xs[i] == target:", "if xs[i] != target:")),
    _function("power", """
def power(b, e):
    out = 1
    for _ in range(e):
        out *= b
    return out
""", ["power(2, 3) == 8", "power(5, 0) == 1", "power(3, 1) == 3", "power(1, 4) == 1"],
        ("off_by_one", "for _ in range(e):", "for _ in range(e - 1):"), ("constant", "out = 1", "out = b"),
        ("operator", "out *= b", "out += b")),
    _function("distance", """
def distance(a, b):
    return abs(a - b)
""", ["distance(3, 5) == 2", "distance(5, 3) == 2", "distance(0, 0) == 0", "distance(-1, 1) == 2"],
        ("operator", "return abs(a - b)", "return abs(a + b)")),
    _function("initials", """
def initials(name):
    return ''.join(w[0] for w in name.split())
""", ["initials('ada lovelace') == 'al'", "initials('x') == 'x'", "initials('') == ''", "initials('a b c') == 'abc'"],
        ("index", "return ''.join(w[0] for w in name.split())", "return ''.join(w[-1] for w in name.split())")),
    _function("diffs", """
def diffs(xs):
    out = []
    for i in range(len(xs) - 1):
        out.append(xs[i + 1] - xs[i])
    return out
""", ["diffs([1, 4, 9]) == [3, 5]", "diffs([5]) == []", "diffs([]) == []", "diffs([2, 2]) == [0]"],
        ("operator", "out.append(xs[i + 1] - xs[i])", "out.append(xs[i + 1] + xs[i])"),
        ("off_by_one", "for i in range(len(xs) - 1):", "for i in range(len(xs)):")),
    _function("longest_word", """
def longest_word(s):
    best = ''
    for w in s.split():
        if len(w) > len(best):
            best = w
    return best
""", ["longest_word('a bb ccc') == 'ccc'", "longest_word('') == ''", "longest_word('hi yo') == 'hi'",
      "longest_word('zzz y') == 'zzz'"],
        ("comparison", "if len(w) > len(best):", "if len(w) >= len(best):"), ("return", "return best", "return w"),
        ("variable", "best = w", "best = s")),
    _function("middle", """
def middle(xs):
    return xs[len(xs) // 2]
""", ["middle([1, 2, 3]) == 2", "middle([5]) == 5", "middle([1, 2, 3, 4, 5]) == 3", "middle([4, 8]) == 8"],
        ("constant", "return xs[len(xs) // 2]", "return xs[len(xs) // 3]")),
    # held out (HELDOUT_FUNCTIONS): bugs of the kinds above in functions training never shows
    _function("fib", """
def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
""", ["fib(1) == 1", "fib(6) == 8", "fib(0) == 0", "fib(2) == 1"],
        ("operator", "a, b = b, a + b", "a, b = b, a - b"), ("return", "return a", "return b"),
        ("constant", "a, b = 0, 1", "a, b = 1, 1")),
    _function("clamp", """
def clamp(x, lo, hi):
    if x < lo:
        x = lo
    if x > hi:
        x = hi
    return x
""", ["clamp(5, 0, 3) == 3", "clamp(-2, 0, 3) == 0", "clamp(2, 0, 3) == 2", "clamp(3, 0, 3) == 3"],
        ("variable", "if x > hi:", "if x > lo:"), ("return", "return x", "return hi")),
    _function("is_sorted", """
def is_sorted(xs):
    for i in range(len(xs) - 1):
        if xs[i] > xs[i + 1]:
            return False
    return True
""", ["is_sorted([1, 2, 2, 5])", "not is_sorted([3, 1])", "is_sorted([])", "not is_sorted([1, 3, 2])"],
        ("comparison", "if xs[i] > xs[i + 1]:", "if xs[i] >= xs[i + 1]:"),
        ("off_by_one", "for i in range(len(xs) - 1):", "for i in range(len(xs) - 2):")),
    _function("dot", """
def dot(xs, ys):
    s = 0
    for i in range(len(xs)):
        s += xs[i] * ys[i]
    return s
""", ["dot([1, 2], [3, 4]) == 11", "dot([], []) == 0", "dot([2], [5]) == 10", "dot([1, 0], [0, 1]) == 0"],
        ("operator", "s += xs[i] * ys[i]", "s += xs[i] + ys[i]"), ("index", "s += xs[i] * ys[i]", "s += xs[i] * ys[0]")),
    _function("count_words", """
def count_words(s):
    return len(s.split())
""", ["count_words('a b c') == 3", "count_words('') == 0", "count_words('a  b') == 2", "count_words('one') == 1"],
        ("constant", "return len(s.split())", "return len(s.split(' '))")),
)
HELDOUT_FUNCTIONS = frozenset({"fib", "clamp", "is_sorted", "dot", "count_words"})


def repositories(split: str, kinds: tuple[str, ...] | None = None) -> list[Repository]:
    """Every (function, bug) repository of `split` ("train" or "heldout"), optionally only bugs of `kinds`."""
    return [Repository(fn, bug) for fn in FUNCTIONS if (fn.name in HELDOUT_FUNCTIONS) == (split == "heldout")
            for bug in fn.bugs if kinds is None or bug.kind in kinds]


def unit_test_source(fn: Function) -> str:
    """`test_lib.py`: one test per expression; the assertion message repeats the expression, so a failing
    run says which behaviour broke."""
    return f"from lib import {fn.name}\n\n\n" + "".join(
        f"def test_{fn.name}_{k}():\n    assert {t}, {t!r}\n\n\n" for k, t in enumerate(fn.tests))


def unit_test_names(fn: Function) -> tuple[str, ...]:
    return tuple(f"test_{fn.name}_{k}" for k in range(len(fn.tests)))


@functools.cache
def tests_passing(source: str, tests: tuple[str, ...]) -> tuple[bool, ...]:
    """Which `tests` hold for `source`, run in this process: the table's own code (terminating on every
    bug, which tests/envs/agentic/test_swe_env.py checks), so no sandbox is needed. The shaped reward's baseline."""
    namespace: dict = {}
    exec(compile(source, "lib.py", "exec"), namespace)  # noqa: S102 - the table's code, not an agent's
    passing = []
    for expression in tests:
        try:
            passing.append(bool(eval(expression, dict(namespace))))  # noqa: S307 - the table's code
        except Exception:  # a bug that raises is a failing test, like in the runner
            passing.append(False)
    return tuple(passing)
