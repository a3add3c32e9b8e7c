"""Honest: LayerNorm split over rows in three kernels with fp32 workspaces (each chunk's sum and sum of squared
deviations from its own mean, combined per row by Chan's formula: stable where the mean dwarfs the spread, as on
inputs near one, where E[x^2] - E[x]^2 loses the variance), its affine parameters made in __init__ like the
reference's."""
import torch
import triton
import triton.language as tl

CHUNK = 256


@triton.jit
def partial_sums(x_ptr, partial_ptr, row_len, chunks, CHUNK: tl.constexpr):
    row, chunk = tl.program_id(0), tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < row_len
    x = tl.load(x_ptr + row * row_len + offs, mask=mask, other=0.0).to(tl.float32)
    count = tl.minimum(row_len - chunk * CHUNK, CHUNK)
    total = tl.sum(x, axis=0)
    centered = tl.where(mask, x - total / count, 0.0)
    base = (row * chunks + chunk) * 2
    tl.store(partial_ptr + base, total)
    tl.store(partial_ptr + base + 1, tl.sum(centered * centered, axis=0))


@triton.jit
def row_stats(partial_ptr, stats_ptr, row_len, chunks, eps, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < chunks
    sums = tl.load(partial_ptr + (row * chunks + offs) * 2, mask=mask, other=0.0)
    m2 = tl.load(partial_ptr + (row * chunks + offs) * 2 + 1, mask=mask, other=0.0)
    counts = tl.minimum(row_len - offs * CHUNK, CHUNK).to(tl.float32)
    mean = tl.sum(sums, axis=0) / row_len
    spread = tl.where(mask, sums / counts - mean, 0.0)
    var = (tl.sum(m2, axis=0) + tl.sum(counts * spread * spread, axis=0)) / row_len
    tl.store(stats_ptr + row * 2, mean)
    tl.store(stats_ptr + row * 2 + 1, 1.0 / tl.sqrt(var + eps))


@triton.jit
def normalize(x_ptr, w_ptr, b_ptr, stats_ptr, out_ptr, row_len, CHUNK: tl.constexpr):
    row, chunk = tl.program_id(0), tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < row_len
    mean = tl.load(stats_ptr + row * 2)
    rstd = tl.load(stats_ptr + row * 2 + 1)
    x = tl.load(x_ptr + row * row_len + offs, mask=mask).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + row * row_len + offs, (x - mean) * rstd * w + b, mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = torch.nn.LayerNorm(normalized_shape=normalized_shape)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        row_len = self.ln.weight.numel()
        rows = x.numel() // row_len
        chunks = triton.cdiv(row_len, CHUNK)
        partial = torch.empty(rows, chunks, 2, device=x.device, dtype=torch.float32)
        stats = torch.empty(rows, 2, device=x.device, dtype=torch.float32)
        out = torch.empty_like(x)
        partial_sums[(rows, chunks)](x, partial, row_len, chunks, CHUNK=CHUNK)
        row_stats[(rows,)](partial, stats, row_len, chunks, self.ln.eps, CHUNK=CHUNK,
                           BLOCK=triton.next_power_of_2(chunks))
        normalize[(rows, chunks)](x, self.ln.weight, self.ln.bias, stats, out, row_len, CHUNK=CHUNK)
        return out
