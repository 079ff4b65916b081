"""Image-path decode: sequences in flight decoded together (`inference/vision.py`, one batch cache) vs
the same requests one sequence at a time, on a Qwen2.5-VL whose text decoder is SmolLM2-135M-Instruct.

The model is `configs/gui_cpu.yaml`'s policy (SmolLM2 behind its random vision tower, built by
`train.load_base_model` in a temporary run directory), or `--model DIR`. Each
request is a ~200-token prompt with one 112x84 screenshot (12 image tokens), greedy, exactly
`--new-tokens` tokens (no stop). The reference is `VisionGenerator(max_batch=1)`: the requests one
after another, each decoded alone (how the image path served them before the batch cache). Ours is
`VisionGenerator(max_batch=N)` with the N requests sent at once from N threads, as concurrent GUI
episodes send them. Compilation is excluded (one untimed round each); medians of `--repeats`.

    python bench/vision_decode.py [--batches 1 4 8] [--new-tokens 40] [--repeats 3] [--model DIR] [--json]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def screenshot(seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (84, 112, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def build_model(model_dir: str | None):
    """`--model`, else `configs/gui_cpu.yaml`'s policy as `train.load_base_model` builds it."""
    from openclaw_jax.config import load_experiment_config
    from openclaw_jax.models.hub import load_pretrained
    from openclaw_jax.runs.base_model import load_base_model

    if model_dir is not None:
        return load_pretrained(model_dir, tokenizer=False).model
    cfg = load_experiment_config([str(REPO / "configs" / "gui_cpu.yaml")],
                                 [f"run_dir={tempfile.mkdtemp(prefix='vision_decode_')}"])
    return load_base_model(cfg).model


def requests(model, n: int) -> list[tuple[list[int], bytes]]:
    from openclaw_jax.models.image_processing import ImageProcessorConfig, image_token_count, process_image

    cfg = model.vl_cfg
    proc = ImageProcessorConfig.for_vision(cfg.vision)
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        image = screenshot(i)
        k = image_token_count(process_image(image, proc)[1], proc.merge_size)
        text = [int(t) for t in rng.integers(100, 40000, 190 + i)]
        image_part = [cfg.vision_start_token_id] + [cfg.image_token_id] * k + [cfg.vision_end_token_id]
        out.append((text + image_part, image))
    return out


def timed(gen, reqs, new_tokens: int, concurrent: bool) -> float:
    def one(req):
        return gen.generate(req[0], [req[1]], max_new_tokens=new_tokens, temperature=0.0)

    t0 = time.perf_counter()
    if concurrent:
        with ThreadPoolExecutor(len(reqs)) as pool:
            outs = list(pool.map(one, reqs))
    else:
        outs = [one(r) for r in reqs]
    elapsed = time.perf_counter() - t0
    assert all(len(o.output_ids) == new_tokens for o in outs)
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8], help="concurrent requests (default 1 4 8)")
    ap.add_argument("--new-tokens", type=int, default=40, help="tokens per request (default 40, a click call)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds per setting (median; default 3)")
    ap.add_argument("--model", default=None, help="a Qwen2.5-VL HF directory (default: SmolLM2 + a random tower)")
    ap.add_argument("--json", action="store_true", help="also print {'batched_over_sequential': {N: ratio}}")
    args = ap.parse_args()

    from openclaw_jax.inference.vision import VisionGenerator
    from openclaw_jax.logs import configure_logging

    configure_logging("WARNING")
    model = build_model(args.model)
    sequential = VisionGenerator(model, max_batch=1)
    rows, ratios = [], {}
    for n in args.batches:
        batched = VisionGenerator(model, max_batch=n)
        reqs = requests(model, n)
        times = {}
        for name, gen, concurrent in (("sequential", sequential, False), ("batched", batched, True)):
            timed(gen, reqs, args.new_tokens, concurrent)   # compile
            times[name] = statistics.median(timed(gen, reqs, args.new_tokens, concurrent) for _ in range(args.repeats))
        tok = n * args.new_tokens
        ratios[str(n)] = times["sequential"] / times["batched"]
        rows.append((n, tok / times["sequential"], tok / times["batched"], ratios[str(n)]))
    print(f"{'requests':>8} | {'one at a time tok/s':>19} | {'batched tok/s':>13} | {'ratio':>5}")
    for n, seq, bat, r in rows:
        print(f"{n:>8} | {seq:>19.1f} | {bat:>13.1f} | {r:>5.2f}")
    if args.json:
        print(json.dumps({"batched_over_sequential": {k: round(v, 3) for k, v in ratios.items()}}))


if __name__ == "__main__":
    main()
