"""A pure-torch stand-in for SGLang's kernel package (`sgl_kernel`), for running SGLang on CPU in tests.

TEST HARNESS ONLY. The published `sglang-kernel` wheel holds CUDA builds only, so importing it on
a machine without a GPU fails, and SGLang's CPU path imports one function from it at start-up
(`sglang.srt.mem_cache.allocation`). `scripts/sglang_cpu.sh` puts the directory holding this
package first on `PYTHONPATH` of the SGLang processes it starts; GPU nodes install the real kernel
package (the `gpu` extra) and never see this file.

It implements exactly one function, `assign_req_to_token_pool_cpu`, with the semantics of
SGLang's Triton kernel `assign_req_to_token_pool` (a per-request copy of the new cache
locations into the request-to-token table). Every other name imports (SGLang imports some names
at module level on paths the CPU run never takes) but raises `NotImplementedError`, naming itself
and the function, the moment it is called: nothing is silently approximated.
"""

from __future__ import annotations

import torch

__version__ = "0.0.0+openclaw-cpu-stand-in"
STAND_IN = True  # lets a caller (and the tests) tell this module from the real kernel package


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """req_to_token[req_pool_indices[i], start[i]:end[i]] = the i-th slice of out_cache_loc, in place.

    The slices of `out_cache_loc` are consecutive: request i takes the (end[i] - start[i]) entries
    after those of requests 0..i-1 (as the Triton kernel computes with its prefix sum).
    """
    if req_to_token.shape[1] != pool_len:
        raise ValueError(f"sgl_kernel stand-in: pool_len={pool_len} but req_to_token has {req_to_token.shape[1]} "
                         "columns")
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    offset = 0
    for row, start, end in zip(rows, starts, ends):
        n = int(end) - int(start)
        if n < 0 or int(end) > pool_len:
            raise ValueError(f"sgl_kernel stand-in: bad slice [{start}, {end}) for a pool of {pool_len} tokens")
        if n:
            req_to_token[int(row), int(start):int(end)] = out_cache_loc[offset:offset + n].to(req_to_token.dtype)
        offset += n
    if offset > out_cache_loc.numel():
        raise ValueError(f"sgl_kernel stand-in: the slices need {offset} cache locations, out_cache_loc has "
                         f"{out_cache_loc.numel()}")


def _not_implemented(name: str):
    def missing(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but this `sgl_kernel` is the pure-torch CPU stand-in from "
            f"openclaw_jax's tests/sglang_cpu (it implements only assign_req_to_token_pool_cpu). This SGLang "
            f"path needs the real kernel package (GPU nodes: pip install -e '.[gpu]').")

    missing.__name__ = missing.__qualname__ = name
    return missing


def __getattr__(name: str):
    # Module dunders (__path__, __file__, ...) and private names keep Python's normal behaviour.
    if name.startswith("_"):
        raise AttributeError(f"module 'sgl_kernel' (CPU stand-in) has no attribute {name!r}")
    return _not_implemented(name)
