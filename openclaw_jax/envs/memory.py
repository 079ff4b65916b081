"""Remembering instead of training: the person's corrections kept as notes in OpenClaw's own memory.

OpenClaw keeps what it knows about its user in `USER.md` in the agent's workspace ("stable preferences
... written as directives", its user-model layer) and puts the file in front of the model at the start
of every session, under its system prompt's Project Context (`agents.defaults.skipBootstrap` only stops
OpenClaw from creating the file; an existing one is injected). `CorrectionNotes` writes that file from
the same information the trainer gets: the hints the judge accepted from the person's corrections, as
the gateway stored them with each sample. A hint is split into its sentences ("9 + 2 should be 11, not
12. Please keep your answer under 60 characters." is two notes); the notes kept are the distinct ones
the person gave most often, the most recent first among equals, at most `max_notes` and within
OpenClaw's 4,000-character USER.md budget (`rank_notes`). Nothing trains: this is the memory baseline
the learning methods are measured against (the upstream comparison is with Mem0 and Cognee).
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

from openclaw_jax.samples import SampleTail

log = logging.getLogger(__name__)

NOTES_FILE = "USER.md"
USER_MD_MAX_CHARS = 4000   # OpenClaw's fixed budget for USER.md (docs/concepts/user-model.md)
NOTES_HEADER = "What this person asked for when correcting earlier answers (most often asked first):"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def hint_sentences(hint: str) -> list[str]:
    """The sentences of one accepted hint, whitespace-normalised, empty ones dropped."""
    return [s for s in (" ".join(part.split()) for part in _SENTENCE_END.split(hint.strip())) if s]


def rank_notes(hints: Sequence[str], max_notes: int, max_chars: int = USER_MD_MAX_CHARS) -> list[str]:
    """Distinct sentences of `hints` (in the order they were given), most often given first, ties
    broken by the most recent; at most `max_notes`, and only as many as fit `max_chars` once rendered."""
    if max_notes < 1:
        raise ValueError(f"max_notes={max_notes} must be >= 1")
    sentences = [s for h in hints for s in hint_sentences(h)]
    counts = Counter(sentences)
    last = {s: i for i, s in enumerate(sentences)}
    ranked = sorted(counts, key=lambda s: (-counts[s], -last[s]))
    notes: list[str] = []
    for note in ranked[:max_notes]:
        if len(render_notes(notes + [note])) > max_chars:
            break
        notes.append(note)
    return notes


def render_notes(notes: Sequence[str]) -> str:
    """The USER.md text: a header line, then one note per line ("" without notes)."""
    return "\n".join([NOTES_HEADER, *notes]) + "\n" if notes else ""


class CorrectionNotes:
    """Keeps `<workspace>/USER.md` in step with the hints in the sample store at `store_dir`.

    `refresh()` reads the samples appended since its last call and rewrites the file (atomically) when
    the notes change; call it before each round of sessions, so every new session starts with them."""

    def __init__(self, store_dir: str | os.PathLike, workspace: str | os.PathLike, max_notes: int):
        if max_notes < 1:
            raise ValueError(f"max_notes={max_notes} must be >= 1")
        self.store_dir = Path(store_dir)
        self.path = Path(workspace) / NOTES_FILE
        self.max_notes = max_notes
        self.hints: list[str] = []
        self.notes: list[str] = []
        self._tail: SampleTail | None = None

    def add_hints(self, hints: Iterable[str]) -> bool:
        """Take `hints` (in the order given) into account; rewrite the file if the notes changed."""
        self.hints.extend(hints)
        notes = rank_notes(self.hints, self.max_notes)
        if notes == self.notes:
            return False
        self.notes = notes
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(render_notes(notes))
        tmp.replace(self.path)
        log.info("OpenClaw memory (%s): %d notes from %d hints", self.path, len(notes), len(self.hints))
        return True

    def refresh(self) -> bool:
        """Read the new samples' accepted hints; True when the notes changed."""
        if self._tail is None:
            if not self.store_dir.is_dir():  # the gateway creates the store with its first sample
                return False
            self._tail = SampleTail(self.store_dir)
        start, end = self._tail.position, self._tail.refresh()
        if end <= start:
            return False
        samples = self._tail.read(start, end)
        return self.add_hints(h for s in samples for h in s.hints)

    def close(self) -> None:
        if self._tail is not None:
            self._tail.close()
            self._tail = None
