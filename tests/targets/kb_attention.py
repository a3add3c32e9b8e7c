"""KernelBench-style scaled dot-product attention (no mask): Inductor would call an ATen attention kernel."""
import torch
import torch.nn as nn

batch_size = 2
num_heads = 2
sequence_length = 24
embedding_dimension = 40


class Model(nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def get_inputs():
    shape = (batch_size, num_heads, sequence_length, embedding_dimension)
    return [torch.rand(shape), torch.rand(shape), torch.rand(shape)]


def get_init_inputs():
    return []
