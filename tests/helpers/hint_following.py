"""A tiny model warmed up (SFT) to behave like a small instruct model for learning tests.

Without hints it opens an arithmetic answer with "Sure" only rarely; with the persona's hint
in its prompt (exactly as the gateway renders hint-augmented prompts) it opens with "Sure".
So RL has something to find (the rare rewarded opening) and OPD has a teacher that knows the
preference (the hint-conditioned model), as in the method's real setting.
"""

from __future__ import annotations

import random

from openclaw_jax.envs.personas import StartsWith
from openclaw_jax.envs.questions import arithmetic_pool
from openclaw_jax.gateway.judge import NextState, RuleJudge, hint_augmented_messages

OPENINGS = (("Sure! ", 0.2), ("The answer is ", 0.5), ("It is ", 0.3))


def _answer(opening: str, value: str) -> str:
    return f"{opening}{value}."


def warmup_examples(tokenizer, n: int, seed: int, persona: StartsWith):
    """(prompt ids, response ids) pairs: plain prompts with the opening mix, hinted ones with "Sure"."""
    rng = random.Random(seed)
    pool = arithmetic_pool("train")
    judge = RuleJudge()
    eos = tokenizer.eos_token_id
    examples = []
    for _ in range(n):
        q = rng.choice(pool)
        messages = [{"role": "user", "content": q.text}]
        if rng.random() < 0.5:
            opening = rng.choices([o for o, _ in OPENINGS], [w for _, w in OPENINGS])[0]
            prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        else:
            bad = _answer("The answer is ", q.answer)
            reaction = persona.react(q.text, bad, persona.check(bad), rng)
            hints = judge.judge_now(bad, NextState("user", reaction)).hints
            assert hints, f"the rule judge took no hint from {reaction!r}"
            opening = "Sure! "
            prompt = tokenizer.apply_chat_template(hint_augmented_messages(messages, rng.choice(hints)),
                                                   add_generation_prompt=True)
        response = tokenizer.encode(_answer(opening, q.answer)) + [eos]
        examples.append((prompt, response))
    return examples


def make_hint_following_model(out_dir, *, steps: int = 300, batch: int = 32, seed: int = 0):
    """Train the tiny Qwen3-shaped model and save it (HF safetensors + tokenizer) to `out_dir`."""
    from flax import nnx

    from openclaw_jax.models.config import ModelConfig
    from openclaw_jax.models.decoder import Decoder
    from openclaw_jax.models.tokenizer import tiny_test_tokenizer
    from openclaw_jax.models.weights import save_hf_checkpoint
    from openclaw_jax.trainer.sft import SFTTrainer

    tokenizer = tiny_test_tokenizer()
    cfg = ModelConfig(family="qwen3", vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True,
                      tie_word_embeddings=True, max_position_embeddings=512,
                      eos_token_id=tuple(tokenizer.eos_token_ids))
    sft = SFTTrainer(Decoder(cfg, rngs=nnx.Rngs(seed)), lr=3e-3, pad_id=tokenizer.pad_token_id)
    persona = StartsWith("Sure")
    data = warmup_examples(tokenizer, steps * batch, seed, persona)
    losses = [sft.step(data[i * batch:(i + 1) * batch]) for i in range(steps)]
    save_hf_checkpoint(sft.model(), cfg, out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir, losses


if __name__ == "__main__":  # tests/e2e/test_learning.py runs the warm-up in a process with XLA's full optimisation
    import argparse

    parser = argparse.ArgumentParser(description=make_hint_following_model.__doc__)
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    make_hint_following_model(args.out_dir, steps=args.steps, batch=args.batch)
