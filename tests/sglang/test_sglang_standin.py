"""The pure-torch `sgl_kernel` stand-in (tests/sglang_cpu) that lets SGLang run on CPU: its one
function against a plain reference loop, and every other name failing loudly (no server needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.sglang

STAND_IN = Path(__file__).resolve().parents[1] / "sglang_cpu" / "sgl_kernel" / "__init__.py"


@pytest.fixture(scope="module")
def kernel():
    spec = importlib.util.spec_from_file_location("sgl_kernel_stand_in", STAND_IN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_assign_req_to_token_pool_cpu_matches_a_reference_loop(kernel):
    rng = np.random.default_rng(0)
    pool_len = 64
    table = rng.integers(-5, 0, size=(6, pool_len))
    rows = np.array([4, 0, 2])
    starts = np.array([0, 17, 63])
    ends = np.array([5, 40, 64])
    locs = rng.integers(0, 10_000, size=int((ends - starts).sum()))
    want = table.copy()
    offset = 0
    for r, s, e in zip(rows, starts, ends):  # request i takes the next (e - s) locations
        for j in range(s, e):
            want[r, j] = locs[offset]
            offset += 1
    got = torch.tensor(table, dtype=torch.int32)
    kernel.assign_req_to_token_pool_cpu(torch.tensor(rows), got, torch.tensor(starts), torch.tensor(ends),
                                        torch.tensor(locs), pool_len)
    np.testing.assert_array_equal(got.numpy(), want)
    with pytest.raises(ValueError, match="bad slice"):
        kernel.assign_req_to_token_pool_cpu(torch.tensor([0]), got, torch.tensor([60]), torch.tensor([70]),
                                            torch.zeros(10, dtype=torch.int64), pool_len)


def test_every_other_name_raises_naming_itself(kernel):
    assert kernel.STAND_IN is True
    from_import = kernel.fused_add_rmsnorm  # importing a name works (SGLang does so at module level) ...
    with pytest.raises(NotImplementedError, match=r"sgl_kernel\.fused_add_rmsnorm .*CPU stand-in"):
        from_import(torch.zeros(1))  # ... calling it does not
    with pytest.raises(AttributeError):
        kernel._private
