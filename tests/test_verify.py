"""tools/verify.py: the tolerance rule, and the spread trial's rule against the output's scale."""
import pytest
import torch

from tools import verify


def _blocked_cumsum(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """A scan as a GPU kernel does it: each block summed on its own, then the carries, all in float32."""
    rows, n = x.shape
    parts = torch.cumsum(x.reshape(rows, n // block, block), dim=2)
    carries = torch.cumsum(parts[:, :, -1], dim=1) - parts[:, :, -1]
    return (parts + carries[:, :, None]).reshape(rows, n)


def test_a_scan_over_terms_of_both_signs_is_judged_against_the_outputs_scale():
    torch.manual_seed(0)
    x = torch.rand(4, 1 << 20) * 8 - 4                      # the spread trial's inputs; partial sums reach ~3000
    ref, out = torch.cumsum(x, dim=1), _blocked_cumsum(x)
    elementwise, _ = verify.compare(out, ref)
    assert elementwise and "elements outside atol=0.0001" in elementwise[0]   # rounding, where the sum nears 0
    reasons, stats = verify.compare(out, ref, to_scale=True)
    assert reasons == [] and 0.2 < stats["atol"] < 0.5 and stats["max_abs_err"] < 1e-3
    on_unit, _ = verify.compare(_blocked_cumsum(x.add(4).div(8)), torch.cumsum(x.add(4).div(8), dim=1))
    assert on_unit == []                                    # on [0, 1) the sums only grow: elementwise holds


def test_the_outputs_scale_still_catches_an_op_skipped_below_0():
    torch.manual_seed(0)
    x = torch.rand(4096, 512) * 8 - 4
    reasons, stats = verify.compare(x.clone(), torch.relu(x), to_scale=True)   # a copy passes ReLU on [0, 1)
    assert reasons and stats["atol"] == 0.0005 and stats["mismatches"] > 0.45 * x.numel()
    nan = torch.relu(x)
    nan[7, 7] = float("nan")
    assert "NaN positions differ" in verify.compare(nan, torch.relu(x), to_scale=True)[0][0]


def test_finite_abs_max_ignores_nan_and_infinity():
    t = torch.tensor([[1.0, -3.5], [float("nan"), float("-inf")]])
    assert verify.finite_abs_max(t) == 3.5
    assert verify.finite_abs_max(torch.full((3,), float("nan"))) == 0.0


def test_a_near_miss_is_judged_against_the_float64_truth():
    # E[x^2] - E[x]^2 in float32 far from 0: the reference is ~1.8 tolerances off the exact variance
    torch.manual_seed(1)
    x = 30 + torch.rand(64, 4096)
    ref = (x * x).mean(1) - x.mean(1) ** 2
    exact = (x.double() - x.double().mean(1, keepdim=True)).pow(2).mean(1)
    two_pass = (x - x.mean(1, keepdim=True)).pow(2).mean(1)
    reasons, stats = verify.compare(two_pass, ref)
    assert reasons and stats["mismatches"] == 6                  # outside the tolerance of the reference
    bad, own, theirs = verify.against_float64(two_pass, ref, exact, stats["atol"], stats["rtol"])
    assert bad == 0 and own < 0.01 and 1.5 < theirs < 2.5        # but nearer the truth than the reference is
    off = two_pass.clone()
    off[3] *= 1 + 3e-2                                           # one element 3% off: far beyond the reference there
    bad, own, theirs = verify.against_float64(off, ref, exact, stats["atol"], stats["rtol"])
    assert bad == 1 and own > 10


def test_all_finite_looks_at_every_slice(monkeypatch):
    monkeypatch.setattr(verify, "CHUNK", 8)
    t = torch.zeros(10, 4)
    assert verify.all_finite(t)
    t[9, 3] = float("inf")                                       # in the last slice only
    assert not verify.all_finite(t)


def test_the_spread_trial_takes_every_non_negative_draw_and_keeps_its_order():
    from types import SimpleNamespace

    from tools.inputs import make_inputs, spreadable

    assert spreadable(torch.rand(100)) and spreadable(torch.randn(100).abs()) and spreadable(torch.rand(100) * 3 + 1)
    assert spreadable(torch.rand(64, 32).t())                            # strided: judged on a view, never a copy
    assert spreadable(torch.rand(100) - 1)                               # non-positive: ReLU is 0 on all of it
    assert not spreadable(torch.randn(100))                              # already has both signs
    assert not spreadable(torch.randint(0, 5, (100,)).float())           # whole numbers: a mask, counts, indices
    assert not spreadable(torch.full((100,), 0.5)) and not spreadable(torch.rand(1))
    module = SimpleNamespace(get_inputs=lambda: [torch.rand(1000) * 3 + 1, torch.randn(1000), torch.arange(10)])
    plain, spread = make_inputs(module, 7), make_inputs(module, 7, spread=True)
    assert float(spread[0].min()) == -4.0 and float(spread[0].max()) <= 4.0 and float(spread[0].max()) > 1.0
    assert torch.equal(plain[0].argsort(), spread[0].argsort())          # sorted boundaries stay sorted
    assert torch.equal(plain[1], spread[1]) and torch.equal(plain[2], spread[2])
    assert torch.equal(spread[0], make_inputs(module, 7, spread=True)[0])   # the same bits on both sides


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 with TF32's 10-bit mantissa (the low 13 bits cleared), as a tensor core reads it."""
    return (t.view(torch.int32) & ~0x1FFF).view(torch.float32)


def test_a_sum_that_cancels_allows_any_summation_order_but_not_lower_precision():
    # KernelBench level 2's 14: (x @ W.T / 2).sum(1) * 1.5. Inductor sums W first, x @ W.sum(0): the same sum in
    # another order, off by more than twice the reference at 1 of 128 elements, where thousands of terms cancel.
    # The reference moves as far when its inputs move by one rounding step; TF32 rounds 2^13 times coarser.
    torch.manual_seed(1)
    x, w = torch.rand(128, 4096), torch.randn(4096, 4096)
    reference = lambda x: (x @ w.T / 2).sum(1, keepdim=True) * 1.5  # noqa: E731
    ref, exact = reference(x), (x.double() @ w.double().T / 2).sum(1, keepdim=True) * 1.5
    step = torch.empty_like(x).bernoulli_(0.5, generator=torch.Generator().manual_seed(1)).mul_(2).sub_(1)
    moved = reference(step.mul_(torch.finfo(x.dtype).eps).add_(1).mul_(x))
    reordered = x @ w.sum(0, keepdim=True).T / 2 * 1.5
    reasons, stats = verify.compare(reordered, ref)
    assert reasons and stats["mismatches"] == 2
    assert verify.against_float64(reordered, ref, exact, stats["atol"], stats["rtol"])[0] == 1
    assert verify.against_float64(reordered, ref, exact, stats["atol"], stats["rtol"], moved)[0] == 0
    tf32 = (_tf32(x) @ _tf32(w).T / 2).sum(1, keepdim=True) * 1.5
    reasons, stats = verify.compare(tf32, ref)
    bad, own, _ = verify.against_float64(tf32, ref, exact, stats["atol"], stats["rtol"], moved)
    assert bad > 100 and own > 100


# -- the fused first pass (one Triton kernel on a GPU; here under Triton's interpreter) ------------------------------
def _cases():
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(10_000, generator=g)
    near = ref + (1e-4 + 1e-4 * ref.abs()) * 0.9995   # inside the tolerance, but not by the fast pass's margin
    nan_out, inf_out, inf_ref = ref.clone(), ref.clone(), ref.clone()
    nan_out[4321] = float("nan")
    inf_out[17] = float("inf")
    inf_ref[17] = float("inf")
    off_by_one = ref.clone()
    off_by_one[9_999] += 1e-2   # the last element, in the last (partial) block
    return {
        "exact": (ref.clone(), ref),
        "within": (ref + 5e-5, ref),
        "near the bound": (near, ref),
        "one element off at the end": (off_by_one, ref),
        "NaN": (nan_out, ref),
        "infinity out": (inf_out, ref),
        "infinity in the reference": (inf_ref.clone(), inf_ref),
        "float16": (ref.half() + 1e-3, ref.half()),
        "bfloat16": (ref.bfloat16(), ref.bfloat16()),
        "float64": ((ref + 5e-8).double(), ref.double()),
        "float64 off": ((ref + 1e-5).double(), ref.double()),
        "one element": (ref[:1] + 2e-5, ref[:1]),
    }


@pytest.mark.device
@pytest.mark.parametrize("case", list(_cases()))
def test_the_fused_first_pass_accepts_and_refuses_exactly_what_the_torch_pass_does(case):
    device = "cuda" if torch.cuda.is_available() else "cpu"   # the compiled kernel on a GPU, else interpreted
    out, ref = (t.to(device) for t in _cases()[case])
    atol, rtol = verify.TOLERANCES[ref.dtype]
    fused = verify._fast_pass_fused(out, ref, atol, rtol)
    plain = verify._fast_pass_torch(out, ref, atol, rtol)
    assert (fused is None) == (plain is None), (fused, plain)
    if plain is not None:
        assert fused == pytest.approx(plain, rel=1e-6, abs=1e-12)
    accepted = {"exact", "within", "float16", "bfloat16", "float64", "one element"}
    assert (fused is not None) == (case in accepted)


def test_same_bits_compares_whole_elements_and_sees_a_changed_nan_payload():
    a = torch.randn(1000)
    b = a.clone()
    assert verify.same_bits(a, b)
    b.view(torch.int32)[500] ^= 1          # the lowest mantissa bit
    assert not verify.same_bits(a, b)
    n1 = torch.full((4,), float("nan"))
    n2 = n1.clone()
    n2.view(torch.int32)[2] ^= 1            # another NaN, by its bits
    assert torch.isnan(n2).all() and not verify.same_bits(n1, n2) and verify.same_bits(n1, n1.clone())
    t = torch.arange(12, dtype=torch.int64).reshape(3, 4).t()    # strided, 8-byte elements
    assert verify.same_bits(t, t.contiguous()) and not verify.same_bits(t, t.contiguous() + 1)
    flags = torch.tensor([True, False, True])
    assert verify.same_bits(flags, flags.clone()) and not verify.same_bits(flags, ~flags)
