"""One logging set-up for every CLI: our records at the chosen level, third-party noise kept out.

JAX announces at INFO which backends it could not open (libtpu, CUDA) and the openai client
logs every request through httpx; none of that helps a user reading a training run, so those
loggers are raised to WARNING unless the user asks for DEBUG.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
NOISY = ("jax._src.xla_bridge", "jax._src.compiler", "jax._src.dispatch", "absl", "orbax", "httpx", "httpx2", "httpcore",
         "urllib3", "aiohttp.access", "grain", "tensorboardX")


def configure_logging(level: int | str = logging.INFO) -> None:
    """basicConfig on stderr with our format; third-party loggers at WARNING unless `level` is DEBUG."""
    level = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    # force: an imported library may have put a handler on the root logger already (grain does, on import),
    # which would make basicConfig a no-op and leave the console silent
    logging.basicConfig(level=level, format=FORMAT, stream=sys.stderr, force=True)
    if level > logging.DEBUG:
        for name in NOISY:
            logging.getLogger(name).setLevel(logging.WARNING)
