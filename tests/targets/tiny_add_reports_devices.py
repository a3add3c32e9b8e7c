"""tiny_add, whose module says, where it is loaded, whether that process can reach a GPU device node and has made
a CUDA context: a GPU node's planners (sandbox/pool.py, deviceless) must have done neither."""
import os

import torch

print(f"devices: nvidiactl={os.path.exists('/dev/nvidiactl')} context={torch.cuda.is_initialized()}")

N = 1000


class Model(torch.nn.Module):
    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
