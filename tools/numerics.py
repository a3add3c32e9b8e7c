"""Global numeric flags, pinned the same way for the reference and every candidate, and recorded with each result."""
from __future__ import annotations

import torch


def pin_numeric_flags() -> dict:
    """Full-precision fp32 matmuls and convolutions (no TF32), and fp32 accumulation of split-K fp16/bf16 matmul
    reductions: with PyTorch's default, cuBLAS may add partial sums in bf16 and miss a correct kernel by many ulps."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    return numeric_flags()


def numeric_flags() -> dict:
    return {
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda.matmul.allow_fp16_reduced_precision_reduction":
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction":
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    }
