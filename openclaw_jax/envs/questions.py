"""Question sources for simulated users and the benchmark, with disjoint train / held-out splits.

Two sources:
  * "gsm": GSM-style word problems from reasoning-gym's offline `gsm_symbolic` generator.
    reasoning-gym seeds item `i` of a dataset built with seed `s` by `Random(s + i)`, so the
    held-out split uses seeds far away from the training seeds (no generator state is shared
    by construction), and the training stream also drops any question text that occurs in the
    held-out pool (a de-duplication check against chance collisions between templates).
  * "arithmetic": tiny synthetic problems ("What is 3 + 4?") for tiny models. The finite space
    of problems is partitioned by a hash of the problem text into train and held-out parts, so
    the splits are disjoint whatever the seed; the seed only chooses and orders problems.

Everything is deterministic given (split, n, seed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import random
from typing import Iterator, Literal

Split = Literal["train", "heldout"]
SPLITS: tuple[str, ...] = ("train", "heldout")
SOURCES: tuple[str, ...] = ("gsm", "arithmetic")


@dataclasses.dataclass(frozen=True)
class Question:
    """One problem. `id` is stable across runs for the same (source, split, seed, position)."""

    id: str
    text: str
    answer: str
    source: str
    split: str
    # the generator's worked solution where it has one (gsm: "28 x 4 = 112 ... #### 20"), else ""
    solution: str = ""

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


# ----------------------------------------------------------------------------- GSM (reasoning-gym)

# reasoning-gym item i of a dataset with seed s uses Random(s + i); keeping every split in its own
# window of 2**40 seeds means no two splits (or two user seeds) ever share an item seed.
_SEED_WINDOW = 2**40
_GSM_TRAIN_BASE = 0
_GSM_HELDOUT_BASE = 2**62
#: the training stream excludes this many held-out questions per seed (asking for a larger
#: held-out set is allowed; its extra questions are still disjoint by seed construction).
GSM_HELDOUT_POOL = 1024
_GSM_TRAIN_CHUNK = 256


def _gsm_items(dataset_seed: int, size: int) -> list[dict]:
    import reasoning_gym  # imported lazily: it pulls in many generators

    return list(reasoning_gym.create_dataset("gsm_symbolic", size=size, seed=dataset_seed))


def _worked_solution(item: dict) -> str:
    return str((item.get("metadata") or {}).get("answer_cot") or "")


def _gsm_window(base: int, seed: int) -> int:
    if not 0 <= seed < 2**20:
        raise ValueError(f"question seed must be in [0, 2**20), got {seed}")
    return base + seed * _SEED_WINDOW


def gsm_heldout(n: int, seed: int = 0) -> list[Question]:
    """The first `n` unique held-out GSM problems for `seed` (a prefix of larger held-out sets)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    out: list[Question] = []
    seen: set[str] = set()
    size = max(n, 1)
    while len(out) < n:
        items = _gsm_items(_gsm_window(_GSM_HELDOUT_BASE, seed), size)
        out.clear()
        seen.clear()
        for i, item in enumerate(items):
            key = _normalise(item["question"])
            if key in seen:
                continue
            seen.add(key)
            out.append(Question(f"gsm/heldout/{seed}/{i}", item["question"], str(item["answer"]), "gsm", "heldout",
                                _worked_solution(item)))
            if len(out) == n:
                break
        size = size * 2  # duplicates inside the window are rare; grow until n unique
    return out


def _gsm_heldout_keys(seed: int) -> frozenset[str]:
    return frozenset(_normalise(q.text) for q in gsm_heldout(GSM_HELDOUT_POOL, seed))


def gsm_train_stream(seed: int = 0) -> Iterator[Question]:
    """Endless stream of unique training GSM problems, none of which is in the held-out pool."""
    banned = _gsm_heldout_keys(seed)
    seen: set[str] = set()
    base = _gsm_window(_GSM_TRAIN_BASE, seed)
    for chunk in itertools.count():
        # Chunk k covers item seeds base + k*C ... base + (k+1)*C - 1: contiguous, never reused.
        items = _gsm_items(base + chunk * _GSM_TRAIN_CHUNK, _GSM_TRAIN_CHUNK)
        for i, item in enumerate(items):
            key = _normalise(item["question"])
            if key in banned or key in seen:
                continue
            seen.add(key)
            idx = chunk * _GSM_TRAIN_CHUNK + i
            yield Question(f"gsm/train/{seed}/{idx}", item["question"], str(item["answer"]), "gsm", "train",
                           _worked_solution(item))


# ----------------------------------------------------------------------------- synthetic arithmetic

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_ARITH_HELDOUT_BUCKETS = 5  # one problem in five (by text hash) is held out


def _arith_is_heldout(text: str) -> bool:
    digest = hashlib.sha256(text.encode()).digest()
    return digest[0] % _ARITH_HELDOUT_BUCKETS == 0


def arithmetic_pool(split: str, max_operand: int = 9, ops: str = "+-") -> list[Question]:
    """All problems of `split` in canonical order ("What is a op b?", 0 <= a, b <= max_operand)."""
    _check_split(split)
    if max_operand < 1:
        raise ValueError(f"max_operand must be >= 1, got {max_operand}")
    unknown = set(ops) - set(_OPS)
    if not ops or unknown:
        raise ValueError(f"ops must be a non-empty string of {''.join(_OPS)}, got {ops!r}")
    out = []
    for op in dict.fromkeys(ops):
        for a in range(max_operand + 1):
            for b in range(max_operand + 1):
                text = f"What is {a} {op} {b}?"
                if _arith_is_heldout(text) == (split == "heldout"):
                    out.append(Question("", text, str(_OPS[op](a, b)), "arithmetic", split))
    return out


def arithmetic_heldout(n: int, seed: int = 0, max_operand: int = 9, ops: str = "+-") -> list[Question]:
    """`n` distinct held-out arithmetic problems chosen by `seed`."""
    pool = arithmetic_pool("heldout", max_operand, ops)
    if n > len(pool):
        raise ValueError(
            f"asked for {n} held-out arithmetic questions but only {len(pool)} exist with "
            f"max_operand={max_operand}, ops={ops!r}; raise max_operand or ask for fewer"
        )
    picked = random.Random(f"arith-heldout:{seed}").sample(pool, n)
    return [dataclasses.replace(q, id=f"arithmetic/heldout/{seed}/{i}") for i, q in enumerate(picked)]


def arithmetic_train_stream(seed: int = 0, max_operand: int = 9, ops: str = "+-") -> Iterator[Question]:
    """Endless stream of training arithmetic problems: reshuffled passes over the train pool."""
    pool = arithmetic_pool("train", max_operand, ops)
    rng = random.Random(f"arith-train:{seed}")
    for epoch in itertools.count():
        order = list(pool)
        rng.shuffle(order)
        for i, q in enumerate(order):
            yield dataclasses.replace(q, id=f"arithmetic/train/{seed}/{epoch}/{i}")


# ----------------------------------------------------------------------------- front door


def heldout_questions(source: str, n: int, seed: int = 0, **options) -> list[Question]:
    """`n` held-out questions of `source` ("gsm" | "arithmetic") for `seed`."""
    if source == "gsm":
        return gsm_heldout(n, seed, **options)
    if source == "arithmetic":
        return arithmetic_heldout(n, seed, **options)
    raise ValueError(f"unknown question source {source!r}; use one of {SOURCES}")


def train_questions(source: str, seed: int = 0, **options) -> Iterator[Question]:
    """Endless training stream of `source` for `seed`, disjoint from `heldout_questions(source, ., seed)`."""
    if source == "gsm":
        return gsm_train_stream(seed, **options)
    if source == "arithmetic":
        return arithmetic_train_stream(seed, **options)
    raise ValueError(f"unknown question source {source!r}; use one of {SOURCES}")
