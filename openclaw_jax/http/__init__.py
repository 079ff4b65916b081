"""HTTP plumbing shared by the inference server and the gateway (imports nothing of ours but
:mod:`openclaw_jax.wire`, whose `json_safe` decodes untrusted JSON, and the leaf :mod:`openclaw_jax.counters`).

* `text_budget` — length checks before tokenizing; tokenizing/rendering off the event loop.
* `offload`     — the small thread pool for the heavy work of large requests.
* `http_guard`  — body limits, the error boundary, bearer keys, header timeout and connection cap.
"""
