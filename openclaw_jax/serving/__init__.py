"""HTTP serving plumbing shared by the inference server and the gateway (a leaf: imports nothing of ours
outside this package).

* `json_safe`   — strict, depth-bounded JSON decoding of untrusted text (pure).
* `text_budget` — length checks before tokenizing; tokenizing/rendering off the event loop.
* `offload`     — the small thread pool for the heavy work of large requests.
* `http_guard`  — body limits, the error boundary, bearer keys, header timeout and connection cap.
"""
