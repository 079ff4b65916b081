"""What an answer's text shows, for the personas' rules: its numbers, sentences, lines, markup and lists.

Pure functions and patterns, no I/O.
"""

from __future__ import annotations

import re

from openclaw_jax.envs.grading import NUMBER_RE

_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])[\"')\]]*\s+")
_WORD_RE = re.compile(r"[A-Za-z]+")


def extract_numbers(text: str) -> list[str]:
    """Numbers in `text`, normalised ("1,200" -> "1200", "3.50" -> "3.5", "7.0" -> "7"), in order."""
    out = []
    for match in NUMBER_RE.finditer(text):
        raw = match.group(0).replace(",", "")
        if "." in raw:
            raw = raw.rstrip("0").rstrip(".")
        if raw in ("-0", ""):
            raw = "0"
        out.append(raw.lstrip("-") or "0")
    return out


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`: split after . ! ? and at line breaks; empty pieces dropped."""
    pieces = []
    for line in text.splitlines():
        for part in _SENTENCE_SPLIT_RE.split(line.strip()):
            if part.strip():
                pieces.append(part.strip())
    return pieces


def word_count(text: str) -> int:
    return len(_WORD_RE.findall(text))


def nonempty_lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


# Markup that a "natural prose" reader does not want. Each entry: (regex, description).
MARKUP_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"#"), "uses '#' headings or markers"),
    (re.compile(r"\*"), "uses '*' (markdown bold, italics or bullets, or * for times)"),
    (re.compile(r"__|~~"), "uses underscore/strike-through emphasis"),
    (re.compile(r"`"), "uses code formatting (backticks or code fences)"),
    (re.compile(r"^\s*\|", re.M), "uses a table"),
    # LaTeX is markup too; a student who wants natural prose cannot read "\frac{a}{b}".
    (re.compile(r"\\[A-Za-z]+|\$\$|\\\(|\\\["), "uses LaTeX markup"),
)
LIST_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^\s*[-+\u2022]\s", re.M), "uses bullet points"),
    (re.compile(r"^\s*\(?\d+[.)]\s", re.M), "uses a numbered list"),
    (re.compile(r"^\s*step\s*\d+\s*[:.)\-]", re.M | re.I), "labels lines as 'Step N:' like a list"),
)
TERMINAL_PUNCT_RE = re.compile(r"[.!?:][\"')\]]*$")
