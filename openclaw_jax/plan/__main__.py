"""`python -m openclaw_jax.plan`: see the package doc."""

import sys

from openclaw_jax.plan.cli import main

sys.exit(main())
