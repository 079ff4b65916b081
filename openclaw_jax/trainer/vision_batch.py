"""The images of a batch for a vision-language student (QwenVL): host-side, after `batcher.pack`.

Each sample names its images by content hash (`Sample.image_sha256`); their bytes are blobs of the
sample store (`samples.store.read_image`). `attach_images` turns them into the model's patches
(`models.image_processing.process_images`) and adds `pixel_values` to the batch: `[B, N_row, D]`
for the student rows and `[B, C, N_row, D]` for the teacher's candidate rows (a hint prompt shows
the same images), with the batch's grid as `PackedBatch.image_grid`. The grid is a static part of
the jitted phases (`StepSettings.image_grid`): it is the grid of the batch's row with the most images,
and every row's images must be a prefix of it (e.g. episodes of one screen size with different
numbers of screenshots; a shorter row's trailing patches are zeros its placeholders never read, see
`QwenVL.flat_images`). Padding rows and padding candidates take a copy of a real row (their masks
keep them out of the loss). Batches with images are not packed
(no segments, no shared teacher prefix): `pack` them with `BatchSpec(packing=False,
shared_prefix_teacher=False)`; `attach_images` refuses other layouts.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from openclaw_jax.models.image_processing import ImageProcessorConfig, image_token_count, process_images
from openclaw_jax.trainer.batch import PackedBatch


def attach_images(packed: PackedBatch, image_bytes: Callable[[str], bytes], processor: ImageProcessorConfig,
                  image_token_id: int) -> PackedBatch:
    """`packed` with `pixel_values` and `image_grid` when its samples have images (else unchanged)."""
    samples = packed.samples
    if not any(s.image_sha256 for s in samples):
        return packed
    if "segment_ids" in packed.student or "segment_ids" in packed.teacher or "prefix_len" in packed.teacher:
        raise ValueError("a batch with images must not be packed (trainer.packing: false, "
                         "trainer.shared_prefix_teacher: false)")
    pixels, grids = [], []
    for s in samples:
        if not s.image_sha256:
            raise ValueError(f"sample {s.sample_id} has no images but others of its batch have: batch samples with "
                             "the same images' grid together")
        pv, grid = process_images([image_bytes(h) for h in s.image_sha256], processor)
        pixels.append(pv)
        grids.append(tuple(tuple(int(v) for v in g) for g in grid))
    # the batch's grid is its longest row's; every row shows a prefix of it (episodes of one screen size
    # with different numbers of screenshots) and the trailing patches of a shorter row are never read
    grid = max(grids, key=len)
    if any(g != grid[:len(g)] for g in grids):
        raise ValueError(f"the samples' images have grids {sorted(set(grids))}, not prefixes of one: batch samples "
                         "whose images have the same sizes together")
    wants = [sum(image_token_count(g, processor.merge_size) for g in row_grid) for row_grid in grids]
    student = {k: v.copy() for k, v in packed.student.items()}
    b = student["input_ids"].shape[0]
    n_real = len(samples)
    for i in range(n_real):
        have = int(np.sum(student["input_ids"][i] == image_token_id))
        if have != wants[i]:
            raise ValueError(f"sample {samples[i].sample_id}: its prompt holds {have} image tokens (id "
                             f"{image_token_id}) but its images {grids[i]} give {wants[i]}")
    for i in range(n_real, b):   # padding rows: a real row's tokens (their images' tokens included)
        student["input_ids"][i] = student["input_ids"][0]
    n_patches = max(p.shape[0] for p in pixels)
    pixels = [np.concatenate([p, np.zeros((n_patches - p.shape[0], p.shape[1]), p.dtype)]) for p in pixels]
    pv = np.stack(pixels + [pixels[0]] * (b - n_real)).astype(np.float32)
    student["pixel_values"] = pv
    teacher = {k: v.copy() for k, v in packed.teacher.items()}
    mask = teacher["candidate_mask"] > 0
    if mask.any() and teacher["input_ids"].shape[-1] > 0:
        ids = teacher["input_ids"]
        first = tuple(np.argwhere(mask)[0])
        for i in range(ids.shape[0]):
            for j in range(ids.shape[1]):
                if mask[i, j]:
                    have = int(np.sum(ids[i, j] == image_token_id))
                    if have != wants[i]:
                        raise ValueError(f"sample {samples[i].sample_id} candidate {j}: {have} image tokens, its "
                                         f"images give {wants[i]}")
                else:   # a padding candidate: a real candidate's tokens
                    own = np.argwhere(mask[i])
                    ids[i, j] = ids[i, int(own[0][0])] if len(own) else ids[first]
        teacher["pixel_values"] = np.broadcast_to(pv[:, None], (pv.shape[0], ids.shape[1]) + pv.shape[1:]).copy()
    return PackedBatch(student, teacher, list(samples), packed.staleness, dict(packed.kinds), dict(packed.real_tokens),
                       image_grid=grid)
