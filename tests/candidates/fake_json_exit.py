"""Cheat: prints a fake verdict and leaves before anyone can check."""
import os
import torch


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        print('{"verdict": "correct", "speedup": {"eager": 100.0}}')
        os._exit(0)
