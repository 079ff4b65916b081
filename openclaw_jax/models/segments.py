"""Segment ids of packed rows, shared by the attention kernels and the (NumPy-only) batchers.

A row packs several sequences, each its own segment (1, 2, ...; 0 is padding): a query sees only
keys of its own segment. `SHARED_SEGMENT` marks keys every segment of the row sees: a prompt prefix
written once for all the sequences after it (a sample's hint candidates, a batch's system prompt, the
cached prefix of packed continuations).
"""

SHARED_SEGMENT = -1
