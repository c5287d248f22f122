"""One quantized linear, torch's packed CPU kernel against the plain twin (dequantize + float matmul)
and the float weight, by rows per call and dtype: the measurements behind `FAST_DTYPES` and
`INT8_KERNEL_MAX_ROWS` in `clover/model/quantized.py`.

Reproduce: `OMP_NUM_THREADS=1 nice -n 19 python benchmarks/quantized_kernels.py` (CPU ms per call,
process time, mean of 5 after one warm-up; one-row bf16 float matmuls with oneDNN off, as
`clover.model.cpu_kernels` runs them).
"""

import time

import torch
from torch import nn

from clover.model.quantized import QuantizedLinear
from clover.model.quantized import KERNEL_DTYPES, int4_matmul, int8_matmul

SHAPES = ((1024, 2048, 128), (384, 192, 64))  # [N, K, group]: a real-width expert's gate_up; clover-tiny's q_proj
ROWS = (1, 4, 16, 64, 256)


def cpu_ms(fn, runs: int = 5) -> float:
    fn()
    start = time.process_time()
    for _ in range(runs):
        fn()
    return (time.process_time() - start) / runs * 1e3


@torch.inference_mode()
def main() -> None:
    torch.manual_seed(0)
    print("| dtype | weight [N, K], group | rows | float | int4 kernel | int4 twin | int8 kernel | int8 twin |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for dtype in (torch.bfloat16, torch.float32):
        for n, k, group in SHAPES:
            linear = nn.Linear(k, n, bias=False).to(dtype)
            paths = {}
            for bits in (4, 8):
                kernel, twin = (QuantizedLinear.from_linear(linear, bits, group) for _ in range(2))
                assert kernel.pack(KERNEL_DTYPES)
                paths[bits] = (kernel, twin)
            for rows in ROWS:
                x = torch.randn(rows, k, dtype=dtype)
                torch.backends.mkldnn.enabled = not (rows == 1 and dtype == torch.bfloat16)
                try:
                    times = [cpu_ms(lambda: linear(x))]
                    for bits, kernel_matmul in ((4, int4_matmul), (8, int8_matmul)):
                        kernel, twin = paths[bits]  # the kernel called directly, at any row count
                        times += [cpu_ms(lambda: kernel_matmul(x, kernel.qweight, group, kernel.kernel_scales)),
                                  cpu_ms(lambda: twin.matmul(x))]
                finally:
                    torch.backends.mkldnn.enabled = True
                print(f"| {str(dtype)[6:]} | [{n}, {k}], {group} | {rows} | " + " | ".join(f"{t:.3f}" for t in times) + " |")


if __name__ == "__main__":
    main()
