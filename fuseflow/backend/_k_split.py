"""How many K slices the CUDA backend's own K split makes (pure Python: tested without a GPU).

A full-float32 matmul with a small output (the medium MLP's 256 x 1024 is 64 tiles of
64 x 64 on 132 SMs) leaves most of the GPU idle unless K is split. cuBLASLt then runs its
matmul kernel, a split-K reduction kernel, and fuseflow's epilog pass a third launch. With
its own split the backend runs one strided-batched matmul over the K slices (their partial
products) and the epilog pass adds the slices as it reads them: one launch and one pass over
the output fewer (``CudaBackend.k_splits``, ``_cuda_epilogs``).
"""

from __future__ import annotations

import numbers

#: "auto" splits outputs of at most this many elements (2^19: 128 tiles of 64 x 64, under
#: one wave of the H200's 132 SMs; measured at 2^18) ...
MAX_OUTPUT = 2 ** 19
#: ... from this K on ...
MIN_K = 512
#: ... into the fewest slices of at most this many elements. Measured on the H200
#: (docs/benchmarks-log.md, call 71): 784-1024-1024-10's layer 1 forward (K = 784) was fastest
#: in 2 slices, layer 2's forward and input gradient (K = 1024) in 4.
MAX_SLICE = 400
#: ... and at most this many partial-product elements (8 MB of float32 temporaries).
MAX_PARTIALS = 2 ** 21
#: Slices are a multiple of this many elements (16-byte aligned float32 operands).
ALIGN = 4


def valid(k: int, slices: int) -> bool:
    """``slices`` slices of K = ``k``: equal and aligned."""
    return slices >= 2 and k % slices == 0 and (k // slices) % ALIGN == 0


def k_slices(m: int, n: int, k: int, setting="auto") -> int:
    """The number of K slices for an (m, n) output with inner extent k (0: no split).

    ``setting``: "auto" (the rule above) or a number of slices, used where it divides K
    into aligned slices (0 or 1: never split).
    """
    if setting == "auto":
        if m * n > MAX_OUTPUT or k < MIN_K:
            return 0
        s = next((s for s in range(2, k // ALIGN + 1) if valid(k, s) and k // s <= MAX_SLICE),
                 0)
        return s if s * m * n <= MAX_PARTIALS else 0
    if isinstance(setting, bool) or not isinstance(setting, numbers.Integral):
        raise ValueError(f"k_splits must be 'auto' or a whole number of K slices, got "
                         f"{setting!r}")
    return int(setting) if valid(k, setting) else 0
