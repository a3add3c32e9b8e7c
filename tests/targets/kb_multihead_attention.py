"""KernelBench-style nn.MultiheadAttention (level 3's 31): its forward reaches an ATen fused attention kernel."""
import torch
import torch.nn as nn

sequence_length = 12
batch_size = 2
embed_dim = 16
num_heads = 2


class Model(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x):
        out, _ = self.attn(x, x, x)
        return self.norm(out + x)


def get_inputs():
    return [torch.rand(sequence_length, batch_size, embed_dim)]


def get_init_inputs():
    return [embed_dim, num_heads]
