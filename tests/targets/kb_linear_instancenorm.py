"""KernelBench-style fused op whose InstanceNorm sees one channel where it was built for out_features (it warns: a
graph break for Dynamo), then a residual add and a product."""
import torch
import torch.nn as nn

batch_size = 16
in_features = 24
out_features = 32


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.InstanceNorm2d(out_features)

    def forward(self, x, y):
        x = self.norm(self.linear(x).unsqueeze(1).unsqueeze(1)).squeeze(1).squeeze(1)
        return (x + y) * y


def get_inputs():
    return [torch.randn(batch_size, in_features), torch.randn(batch_size, out_features)]


def get_init_inputs():
    return [in_features, out_features]
