"""KernelBench level 3's LSTMCn at a small size: a two-layer batch-first LSTM from given states, returning c_n
(torch.compile makes no graph of the LSTM; the starter runs kloop's Triton recurrence)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers, output_size):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_size, output_size)

    def forward(self, x, h0, c0):
        out, state = self.lstm(x, (h0, c0))
        return self.fc(out[:, -1, :]) + state[1].sum()


batch_size = 4
sequence_length = 6
input_size = 16
hidden_size = 24
num_layers = 2
output_size = 8


def get_inputs():
    return [torch.rand(batch_size, sequence_length, input_size), torch.rand(num_layers, batch_size, hidden_size),
            torch.rand(num_layers, batch_size, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, output_size]
