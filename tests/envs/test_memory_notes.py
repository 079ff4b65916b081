"""OpenClaw's memory as the baseline that does not train (`envs/memory.py`): the person's corrections, as
the judge's accepted hints in a real sample store, kept as notes in the agent's USER.md.

Every expected note list is derived by hand from the hints written: distinct sentences, the most often
given first, the most recent first among equals.
"""

from __future__ import annotations

import pytest

from openclaw_jax.envs.memory import (
    NOTES_FILE,
    NOTES_HEADER,
    USER_MD_MAX_CHARS,
    CorrectionNotes,
    hint_sentences,
    rank_notes,
    render_notes,
)
from openclaw_jax.samples import Sample, SampleStore

SHORT = "Please keep your answer under 60 characters."
NINE = "9 + 2 should be 11, not 12."
FOUR = "4 * 3 should be 12, not 7."


def test_a_hint_is_split_into_its_sentences():
    assert hint_sentences(f"  {NINE}   {SHORT} ") == [NINE, SHORT]
    assert hint_sentences("Please   write\nplain text") == ["Please write plain text"]
    assert hint_sentences("   ") == []


def test_most_often_given_first_then_the_most_recent():
    hints = [f"{NINE} {SHORT}", SHORT, FOUR, f"{FOUR} {SHORT}", "Please write plain text."]
    # counts: SHORT 3, FOUR 2, NINE 1 (first), plain text 1 (last)
    assert rank_notes(hints, max_notes=10) == [SHORT, FOUR, "Please write plain text.", NINE]
    assert rank_notes(hints, max_notes=2) == [SHORT, FOUR]
    assert rank_notes([], max_notes=3) == []
    with pytest.raises(ValueError, match="max_notes=0"):
        rank_notes(hints, max_notes=0)


def test_notes_stay_within_the_character_budget():
    long_notes = [f"Note number {i} " + "x" * 900 + "." for i in range(6)]
    kept = rank_notes(long_notes, max_notes=6)
    assert len(render_notes(kept)) <= USER_MD_MAX_CHARS < len(render_notes(kept + [long_notes[0]]))
    assert len(kept) == 4   # a header line plus four ~915-character lines fit 4,000 characters, five do not


def _sample(i: int, hints: list[str]) -> Sample:
    kind = "opd+rl" if hints else "rl"
    return Sample(session_id=f"s{i}", turn_index=0, kind=kind, reward=-1.0 if hints else 1.0, prompt_ids=[1, 2],
                  response_ids=[3], rollout_logprobs=[-0.5], hints=hints, hint_prompt_ids=[[1, 2, 4]] * len(hints),
                  eval_score=-1 if hints else 1)


def test_user_md_follows_the_hints_in_the_store(tmp_path):
    store_dir, workspace = tmp_path / "samples", tmp_path / "openclaw" / "workspace"
    notes = CorrectionNotes(store_dir, workspace, max_notes=2)
    assert notes.refresh() is False and not (workspace / NOTES_FILE).exists()   # no store yet
    with SampleStore(store_dir) as store:
        store.append(_sample(0, [f"{NINE} {SHORT}"]))
        store.append(_sample(1, []))                # a satisfied turn carries no hint
        assert notes.refresh() is True
        assert (workspace / NOTES_FILE).read_text() == f"{NOTES_HEADER}\n{SHORT}\n{NINE}\n"
        assert notes.refresh() is False             # nothing new
        store.append(_sample(2, [FOUR]))
        store.append(_sample(3, [FOUR]))
        assert notes.refresh() is True              # FOUR (2) now before SHORT (1, given earlier)
        assert (workspace / NOTES_FILE).read_text() == render_notes([FOUR, SHORT])
        store.append(_sample(4, [SHORT]))           # SHORT 2, FOUR 2: SHORT given last
        assert notes.refresh() is True and notes.notes == [SHORT, FOUR]
    notes.close()
