"""The personalisation benchmark (`python -m openclaw_jax.eval`): held-out questions, personas,
rule or LLM-judge evaluators, JSON reports, TensorBoard scalars and a score-vs-step plot.

Pure scoring lives in `scoring.py`, evaluators in `evaluators.py`, orchestration in
`benchmark.py`, the embedded-server launcher in `server.py` and the CLI in `__main__.py`.
`judge_reactions.py` (`python -m openclaw_jax.eval.judge_reactions`) scores a judge's verdicts and hints
against hand-labelled reactions (`reactions.yaml`)."""
