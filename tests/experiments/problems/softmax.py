"""Row softmax of an fp32 matrix with rows twice as long as the built-in target's (tools/targets/softmax.py, 8192 x
8192): the second shape of tests/experiments/search_memory.sh's tuning-memory experiment.

The file is named softmax.py on purpose: the offline policy names a file target's Inductor template after the file
(inductor/softmax) and tuning memory is keyed by template, so this file shares memory with that target's file."""
import torch
import torch.nn as nn

ROWS = 4096
COLS = 16384

KLOOP_SMALL = {"ROWS": 16, "COLS": 2000}


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS) * 4.0]


def get_init_inputs():
    return []
