"""Which answer form does the hinted teacher teach, and how well can the student compute in it?

Two measurements on the arithmetic questions of the CPU demo, with HF transformers on PyTorch CPU
(independent of the JAX code; needs the test extras: `pip install -e .[test]`):

1. **Accuracy by form.** On every held-out question, the model's answer is forced to begin with a
   form's prefix ("The answer is ", "9 + 2 = ", ...) and continued greedily; the number that
   follows is graded. Also the model's own greedy answer (no prefix, 48 tokens, final number).
2. **What the teacher prefers.** On training questions, the un-hinted student and the hint-
   conditioned teacher (the same weights, the user's correction appended as the gateway appends
   it) score the same correct answer written in each form; the table gives the teacher's minus
   the student's sequence log-probability at the rollout temperature. A positive number is the
   direction on-policy distillation pulls the student.

    python scripts/answer_form_probe.py                       # the packaged SmolLM2-135M-Instruct
    python scripts/answer_form_probe.py --checkpoint runs/cpu_demo/export/step_15
"""
from __future__ import annotations

import argparse
import logging
import random
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openclaw_jax.envs.grading import is_correct, numbers_in, parse_reference, same_number  # noqa: E402
from openclaw_jax.envs.personas import Concise  # noqa: E402
from openclaw_jax.envs.questions import arithmetic_pool  # noqa: E402
from openclaw_jax.gateway.judge import hint_augmented_messages  # noqa: E402

logger = logging.getLogger("answer_form_probe")

# name -> (prefix before the number, text after it), given the question's operands and operator
FORMS = {
    "The answer is N.": (lambda a, op, b: "The answer is ", "."),
    "a op b = N.": (lambda a, op, b: f"{a} {op} {b} = ", "."),
    "a op b is N.": (lambda a, op, b: f"{a} {op} {b} is ", "."),
}
_QUESTION = re.compile(r"^What is (\d+) ([-+]) (\d+)\?$")


def load_model(checkpoint: str | None):
    import torch
    import transformers

    from openclaw_jax.models.gguf import smollm2_gguf_path

    # One thread: the probe usually runs beside training runs, and two threads fighting them for the
    # cores made it several times slower.
    torch.set_num_threads(1)
    if checkpoint:
        tok = transformers.AutoTokenizer.from_pretrained(checkpoint)
        model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    else:
        gguf = smollm2_gguf_path()
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                                  dtype=torch.float32)
    return tok, model.eval()


def _operands(text: str) -> tuple[str, str, str]:
    match = _QUESTION.match(text)
    if match is None:
        raise ValueError(f"not a demo arithmetic question: {text!r}")
    return match.group(1), match.group(2), match.group(3)


def _prompt(tok, messages) -> list[int]:
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok(rendered, add_special_tokens=False).input_ids


def greedy(tok, model, ids: list[int], max_new_tokens: int) -> str:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return tok.decode(out[0, len(ids):], skip_special_tokens=True)


def accuracy_by_form(tok, model) -> dict[str, float]:
    questions = arithmetic_pool("heldout")
    right = {name: 0 for name in [*FORMS, "own greedy answer"]}
    for q in questions:
        a, op, b = _operands(q.text)
        base = _prompt(tok, [{"role": "user", "content": q.text}])
        for name, (prefix, _) in FORMS.items():
            text = greedy(tok, model, base + tok(prefix(a, op, b), add_special_tokens=False).input_ids, 4)
            stated = numbers_in(text)  # the first number after the prefix is the form's result
            right[name] += bool(stated) and same_number(stated[0], parse_reference(q.answer))
        # graded as the held-out evaluation grades it: the final number stated
        right["own greedy answer"] += bool(is_correct(greedy(tok, model, base, 48), q.answer))
    return {name: n / len(questions) for name, n in right.items()}


def _sequence_logprob(model, prompt: list[int], response: list[int], temperature: float) -> float:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return sum(logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(response))


def teacher_preference(tok, model, n_questions: int, temperature: float, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    persona = Concise(max_chars=60, correct=True)
    questions = rng.sample(arithmetic_pool("train"), n_questions)
    shift = {name: [] for name in FORMS}
    for q in questions:
        a, op, b = _operands(q.text)
        wrong = str(int(q.answer) + rng.choice((-2, -1, 1, 2)))
        # The correction the demo's user gives for that wrong answer; its instruction is the hint.
        (hint,) = [r.instruction for r in persona.rules(f"The answer is {wrong}.", q.text, "stop", q.answer)
                   if r.name == "correct"]
        messages = [{"role": "user", "content": q.text}]
        student = _prompt(tok, messages)
        teacher = _prompt(tok, hint_augmented_messages(messages, hint))
        for name, (prefix, suffix) in FORMS.items():
            response = tok(prefix(a, op, b) + q.answer + suffix + tok.eos_token, add_special_tokens=False).input_ids
            shift[name].append(_sequence_logprob(model, teacher, response, temperature)
                               - _sequence_logprob(model, student, response, temperature))
    return {name: statistics.fmean(v) for name, v in shift.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--checkpoint", default=None, help="HF checkpoint dir (default: the packaged SmolLM2-135M-Instruct)")
    p.add_argument("--teacher-questions", type=int, default=32, help="training questions for the teacher probe")
    p.add_argument("--temperature", type=float, default=0.7, help="rollout temperature tau (default 0.7, the demo's)")
    p.add_argument("--seed", type=int, default=0, help="picks the training questions and the wrong answers")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("transformers", "torch", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    if args.teacher_questions < 1:
        p.error(f"--teacher-questions must be >= 1, got {args.teacher_questions}")
    tok, model = load_model(args.checkpoint)
    logger.info("accuracy by form on %d held-out questions", len(arithmetic_pool("heldout")))
    accuracy = accuracy_by_form(tok, model)
    logger.info("teacher preference on %d training questions", args.teacher_questions)
    preference = teacher_preference(tok, model, args.teacher_questions, args.temperature, args.seed)
    print(f"model: {args.checkpoint or 'packaged SmolLM2-135M-Instruct'}")
    print("| answer form | held-out accuracy in this form | teacher - student log-prob (nats) |")
    print("| --- | --- | --- |")
    for name in FORMS:
        print(f"| {name} | {accuracy[name]:.3f} | {preference[name]:+.2f} |")
    print(f"| own greedy answer | {accuracy['own greedy answer']:.3f} | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
