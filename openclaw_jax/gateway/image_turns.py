"""Turns with images at the gateway (a mixin of :class:`~openclaw_jax.gateway.server.Gateway`).

The gateway never decodes a pixel: each image's width and height come from its header
(`wire.images`, checked against ``gateway.max_image_pixels`` and the per-request limits while the
body is parsed), its vision grid from that size (`grid_of_size`), and the prompt ids from the grids
(`render_prompt_for_grids`, on a worker thread); the policy server decodes the bytes it is sent.
A recorded main turn keeps references to its images, whose bytes wait in the image spool
(image_spool.py) until the turn is scored (then they become blobs of the sample store) or dropped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Sequence

from openclaw_jax.gateway.image_spool import SpooledImage
from openclaw_jax.gateway.protocol import ChatCompletionRequest, bad_request
from openclaw_jax.gateway.sessions import TurnRecord
from openclaw_jax.http.offload import run_heavy
from openclaw_jax.models.image_processing import grid_of_size
from openclaw_jax.models.vision_prompt import render_prompt_for_grids
from openclaw_jax.wire.errors import with_context_advice

logger = logging.getLogger("openclaw_jax.gateway.server")


class ImageTurns:
    """Image prompts, spooling and storing; state lives on the Gateway."""

    cfg: Any
    tokenizer: Any
    image_processor: Any
    spool: Any
    writer: Any

    def _grids(self, req: ChatCompletionRequest) -> list[tuple[int, int, int]]:
        try:
            return [grid_of_size(im.width, im.height, self.image_processor) for im in req.images]
        except ValueError as err:   # e.g. an aspect ratio the vision model cannot take
            raise bad_request(f"an image cannot be served: {err}", param="messages") from None

    async def _render_image_prompt(self, req: ChatCompletionRequest) -> tuple[list[int], list[tuple[int, int, int]]]:
        """A prompt with images (a vision-language policy only): (its ids, each image's grid)."""
        if self.image_processor is None:
            raise bad_request("this gateway's policy reads text only: image_url parts are not served; send text "
                              "content", param="messages")
        if req.stream:
            raise bad_request("a request with images is not streamed yet; send stream=false", param="stream")
        grids = self._grids(req)
        try:
            ids = await run_heavy(render_prompt_for_grids, self.tokenizer, req.messages, grids, self.image_processor,
                                  tools=req.tools, **req.chat_template_kwargs)
        except Exception as err:  # noqa: BLE001 - a template may raise anything for odd conversations
            raise bad_request(f"the messages could not be rendered: {type(err).__name__}: {err}",
                              param="messages") from None
        if len(ids) > self.cfg.max_prompt_tokens:
            raise bad_request(with_context_advice(f"the prompt has {len(ids)} tokens; at most "
                                                  f"{self.cfg.max_prompt_tokens} are accepted (gateway.max_prompt_tokens)."),
                              param="messages")
        return ids, grids

    async def _spool_images(self, person: str, req: ChatCompletionRequest,
                            grids: Sequence[tuple[int, int, int]]) -> tuple[SpooledImage, ...] | None:
        """The request's images into the spool for its turn; None when they do not fit (not trained)."""
        items = [(im.data, SpooledImage(im.sha256, im.mime, len(im.data), tuple(g)))
                 for im, g in zip(req.images, grids)]
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self.spool.put, person, items)
        except OSError as err:
            logger.warning("image spool: %s's images not written (%s); the turn is not trained", person, err)
            return None

    def _release_images(self, record: TurnRecord) -> None:
        """A turn is done with its spooled images (dropped unscored, or stored)."""
        if record.images and self.spool is not None:
            self.spool.release(record.person, record.images)

    def _store_images_now(self, turn: TurnRecord) -> None:
        """The turn's images from the spool into the sample store, durably (blocking)."""
        for ref in turn.images:
            self.writer.store.put_image(self.spool.read(ref))

    async def _hint_prompt_with_images(self, turn: TurnRecord, messages: list[dict[str, Any]]) -> list[int]:
        return await run_heavy(render_prompt_for_grids, self.tokenizer, messages, [im.grid for im in turn.images],
                               self.image_processor, tools=turn.tools, **turn.chat_template_kwargs)
