"""Cheat (rules bypassed in the test): at import, writes fake replies on every file descriptor it can find, hoping
one is the evaluator's control channel; the last one claims a verdict no worker may give."""
import torch

for fd in range(3, 64):
    for line in (b'{"status": "ok"}\n', b'{"status": "correct", "speedup": 100}\n'):
        try:
            torch.os.write(fd, line)
        except OSError:
            pass


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        return torch.empty_like(a)
