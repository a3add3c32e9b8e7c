"""KernelBench-style loss: `input_shape` is derived from num_classes at import; targets are drawn below num_classes."""
import torch
import torch.nn as nn

batch_size = 1024
num_classes = 1000
input_shape = (num_classes,)
dim = 1


class Model(nn.Module):
    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(predictions, targets)


def get_inputs():
    return [torch.randn(batch_size, *input_shape), torch.randint(0, num_classes, (batch_size,))]


def get_init_inputs():
    return []
