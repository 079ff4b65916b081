"""`python -m openclaw_jax.inference --model <HF dir | smollm2> [--port N]`: the SGLang-compatible
server around the JAX engine (flags: `--help`, `openclaw_jax/inference/cli.py`)."""

import sys

from openclaw_jax.inference.cli import main

sys.exit(main())
