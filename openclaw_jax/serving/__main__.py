"""`python -m openclaw_jax.serving`: see `openclaw_jax.serving.cli`."""

import sys

from openclaw_jax.serving.cli import main

if __name__ == "__main__":
    sys.exit(main())
