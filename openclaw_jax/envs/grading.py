"""Task correctness of an answer: the final number it states against the question's known answer.

Pure functions, no I/O. An answer is correct when the *last* number written in it equals the
reference numerically ("10", "10.0", "1,200" and "1200" are the same number; "-4" keeps its
sign). An answer that states no number is wrong. A reference that is not a number cannot be
graded (`None`), so callers can leave such questions out of an accuracy instead of counting them
as wrong.

The last-number rule is lenient in one way a person is not: an answer that only restates the question
("The answer is 2 - 1." for "What is 2 - 1?") is graded right when the question's last operand equals
its result. `right_by_restatement` names those answers, so a measure can leave them out.
"""

from __future__ import annotations

import math
import re
from typing import Iterable

# A number not glued to a word or a decimal point before it: "x2" and ".5." are not numbers,
# "-4", "1,200", "3.50" are. A minus sign counts only when it touches the digits ("= -4"), so
# the operator in "7 - 3" is not a sign.
NUMBER_RE = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?")


def numbers_in(text: str) -> list[float]:
    """Every number written in `text`, in order, as floats ("1,200" -> 1200.0, "-4" -> -4.0)."""
    return [float(m.group(0).replace(",", "")) for m in NUMBER_RE.finditer(text)]


def final_number(text: str) -> float | None:
    """The last number written in `text`, or None when it states none."""
    found = numbers_in(text)
    return found[-1] if found else None


def parse_reference(reference: str | float | int | None) -> float | None:
    """The reference answer as a number; None when it is missing or not a single number."""
    if reference is None:
        return None
    if isinstance(reference, (int, float)):
        return float(reference)
    found = numbers_in(str(reference).strip())
    return found[0] if len(found) == 1 else None


def same_number(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def is_correct(answer: str, reference: str | float | int | None) -> bool | None:
    """Whether the final number of `answer` equals `reference`; None when `reference` is not a number."""
    ref = parse_reference(reference)
    if ref is None:
        return None
    stated = final_number(answer)
    return stated is not None and same_number(stated, ref)


def format_number(value: float) -> str:
    """A number as a person writes it: "10", "-4", "3.5" (no trailing ".0")."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# "What is 9 + 2?": the expression a correction can name (operands and operator)
_ASKED_EXPRESSION = re.compile(r"^\s*What is (-?\d+) ([-+*]) (-?\d+)\?\s*$")


def asked_expression(question: str | None) -> tuple[str, str, str] | None:
    """The (operand, operator, operand) of a question "What is a op b?", else None (a word problem)."""
    asked = _ASKED_EXPRESSION.match(question or "")
    return (asked.group(1), asked.group(2), asked.group(3)) if asked else None


def states_result(answer: str, question: str | None, reference: str | float | int | None) -> bool | None:
    """Whether `answer` writes the reference number anywhere other than inside a restatement of the asked
    expression ("2 - 1 = 1" states it; "The answer is 2 - 1." does not, for "What is 2 - 1?"); None when
    `reference` is not a number. For a question without a plain expression, whether the answer writes it."""
    ref = parse_reference(reference)
    if ref is None:
        return None
    asked = asked_expression(question)
    if asked is not None:
        a, op, b = (re.escape(part) for part in asked)
        # the expression as written, any spacing around the operator, not part of a longer number
        answer = re.sub(rf"(?<![\w.]){a}\s*{op}\s*{b}(?!\d|\.\d)", " ", answer)
    return any(same_number(n, ref) for n in numbers_in(answer))


def right_by_restatement(answer: str, question: str | None, reference: str | float | int | None) -> bool:
    """Whether `answer` is graded right (`is_correct`) only because it restates the asked expression:
    its last number is the reference, but it never writes that number as a result of its own."""
    return bool(is_correct(answer, reference)) and states_result(answer, question, reference) is False


def correction(answer: str, question: str | None, reference: str | float | int | None, *,
               restatement_right: bool = True) -> tuple[bool, str, str] | None:
    """(right, what is wrong, the correction a person gives) for `answer`; None when `reference` is not a
    number. The correction names what was asked when it can ("9 + 2 should be 11, not 12."), else only
    the result ("The answer should be 11."); "should" makes it an instruction a judge takes as the hint.
    With `restatement_right=False` an answer right only by restating the question (`right_by_restatement`)
    is wrong, and the correction names the restatement: "2 - 1 should be 1, not 2 - 1."."""
    right = is_correct(answer, reference)
    if right is None:
        return None
    stated = final_number(answer)
    expected = format_number(parse_reference(reference))
    asked = asked_expression(question)
    subject = " ".join(asked) if asked else "The answer"
    if right and not restatement_right and states_result(answer, question, reference) is False:
        # only an asked expression can be restated, so `asked` is known here
        return (False, "restates the question instead of stating its result",
                f"{subject} should be {expected}, not {subject}.")
    instruction = (f"{subject} should be {expected}, not {format_number(stated)}." if stated is not None
                   else f"{subject} should be {expected}.")
    wrong = "" if right else (f"states {format_number(stated)}, but the answer is {expected}" if stated is not None
                              else f"states no number; the answer is {expected}")
    return right, wrong, instruction


def accuracy(grades: Iterable[bool | None]) -> float:
    """Fraction correct over the gradable answers (None left out); NaN when none is gradable."""
    graded = [g for g in grades if g is not None]
    return sum(graded) / len(graded) if graded else float("nan")
