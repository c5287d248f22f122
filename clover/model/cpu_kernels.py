"""Which CPU matmul kernel a one-token forward uses in bf16.

PyTorch runs reduced-precision CPU matmuls through oneDNN. For a single row (a decode step: one
token, one sequence) oneDNN's bf16 kernel streams the weights at about half the memory bandwidth on
this project's x86 AVX-512-BF16 CPU, while PyTorch's own kernel (a GEMV with fp32 accumulation)
reaches it: 3.5 against 6.7 GB/s on a 1 GB lm_head, 2.9 against 5.6 GB/s on expert-sized matrices
(one thread, runs interleaved; benchmarks/real_width.py measures the whole step). From 8 rows up
oneDNN is ~3x faster, so only one-row forwards switch. The plain path (oneDNN on) is the twin; a
test compares the two. The switch is PyTorch's process-wide `torch.backends.mkldnn.enabled` flag,
held for the duration of the forward (a forward runs on one thread; another thread's CPU matmul
during it would run on PyTorch's kernel: the same result at a different speed).
"""

from contextlib import contextmanager
from typing import Iterator

import torch


def prefers_native_gemv(rows: int, dtype: torch.dtype, device: torch.device) -> bool:
    """True for a one-row bf16 forward on CPU (where PyTorch's own GEMV beats oneDNN's)."""
    return rows == 1 and dtype == torch.bfloat16 and device.type == "cpu" and torch.backends.mkldnn.is_available()


@contextmanager
def matmul_kernels(rows: int, dtype: torch.dtype, device: torch.device) -> Iterator[None]:
    """While active, CPU matmuls of a `rows`-row forward in `dtype` run on the faster kernel."""
    if not prefers_native_gemv(rows, dtype, device) or not torch.backends.mkldnn.enabled:
        yield
        return
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = True
