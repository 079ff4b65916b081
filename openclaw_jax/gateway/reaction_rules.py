"""The rule judge's reading of a reaction: a verdict (+1 / -1 / 0) and the hint, from patterns alone.

A leaf module (pure functions, no imports of ours): `judge.RuleJudge` formats what these return as
judge answers. Measured against hand labels by `python -m openclaw_jax.eval.judge_reactions`
(docs/live.md gives the numbers); what a pattern cannot see (a new question that changes the topic,
a correction with no correction words, sarcasm) stays 0 or is missed.

A person's message, in this order:
1. a **correction or complaint** ("wrong", "not quite", "try again", "you forgot", "I meant", "too
   long", a pasted ``SomethingError:``, a leading "no" that is not "no thanks" / "no problem") is -1,
   even beside thanks ("thanks, but that is wrong");
2. **praise with a "but"** after it ("good start, but we're on Python 3") is -1: the criticism after
   the "but" is the verdict;
3. **acceptance** ("thanks", "perfect", "works", "sounds good", "makes sense", ...) is +1 ("thanks
   anyway" is 0: the need was not met, through no fault the words name);
4. **moving on** to the next task ("now send it", "next, ...", "another one") is +1;
5. an **aside** ("for future reference, ...", "FYI ...", "by the way, ...") is 0: information for later,
   no verdict on the reply (its instruction is still the hint);
6. an **instruction** that is not a question ("Please keep it short.", "We use uv here, not pip.") asks
   for a change: -1;
7. anything else is 0.

The hint: the sentences that instruct (at most three; questions other than "shouldn't it be ...?"
are not instructions); failing those, in a correction, what follows the verdict words ("No, that's
wrong. 9 + 2 is 11." gives "9 + 2 is 11."), or a clause of the form "X, not Y".

A tool message: an error pattern ("error", "traceback", "failed", "exit code 1", ...) is -1, else a
success pattern ("success", "passed", "done", "exit code 0", ...) +1, else 0; tools give no hint.
"""

from __future__ import annotations

import re

# --------------------------------------------------------------------------- verdict patterns
_NEGATIVE = re.compile(
    r"\b(wrong|incorrect|not (what|right|correct|quite|helpful|useful|it)|that'?s not|that is not|redo|"
    r"try again|(count|check|look|read) (it )?again|doesn'?t work|didn'?t work|does not work|did not work|"
    r"not working|still (broken|wrong|not|failing|fails)|mistake|broken|fix (it|this|that)|nope|useless|worse|"
    r"you (forgot|missed|ignored|skipped|left out|misread|misunderstood|didn'?t answer)|left out|"
    r"i (meant|said|told you|asked (for|how|what|you|about|which|whether|if))|i'?m asking about|^\s*i mean|"
    r"didn'?t (answer|ask)|just answer|answer (it|the question|my question)|"
    r"too (long|short|formal|informal|verbose|vague|wordy|complicated|complex|technical|much|many)|"
    r"that'?s (off|outdated)|is outdated|doesn'?t exist|make (things|stuff) up|made (that|it|this) up|"
    r"frustrating|annoying|stop (asking|saying|apologi[sz]ing|doing)|shouldn'?t it be|"
    r"crash(ed|es)?|\w{1,60}(Error|Exception)|traceback|404s?)\b"
    r"|^\s*no\b(?!\s+(problem|worries|thanks|thank you|idea|rush|need))"
    r"|^\s*(actually|almost|ugh|seriously)\b|^\s*\?{2,}|\bseriously\?",
    re.IGNORECASE)
_POSITIVE = re.compile(
    r"\b(thanks|thank you|thx|ty|cheers|great|perfect|awesome|excellent|brilliant|fantastic|wonderful|amazing|"
    r"super|nice|lovely|works|worked|well done|good (job|enough|start)|looks good|lgtm|that'?s right|"
    r"correct|spot on|appreciated?|fixed it|did it|did the trick|sounds (good|great)|makes sense|sorted|"
    r"(?<!where )(?<!what )(?<!how )(?<!who )(?<!when )(?<!which )exactly|"
    r"love (it|this|that|the)|just what i|that'?s (fine|it|the (one|word))|nailed it|that works)\b",
    re.IGNORECASE)
# "thanks anyway", "no thanks": politeness, not a verdict on the reply
_NEUTRAL_THANKS = re.compile(r"\bthanks?( you)? (anyway|though)\b|^\s*no,? thanks?( you)?\b", re.IGNORECASE)
_CONTRAST = re.compile(r"\b(but|though|although|except|however)\b[,]?\s+(?=\S)", re.IGNORECASE)
# a bare agreement before a "but" ("ok but shorter") objects as praise does
_AGREE_BUT = re.compile(r"^\s*(ok(ay)?|yes|yeah|sure|fine|right)\b[,]?\s+but\s+(?=\S)", re.IGNORECASE)
# "For future reference, ...", "FYI ...": a preference given as information, not as a verdict on this reply
_ASIDE = re.compile(r"^\s*(fyi|for future reference|by the way|btw|just so you know|for the record)\b", re.IGNORECASE)
_MOVE_ON = re.compile(
    r"^\s*(?:(?:ok(?:ay)?|great|good|cool|alright|perfect|thanks)[,.!]*\s+)?(?:now|next|then)\b[,:]?\s+\S"
    r"|\b(another one|one more)\b", re.IGNORECASE)
_TOOL_ERROR = re.compile(
    r"\b(error|errors|exception|traceback|failed|failure|fatal|not found|no such file|permission denied|"
    r"invalid|timed out|timeout|segmentation fault)\b|exit (code|status):? *[1-9]|non-zero exit",
    re.IGNORECASE)
_TOOL_SUCCESS = re.compile(
    r"\b(success|successful|successfully|succeeded|passed|completed|done|ok)\b|exit (code|status):? *0\b",
    re.IGNORECASE)

# --------------------------------------------------------------------------- hint patterns
# A sentence that tells the assistant what to do (or what the person needs) is taken as the hint.
_INSTRUCTION = re.compile(
    r"\b(should|shouldn'?t|must|please|always|never|instead|don'?t|do not|make sure|remember|prefer|avoid|"
    r"need to|needs to|i want|i'd like|i would like|from now on|use|next time|in (the )?future|"
    r"make it|keep it|just (give|write|say|pick|tell)|drop the|tone it|explain it|write it|i need (?=\w)|"
    r"call me|my budget|you (forgot|missed|left out|skipped|ignored)|i told you|i (meant|mean)|i'?m asking about|"
    r"we'?re (on|using))\b",
    re.IGNORECASE)
# "Can you put that in a list?": a polite request to change the reply ("can you redo it?" asks for no change
# in particular: not a hint)
_CHANGE_REQUEST = re.compile(
    r"^\s*(can|could|would) you (please )?(put|make|write|turn|rewrite|format|translate|shorten|use|add|remove|"
    r"drop|change|keep|give|show|explain|list|sort)\b", re.IGNORECASE)
# A question asks; it does not instruct (a correction put as a question still counts).
_QUESTION = re.compile(r"^\s*(what|how|why|when|where|which|who|can|could|would|will|is|are|do|does|did)\b.*\?\s*$",
                       re.IGNORECASE | re.DOTALL)
# The verdict words a correction starts with; what follows them is the correction itself.
_VERDICT_PREFIX = re.compile(
    r"^\s*(?:(?:no|nope|nah|wrong|incorrect|actually|hmm+|ugh|almost|not quite|not right|try again|"
    r"redo (?:this|it|that)|"
    r"that(?:'?s| is) (?:wrong|incorrect|not right|not correct|off|outdated|not what i (?:asked for|wanted|meant))|"
    r"you made a mistake|doesn'?t work|didn'?t work|still (?:wrong|broken))"
    r"\b\s*[,.!:;\u2014\u2013-]*\s*)+",
    re.IGNORECASE)
_X_NOT_Y = re.compile(r"[^,.;!?]{0,200}\S, not [^,.;!?]{1,200}[.!?]?", re.IGNORECASE)
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
# A person's reaction is read up to this many characters: its verdict and instructions come first, and every
# pattern above then runs in time linear in what is read (a pasted log cannot stall the gateway's loop).
MAX_READ_CHARS = 4096


def user_verdict(text: str) -> tuple[int, str]:
    """(+1 / -1 / 0, why) for a person's message (see the module docstring for the order)."""
    text = text[:MAX_READ_CHARS]
    if _NEGATIVE.search(text):
        return -1, "the user corrects or rejects the reply"
    if _objection(text) is not None:
        return -1, "the user accepts part of the reply but objects to the rest"
    if _POSITIVE.search(text) and not _NEUTRAL_THANKS.search(text):
        return 1, "the user accepts the reply"
    if _X_NOT_Y.search(text):
        return -1, "the user corrects a detail"
    if _MOVE_ON.search(text):
        return 1, "the user moves on to the next task"
    if _ASIDE.match(text):
        return 0, "the user adds information for later, with no verdict on the reply"
    if instruction_sentences(text):
        return -1, "the user asks for a change"
    return 0, "the user's message is neutral"


def _objection(text: str) -> str | None:
    """What follows the "but" of praise or agreement ("good start, but we're on Python 3"), or None."""
    agree = _AGREE_BUT.match(text)
    if agree:
        return text[agree.end():]
    positive = _POSITIVE.search(text)
    contrast = _CONTRAST.search(text, positive.end()) if positive else None
    return text[contrast.end():] if contrast else None


def tool_verdict(text: str) -> tuple[int, str]:
    if _TOOL_ERROR.search(text):
        return -1, "the tool reports an error"
    if _TOOL_SUCCESS.search(text):
        return 1, "the tool reports success"
    return 0, "the tool output shows neither success nor error"


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_SPLIT.split(text) if s.strip()]


def instruction_sentences(text: str, limit: int = 3) -> list[str]:
    """The sentences that instruct (not plain questions), at most `limit`."""
    return [s for s in sentences(text)
            if (_INSTRUCTION.search(s) and not _QUESTION.match(s)) or _CHANGE_REQUEST.match(s)][:limit]


def _after_verdict(text: str) -> str:
    """`text` without the verdict words it starts with ("No, that's wrong. 9 + 2 is 11." -> "9 + 2 is 11.")."""
    stripped = _VERDICT_PREFIX.match(text)
    return text[stripped.end():].strip() if stripped else text.strip()


def user_hint(text: str, verdict: int) -> str | None:
    """The hint a person's message carries: its instruction sentences; failing those, in a correction,
    what follows the verdict words, or an "X, not Y" clause. None when there is none."""
    text = text[:MAX_READ_CHARS]
    picked = instruction_sentences(text)
    if picked:  # "Good start, but we're on Python 3." -> "we're on Python 3."
        return " ".join((_objection(s) or s).strip() for s in picked)
    if verdict != -1:
        return None
    objection = _objection(text)
    if objection is not None:
        return _after_verdict(objection) or None
    stripped = _VERDICT_PREFIX.match(text)
    if stripped:
        return _after_verdict(text) or None
    contrast = _X_NOT_Y.search(text)
    return contrast.group(0).strip() if contrast else None
