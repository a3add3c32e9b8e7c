"""KernelBench-style op whose domain is positive: log of torch.rand inputs (negative inputs make the reference NaN:
those elements are masked, and the all-negative family is skipped). The offset stays below the negative family's
smallest magnitude (2^-10, tools/inputs.py): at 1e-3 a draw near it left a few elements finite, and the family was
judged rather than skipped, about once in 250 runs."""
import torch
import torch.nn as nn

batch_size = 64
dim = 1536


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x + 1e-4) * 0.5


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
