"""Person ids: who a conversation, and every sample of it, belongs to (docs/household.md).

A person id is 1 to 64 letters, digits and ``. _ @ + -``, starting with a letter or digit (``alice``,
``bob@home``). The gateway takes it from the client's key or its ``X-Person-Id`` header
(gateway/auth.py), the OpenClaw plugin sends its ``personId`` (integrations/openclaw), and each sample
records it. Requests that name nobody, and records written before samples had a person, belong to
``DEFAULT_PERSON``. Imports nothing of ours.
"""

from __future__ import annotations

import re
from typing import Any

DEFAULT_PERSON = "default"
PERSON_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")
PERSON_ID_RULE = "1 to 64 letters, digits and . _ @ + -, starting with a letter or digit"


def check_person_id(person: Any, where: str) -> str:
    """``person`` if it is a person id (see the module docstring); else ValueError naming ``where``."""
    if not isinstance(person, str) or not PERSON_ID.fullmatch(person):
        raise ValueError(f"{where}={str(person)[:80]!r} is not a person id: {PERSON_ID_RULE}")
    return person


def person_tag(person: str) -> str:
    """A person id as one TensorBoard tag part: letters, digits, ``.``, ``_`` and ``-`` as they are, any
    other character (``@``, ``+``: tags cannot hold them) as ``_`` and its two hex digits."""
    return re.sub(r"[^A-Za-z0-9._-]", lambda m: f"_{ord(m.group()):02x}", person)
