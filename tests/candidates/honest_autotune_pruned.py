"""Honest: autotuning as public kernels write it. Configurations built in a comprehension and a loop, pruned by
prune_configs_by, with reset_to_zero and restore_value; a constexpr helper jit function; tl.constexpr globals."""
import torch
import triton
import triton.language as tl

SCALE = tl.constexpr(1.0)
NUM_WARPS = [2, 4]


def get_configs():
    configs = [triton.Config({"BLOCK": block}, num_warps=w) for block in (64, 128) for w in NUM_WARPS]
    for block in [256, 2048]:
        configs.append(triton.Config({"BLOCK": block}, num_warps=4))
    return configs


def prune_large_blocks(configs, named_args, **kwargs):
    return [c for c in configs if c.kwargs["BLOCK"] <= triton.next_power_of_2(named_args["n"])]


@triton.jit
def _scaled(x, FACTOR: tl.constexpr):
    return x * FACTOR


@triton.autotune(configs=get_configs(), key=["n"], prune_configs_by={"early_config_prune": prune_large_blocks},
                 reset_to_zero=["out_ptr"], restore_value=["a_ptr"])
@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, _scaled(a, SCALE) + tl.load(b_ptr + offs, mask=mask), mask=mask)


def cdiv(a, b):
    return triton.cdiv(a, b)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[lambda meta: (cdiv(a.numel(), meta["BLOCK"]),)](a, b, out, a.numel())
        return out
