"""NCCL all-reduce for data-parallel training on GPUs (CuPy's NCCL bindings).

The communicator is made once per process group; rank 0 draws the NCCL unique id and the
MPI communicator (if any) carries it to the other ranks.
"""

from __future__ import annotations

import cupy
import numpy as np
from cupy.cuda import nccl

_NCCL_DTYPES = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
                np.dtype(np.float16): nccl.NCCL_FLOAT16}


class NcclSum:
    """In-place sum of a contiguous CuPy array over all ranks, on the current stream."""

    def __init__(self, size: int, rank: int, mpi_comm=None):
        uid = nccl.get_unique_id() if rank == 0 else None
        if mpi_comm is not None:
            uid = mpi_comm.bcast(uid, root=0)
        self._comm = nccl.NcclCommunicator(size, uid, rank)

    def __call__(self, flat):
        self._comm.allReduce(flat.data.ptr, flat.data.ptr, flat.size, _NCCL_DTYPES[flat.dtype],
                             nccl.NCCL_SUM, cupy.cuda.get_current_stream().ptr)
