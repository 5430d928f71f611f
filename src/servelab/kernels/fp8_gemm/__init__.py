"""Block-FP8 (w8a8, 128x128 weight blocks, per-token-group activations) GEMM.

`reference` is plain PyTorch (no Triton); `kernel` holds the Triton kernels (import it only
where Triton is installed); `configs` finds tuned launch configs as the engines do.
"""

from servelab.kernels.fp8_gemm.reference import bytes_moved, flops, weight_bytes

__all__ = ["bytes_moved", "flops", "weight_bytes"]
