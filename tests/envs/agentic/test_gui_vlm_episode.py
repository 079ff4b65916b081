"""Episodes for a vision-language policy on the real GUI environment (Xvfb + the jailed Tk app):
the screenshots go into the prompt as image placeholders widened to their token count, the policy
receives them with every turn, the warm-up's examples carry them, and an SFT step reads the pixels."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json

import numpy as np
import pytest
from flax import nnx

from openclaw_jax.envs.agentic.episode import EpisodeLimits, EpisodeRunner, ScriptedPolicy
from openclaw_jax.envs.agentic.episode import Generation
from openclaw_jax.envs.agentic.gui import GuiEnv
from openclaw_jax.envs.agentic.gui_tasks import HEIGHT, WIDTH
from openclaw_jax.envs.agentic.rollout import demonstrations, episode_sample
from openclaw_jax.models.image_processing import ImageProcessorConfig
from openclaw_jax.models.qwen_vl import QwenVL, QwenVLConfig
from openclaw_jax.models.tokenizer import TINY_VL_IDS, tiny_vl_tokenizer
from openclaw_jax.trainer.sft import SFTTrainer

from tests.helpers.vl_models import tiny_hf_vl_config

PAD = TINY_VL_IDS["<|image_pad|>"]
# a 448x336 screenshot is 16 x 12 cells of 28 px (14 px patches, 2x2 merged): one token per cell
TOKENS_PER_SCREEN = (WIDTH // 28) * (HEIGHT // 28)


@pytest.fixture(scope="module")
def env(require_gui_tools):
    return GuiEnv(reply_timeout_s=10.0)


class Recording(ScriptedPolicy):
    """The demonstration's turns; records what each turn's request carried."""

    def __init__(self, tokenizer, turns):
        super().__init__(tokenizer, turns)
        self.requests: list[tuple[list[int], list[bytes]]] = []

    async def generate(self, input_ids, *, max_new_tokens, temperature, images=()) -> Generation:
        self.requests.append((list(input_ids), list(images)))
        return await super().generate(input_ids, max_new_tokens=max_new_tokens, temperature=temperature)


def runs_of(ids, token) -> list[int]:
    """Lengths of the maximal runs of `token` in `ids`."""
    out, n = [], 0
    for t in list(ids) + [None]:
        if t == token:
            n += 1
        elif n:
            out.append(n)
            n = 0
    return out


def test_screens_reach_the_policy_the_episode_and_its_sample(env):
    from PIL import Image

    tok = tiny_vl_tokenizer()
    runner = EpisodeRunner(env, tok, EpisodeLimits(max_turns=10, max_response_tokens=4096),
                           images=ImageProcessorConfig())
    task = next(t for t in env.tasks("train", 8, 0) if t.family == "form")
    turns = env.demonstration(task)
    policy = Recording(tok, turns)
    ep = asyncio.run(runner.run(task, policy, temperature=0.0))
    assert ep.success and ep.end_reason == "answer"
    actions = len(turns) - 1                      # every turn but the final "Done." acts
    assert len(ep.images) == 1 + actions          # the first screen, then one after each action
    for png in ep.images:
        assert Image.open(io.BytesIO(png)).size == (WIDTH, HEIGHT)
    assert len({hashlib.sha256(p).digest() for p in ep.images}) > 1   # the screen changes as the agent acts
    # one run of the screen's tokens per image: the first in the prompt, one after each observation
    assert runs_of(ep.prompt_ids, PAD) == [TOKENS_PER_SCREEN]
    assert runs_of(ep.prompt_ids + ep.response_ids, PAD) == [TOKENS_PER_SCREEN] * len(ep.images)
    # every turn's request carried the ids so far and exactly the images they show
    assert len(policy.requests) == len(turns)
    for k, (ids, images) in enumerate(policy.requests):
        assert images == ep.images[:k + 1] and ep.turn_images[k] == k + 1
        assert runs_of(ids, PAD) == [TOKENS_PER_SCREEN] * (k + 1)
    # the screenshots are never trained: their tokens sit in the observations (loss mask 0)
    mask = np.asarray(ep.loss_mask)
    assert not mask[np.asarray(ep.response_ids) == PAD].any()
    sample = episode_sample(ep, [1.0] * len(ep.response_ids), group_id="g", index=0, temperature=1.0)
    assert sample.image_sha256 == [hashlib.sha256(p).hexdigest() for p in ep.images]


def test_a_sampled_image_marker_ends_the_episode_without_a_sample(env):
    tok = tiny_vl_tokenizer()
    runner = EpisodeRunner(env, tok, EpisodeLimits(max_turns=3), images=ImageProcessorConfig())
    task = env.tasks("train", 4, 0)[0]
    ep = asyncio.run(runner.run(task, ScriptedPolicy(tok, ["<|image_pad|> here"]), temperature=0.0))
    assert ep.end_reason == "image_token" and not ep.success and ep.response_ids == []


def test_warm_up_examples_carry_their_screens_and_sft_reads_the_pixels(env):
    tok = tiny_vl_tokenizer()
    proc = ImageProcessorConfig()
    runner = EpisodeRunner(env, tok, EpisodeLimits(max_turns=10, max_response_tokens=4096), images=proc)
    tasks = [t for t in env.tasks("train", 8, 1) if t.family in ("button", "copy")][:2]
    examples = asyncio.run(demonstrations(runner, tasks))
    assert len(examples) == sum(len(env.demonstration(t)) for t in tasks)
    for context, turn, images in examples:
        assert runs_of(context, PAD) == [TOKENS_PER_SCREEN] * len(images) and images
        assert PAD not in turn
    cfg = QwenVLConfig.from_hf_dict(tiny_hf_vl_config(vocab_size=324, image=PAD, video=TINY_VL_IDS["<|video_pad|>"],
                                                      vision_start=TINY_VL_IDS["<|vision_start|>"],
                                                      vision_end=TINY_VL_IDS["<|vision_end|>"],
                                                      max_position_embeddings=4096, bos_token_id=0,
                                                      eos_token_id=0).to_dict())
    # rows with one, two and three screens: one batch, each row a prefix of the grid
    batch = [next(e for e in examples if len(e[2]) == n) for n in (1, 2, 3)]
    # the loss reads the pixels: the same tokens with other screens give another loss
    black = [(c, t, [_black_png()] * len(i)) for c, t, i in batch]
    losses = {}
    for name, rows in (("screens", batch), ("black", black)):
        sft = SFTTrainer(QwenVL(cfg, rngs=nnx.Rngs(0)), lr=1e-3, pad_id=tok.pad_token_id, chunk_size=64, images=proc)
        losses[name] = [sft.step(rows) for _ in range(3)]
    assert all(np.isfinite(v).all() for v in losses.values())
    assert losses["screens"][-1] < losses["screens"][0]          # it learns
    assert abs(losses["screens"][0] - losses["black"][0]) > 1e-4  # and the screens matter
    with pytest.raises(ValueError, match="images="):
        SFTTrainer(QwenVL(cfg, rngs=nnx.Rngs(0)), pad_id=tok.pad_token_id).step(batch)


def _black_png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (WIDTH, HEIGHT)).save(buf, format="PNG")
    return buf.getvalue()


def test_env_options_scale_the_screens_the_policy_sees(env):
    """`agentic.env_options` reach the environment: half-size screenshots (a quarter of the image tokens),
    actions still in screen pixels; an option an environment does not take is a clear error."""
    from PIL import Image

    from openclaw_jax.envs.agentic.config import AgenticConfig
    from openclaw_jax.envs.agentic.episode import make_env

    gui = make_env(AgenticConfig(env="gui", families=("button",), env_options={"screenshot_scale": 0.5, "terse": True}))
    assert gui.screenshot_scale == 0.5 and len(gui.system_prompt) < len(GuiEnv.system_prompt)
    tok = tiny_vl_tokenizer()
    runner = EpisodeRunner(gui, tok, EpisodeLimits(max_turns=4, max_response_tokens=1024), images=ImageProcessorConfig(),
                           native_tools=False)
    task = gui.tasks("heldout", 2, 0)[0]
    ep = asyncio.run(runner.run(task, ScriptedPolicy(tok, gui.demonstration(task)), temperature=0.0))
    assert ep.success   # the demonstration's clicks are screen pixels, as the tools say
    assert {Image.open(io.BytesIO(p)).size for p in ep.images} == {(WIDTH // 2, HEIGHT // 2)}
    assert runs_of(ep.prompt_ids + ep.response_ids, PAD) == [TOKENS_PER_SCREEN // 4] * len(ep.images)
    # with a11y the task's message also lists the widgets the application reports, by centre: the
    # demonstration's click is the target's listed centre
    a11y = make_env(AgenticConfig(env="gui", families=("button",),
                                  env_options={"screenshot_scale": 0.5, "terse": True, "a11y": True}))
    runner = EpisodeRunner(a11y, tok, EpisodeLimits(max_turns=4, max_response_tokens=1024),
                           images=ImageProcessorConfig(), native_tools=False)
    ep = asyncio.run(runner.run(task, ScriptedPolicy(tok, a11y.demonstration(task)), temperature=0.0))
    user = ep.messages[1]["content"]
    click = json.loads(a11y.demonstration(task)[0].split("\n")[1])["arguments"]
    assert ep.success and f"{task.answer['press']} {click['x']},{click['y']};" in user.replace(".", ";")
    assert user.count("button_") == len(task.data["app"]["widgets"])
    with pytest.raises(ValueError, match=r"agentic.env_options=\{'zoom': 2\} are not options of the 'gui'"):
        make_env(AgenticConfig(env="gui", env_options={"zoom": 2}))
    with pytest.raises(ValueError, match="are not options of the 'toolcall'"):
        make_env(AgenticConfig(env="toolcall", env_options={"screenshot_scale": 0.5}))
    with pytest.raises(ValueError, match="screenshot_scale=2"):
        GuiEnv(screenshot_scale=2)
