"""A broken problem: its reference takes the softmax over a dimension its input does not have, so it fails at every
shape before any kernel runs."""
import torch
import torch.nn as nn

batch_size = 16
dim = 256


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=2)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
