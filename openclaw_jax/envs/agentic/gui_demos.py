"""Write the GUI environment's demonstrations (scripted correct trajectories) as JSONL conversations.

    python -m openclaw_jax.envs.agentic.gui_demos --split train --n 64 --out demos.jsonl [--screenshots]

Without --screenshots: text tool-call conversations (no display needed). With it: every
demonstration runs on its own Xvfb + app, the user message and each tool result carry the real
screenshot as an `image_url` data-URL part, and only demonstrations the checker accepts are written.
"""

from __future__ import annotations

import json
from typing import Sequence

from openclaw_jax.envs.agentic.gui import FAMILIES, GuiEnv, demonstration_conversations


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m openclaw_jax.envs.agentic.gui_demos --split train --n 8 --out demos.jsonl [--screenshots]`:
    write demonstration conversations, one JSON object per line ({"task_id", "family", "messages"})."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m openclaw_jax.envs.agentic.gui_demos", description=main.__doc__)
    parser.add_argument("--split", choices=("train", "heldout"), default="train")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--screenshots", action="store_true", help="run each demonstration and embed screenshots")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    env = GuiEnv(tuple(args.families.split(",")))
    tasks = env.tasks(args.split, args.n, args.seed)
    written = 0
    with open(args.out, "w") as f:
        for task in tasks:
            for conv in demonstration_conversations(env, [task], screenshots=args.screenshots):
                f.write(json.dumps({"task_id": task.task_id, "family": task.family, "messages": conv}) + "\n")
                written += 1
    print(f"wrote {written} of {len(tasks)} demonstrations to {args.out}")
    return 0 if written else 1


if __name__ == "__main__":
    raise SystemExit(main())
