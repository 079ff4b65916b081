"""Can the model fix the SWE environment's bugs at all? Three greedy probes of one model, per split.

On every repository of `envs/agentic/swe_repos.py` (train and held-out), with HF transformers on
PyTorch CPU (independent of the JAX code; needs the test extras), the agent's own opening prompt
(system prompt with the tools, the task) and its first turn done for it: `read_file lib.py` with the
buggy file as the tool output. Then the model's greedy continuation of its second turn:

1. **fix the named line**: the `edit_file` call written up to `"old": "<the buggy line>", "new": "`;
   solved when the edited file passes every test (any equivalent fix counts; the environment's own
   edit and test run, in its sandbox: the model's text is untrusted code);
2. **name the line**: the call written up to `"old": "`; right when the text it writes is the buggy
   line (the line a fix has to change);
3. **the whole turn**: nothing written for it; solved when its turn parses as an `edit_file` call
   whose edit makes every test pass (an episode's success if it then answers).

It separates where a policy fails: choosing the line or knowing the fix. The split's rates are what
RL can start from: a sampled episode can only be reinforced if it happens.

    python scripts/swe_fix_probe.py                                   # the packaged SmolLM2-135M-Instruct
    python scripts/swe_fix_probe.py --checkpoint runs/<swe run>/warmup  # after the SWE warm-up
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from answer_form_probe import greedy, load_model  # noqa: E402  (this directory)

from openclaw_jax.envs.agentic.episode import (Task, ToolError, format_tool_call, opening_messages,  # noqa: E402
                                               parse_assistant_turn)
from openclaw_jax.envs.agentic.swe import SWEEnv  # noqa: E402
from openclaw_jax.envs.agentic.swe_repos import repositories  # noqa: E402

logger = logging.getLogger("swe_fix_probe")


async def _edit_passes(env: SWEEnv, task: Task, old: str, new: str) -> bool:
    """Every test passes once the environment's own `edit_file` replaced `old` by `new` (False when it
    refuses the edit). The model's text is untrusted code: it runs in the environment's sandbox."""
    state = await env.start(task)
    try:
        await env.call(state, task, "edit_file", {"path": "lib.py", "old": old, "new": new})
        return await env.passed_tests(state, task) == len(task.data["test_names"])
    except ToolError:   # `old` is not in the file, or empty
        return False
    finally:
        await env.close(state)


def edit_passes(env: SWEEnv, task: Task, old: str, new: str) -> bool:
    return asyncio.run(_edit_passes(env, task, old, new))


def tasks_by_repository(env: SWEEnv, split: str) -> list[Task]:
    """One task per repository of `split` (the environment's own, with its files and tests)."""
    return env.tasks(split, len(repositories(split)), seed=0)


def _json_string_prefix(text: str) -> str:
    """The JSON string that `text` continues (its opening quote already written), decoded; up to the
    closing quote, or all of it when the model never closed it."""
    try:
        return json.loads('"' + text.split('"')[0] + '"')
    except ValueError:
        return text.split('"')[0]


def edit_call_prefixes(bad: str) -> tuple[str, str]:
    """The agent's `edit_file` call on lib.py (as `format_tool_call` writes it) cut after `"old": "`
    and after `"old": "<bad>", "new": "`: where the model names the line, and where it writes the fix."""
    call = format_tool_call("edit_file", {"path": "lib.py", "old": bad, "new": ""})
    return (call[:call.index('"old": "') + len('"old": "')],
            call[:call.index('"new": "') + len('"new": "')])


def probe(tok, model, split: str) -> dict[str, int]:
    env = SWEEnv()
    tool_names = [t["function"]["name"] for t in env.tools]
    counts = {"repositories": 0, "fix_named_line": 0, "name_line": 0, "whole_turn": 0}

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False).input_ids

    for task in tasks_by_repository(env, split):
        bad, source = task.data["bad"], task.data["files"]["lib.py"]
        messages = opening_messages(env, task, native_tools=False)
        messages += [{"role": "assistant", "content": env.demonstration(task)[0]},   # its read_file lib.py
                     {"role": "tool", "content": source}]
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        name_prefix, fix_prefix = edit_call_prefixes(bad)
        fix = _json_string_prefix(greedy(tok, model, ids(prompt + fix_prefix), 40))
        named = _json_string_prefix(greedy(tok, model, ids(prompt + name_prefix), 40))
        turn = greedy(tok, model, ids(prompt), 96)
        _, attempts = parse_assistant_turn(turn, tool_names, 1)
        args = attempts[0].arguments if attempts and attempts[0].name == "edit_file" else None
        whole = bool(args) and edit_passes(env, task, str(args.get("old", "")), str(args.get("new", "")))
        row = {"fix_named_line": edit_passes(env, task, bad, fix), "name_line": named.strip() == bad.strip(),
               "whole_turn": whole}
        counts["repositories"] += 1
        for k, v in row.items():
            counts[k] += bool(v)
        logger.info("%s %s: fix %r -> %r %s | names %r %s | turn %r %s", split, task.task_id, bad, fix,
                    row["fix_named_line"], named, row["name_line"], turn[:120], whole)
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--checkpoint", default=None, help="HF checkpoint dir (default: the packaged SmolLM2-135M-Instruct)")
    p.add_argument("--splits", nargs="+", default=["heldout", "train"], choices=["heldout", "train"])
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("transformers", "torch", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    tok, model = load_model(args.checkpoint)
    rows = {split: probe(tok, model, split) for split in args.splits}
    print("| split | repositories | fixes the named line | names the buggy line | whole turn fixes |")
    print("| --- | --- | --- | --- | --- |")
    for split, c in rows.items():
        n = c["repositories"]
        print(f"| {split} | {n} | " + " | ".join(f"{c[k]} ({c[k] / n:.2f})" for k in ("fix_named_line", "name_line",
                                                                                    "whole_turn")) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
