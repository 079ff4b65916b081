"""Page-locked ("pinned") host memory without a GPU, for SGLang's LoRA code on CPU. TEST HARNESS ONLY.

SGLang 0.5.23's LoRA layers and its torch_native LoRA backend ask for pinned host tensors
unconditionally (`torch.tensor(..., pin_memory=True)`, `.pin_memory()` in sglang/srt/lora/layers.py and
lora/backend/torch_backend.py), and torch can pin memory only through a CUDA driver: on a machine without
one, `--enable-lora` fails at start-up with "Found no NVIDIA driver on your system". Pinning only makes
host-to-GPU copies asynchronous; it never changes a value. So, when no GPU is present, the factories that
take `pin_memory` ignore it and `Tensor.pin_memory()` returns the tensor itself. `scripts/sglang_cpu.sh`
puts this directory first on PYTHONPATH of the SGLang processes it starts, where Python imports this module
at start-up; GPU nodes never see it.
"""

import functools

import torch

_FACTORIES = ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like",
              "empty_like", "full_like")


def _without_pinning(factory):
    @functools.wraps(factory)
    def unpinned(*args, pin_memory=False, **kwargs):
        return factory(*args, **kwargs)
    return unpinned


if not torch.cuda.is_available():
    for _name in _FACTORIES:
        setattr(torch, _name, _without_pinning(getattr(torch, _name)))
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
