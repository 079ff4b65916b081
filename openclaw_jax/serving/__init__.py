"""What is served: the promotion gate between the trainer and the pool, the versions log, kept weights.

Modules: ``config`` (the ``gate:`` section), ``versions`` (the event log and the kept weights under
``<run_dir>/versions/``: written by the trainer side, read by the gateway's status page and rollback
route), ``replay`` (the held-out turns the gate replays), ``scoring`` (the check, pure), ``gate``
(`PromotionGate`, a weight push that serves only candidates that pass), ``cli`` (``python -m
openclaw_jax.serving list|rollback``). Imports neither the trainer, the gateway nor the pool.
"""
