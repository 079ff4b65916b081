"""A chat prompt with images -> (token ids, pixel_values, image_grid_thw) for a Qwen2.5-VL model.

The messages carry one `<|vision_start|><|image_pad|><|vision_end|>` placeholder per image where its
`image_url` part was (`wire.images.extract_images`); the chat template renders them as text, each is
widened to its image's token count (`expand_image_placeholders`, as HF's `Qwen2_5_VLProcessor`),
and the text is tokenized. What a server needs before `QwenVL.prefill_hidden`, and what the sample's
prompt ids then hold.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from openclaw_jax.models.image_processing import ImageProcessorConfig, image_token_count, process_images
from openclaw_jax.models.tokenizer.chat_template import expand_image_placeholders


def render_image_prompt(tokenizer: Any, messages: Sequence[Mapping[str, Any]], images: Sequence[Any],
                        processor: ImageProcessorConfig, **template_kwargs: Any
                        ) -> tuple[list[int], np.ndarray, tuple[tuple[int, int, int], ...]]:
    """(prompt ids with each image's `<|image_pad|>` tokens, pixel_values `[N, D]`, grid per image)."""
    pixel_values, grid = process_images(list(images), processor)
    grid_t = tuple(tuple(int(v) for v in g) for g in grid)
    return render_prompt_for_grids(tokenizer, messages, grid_t, processor, **template_kwargs), pixel_values, grid_t


def render_prompt_for_grids(tokenizer: Any, messages: Sequence[Mapping[str, Any]],
                            grids: Sequence[Sequence[int]], processor: ImageProcessorConfig,
                            **template_kwargs: Any) -> list[int]:
    """The prompt ids of `render_image_prompt` from each image's grid alone (`grid_of_size` of its header's
    width and height): what a server that forwards images needs, without decoding a pixel."""
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False,
                                         **template_kwargs)
    text = expand_image_placeholders(text, [image_token_count(g, processor.merge_size) for g in grids])
    return [int(t) for t in tokenizer.encode(text)]
