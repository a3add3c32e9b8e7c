"""Broken (rules bypassed in the test): crashes its process."""
import ctypes
import torch


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        ctypes.string_at(0)
