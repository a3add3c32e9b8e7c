import torch
import torch.nn as nn


class Model(nn.Module):
    """A deep GRU over a long sequence (KernelBench level 3's size): on large inputs its saturated gates flip on a
    rounding error, and the flip carries to every later step."""

    def __init__(self, input_size, hidden_size, num_layers):
        super().__init__()
        self.gru = nn.GRU(input_size, hidden_size, num_layers, bias=True, batch_first=False)

    def forward(self, x, h0):
        return self.gru(x, h0)[0]


seq_len, batch_size, input_size, hidden_size, num_layers = 512, 10, 128, 256, 6


def get_inputs():
    return [torch.rand(seq_len, batch_size, input_size), torch.rand((num_layers, batch_size, hidden_size))]


def get_init_inputs():
    return [input_size, hidden_size, num_layers]
