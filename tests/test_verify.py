"""tools/verify.py: the element and norm rules, input families, and the rule against the output's scale for them."""
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
    x = torch.rand(4, 1 << 20) * 8 - 4                      # a signed family's inputs; partial sums reach ~3000
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
    assert reasons and stats["mismatches"] == 11 and stats["norm_off"] > verify.NORM_FLOOR[torch.float32]  # off ref
    bad, own, theirs = verify.against_float64(two_pass, ref, exact, stats["atol"], stats["rtol"])
    assert bad == 0 and own < 0.01 and 1.5 < theirs < 2.5        # but nearer the truth than the reference is
    off = two_pass.clone()
    off[3] *= 1 + 3e-2                                           # one element 3% off: far beyond the reference there
    bad, own, theirs = verify.against_float64(off, ref, exact, stats["atol"], stats["rtol"])
    assert bad == 1 and own > 10


def _layer_norm_other_order(y: torch.Tensor) -> torch.Tensor:
    """LayerNorm over the last dimension in float32, its sums taken one term after another (cumsum), as a kernel
    that loops over a row does."""
    n = y.shape[-1]
    centred = y - torch.cumsum(y, -1)[..., -1:] / n
    return centred * torch.rsqrt(torch.cumsum(centred * centred, -1)[..., -1:] / n + 1e-5)


@pytest.mark.parametrize("scale_log2", [-14, -20])
def test_an_honest_float32_order_on_an_ill_conditioned_op_is_credited_and_wrong_elements_are_not(scale_log2,
                                                                                                  monkeypatch):
    # LayerNorm(x + c) on tiny x (a small-inputs family after a bias, as level 2's conv + LayerNorm): rounding
    # x + c leaves a few bits of each row's spread, so any float32 order is far from the truth somewhere; only a
    # draw of luck keeps the reference near it at an element. The same op in another float32 order must pass.
    torch.manual_seed(0)
    x, c = torch.rand(20_000, 64) * 2.0 ** scale_log2, 1 + (torch.rand(20_000, 1) - 0.5) * 0.05
    ref = torch.nn.functional.layer_norm(x + c, (64,), eps=1e-5)
    exact = torch.nn.functional.layer_norm(x.double() + c.double(), (64,), eps=1e-5)
    step = torch.randint(0, 2, x.shape, generator=torch.Generator().manual_seed(7)).float().mul_(2).sub_(1)
    moved = torch.nn.functional.layer_norm(x * (1 + step * torch.finfo(torch.float32).eps) + c, (64,), eps=1e-5)
    honest = _layer_norm_other_order(x + c)
    reasons, stats = verify.compare(honest, ref, to_scale=True, masked=True)
    assert reasons and stats["mismatches"] > 0.1 * x.numel()      # far off the reference: it is far off too
    bad, own, theirs = verify.against_float64(honest, ref, exact, stats["atol"], stats["rtol"], moved)
    assert bad == 0 and theirs > 10 and own < theirs
    wrong = honest.clone()
    wrong.view(-1)[::997] += 0.05                                  # 1 in 997 elements off by 0.05 (values ~1)
    sparse = len(range(0, x.numel(), 997))
    assert verify.against_float64(wrong, ref, exact, stats["atol"], stats["rtol"], moved)[0] == sparse
    if scale_log2 == -14:   # at 2^-20 the reference keeps no bit of a row's spread: a row of 0 is within its noise
        wrong[-1] = 0
        assert verify.against_float64(wrong, ref, exact, stats["atol"], stats["rtol"], moved)[0] >= sparse + 60
    monkeypatch.setattr(verify, "LOCAL_BLOCK", 1)   # one draw of rounding noise per element: thousands refused
    assert verify.against_float64(honest, ref, exact, stats["atol"], stats["rtol"], moved)[0] > 1000


def test_all_finite_looks_at_every_slice(monkeypatch):
    monkeypatch.setattr(verify, "CHUNK", 8)
    t = torch.zeros(10, 4)
    assert verify.all_finite(t)
    t[9, 3] = float("inf")                                       # in the last slice only
    assert not verify.all_finite(t)


def test_input_families_keep_order_and_bits_and_leave_whole_numbers_alone():
    from types import SimpleNamespace

    from tools.inputs import FAMILIES, drawable, make_inputs

    assert drawable(torch.rand(100)) and drawable(torch.randn(100)) and drawable(torch.rand(64, 32).t())
    assert not drawable(torch.randint(0, 5, (100,)).float())            # whole numbers: a mask, counts, indices
    assert not drawable(torch.full((100,), 0.5)) and not drawable(torch.rand(1))
    assert not drawable(torch.rand(1, 8).expand(4, 8))                   # one element stands for four
    module = SimpleNamespace(get_inputs=lambda: [torch.rand(16, 64), torch.arange(10), 3])
    own = make_inputs(module, 7)
    ranges = {}
    for family in FAMILIES:
        x, idx, k = make_inputs(module, 7, family)
        assert torch.equal(x, make_inputs(module, 7, family)[0])         # the same bits on both sides
        assert torch.equal(idx, own[1]) and k == 3                       # only drawable inputs move
        assert not torch.equal(x, own[0]) and torch.isfinite(x).all()
        if family not in ("sorted", "reversed", "tied", "near_one"):   # near one, float32 rounding makes ties
            assert torch.equal(x.argsort(), own[0].argsort())           # sorted boundaries stay sorted
        ranges[family] = (float(x.min()), float(x.max()))
    assert ranges["signed"][0] < 0 < ranges["signed"][1] and 0 < ranges["positive"][0]
    assert ranges["negative"][1] < 0 and ranges["near_one"][0] >= 1 - 2 ** -6 and ranges["near_one"][1] == 1.0
    assert ranges["large"][1] > 15 and ranges["small"][1] < 2 ** -7
    sorted_rows = make_inputs(module, 7, "sorted")[0]
    assert torch.equal(sorted_rows, sorted_rows.sort(dim=-1).values)
    reversed_rows = make_inputs(module, 7, "reversed")[0]
    assert torch.equal(reversed_rows, reversed_rows.sort(dim=-1, descending=True).values)
    assert len(make_inputs(module, 7, "tied")[0][0].unique()) <= 8
    assert make_inputs(module, 8, "signed")[0].min() != ranges["signed"][0]   # another seed, another map


def test_an_output_below_every_atol_is_still_judged_element_by_element_and_as_a_whole():
    torch.manual_seed(0)
    logits = torch.randn(4, 1 << 17)
    ref = torch.softmax(logits, dim=1)                      # every element ~1/n: below float32's atol of 1e-4
    reasons, stats = verify.compare(torch.zeros_like(ref), ref)
    assert reasons and stats["mismatches"] > 0.99 * ref.numel() and stats["norm_off"] == pytest.approx(1.0)
    honest = torch.exp(logits - logits.amax(1, keepdim=True))
    honest = honest / honest.sum(1, keepdim=True)
    assert verify.compare(honest, ref)[0] == []
    top_only = ref.clone()
    top_only[ref < ref.amax(1, keepdim=True) / 4] = 0       # right where it is largest, zero elsewhere
    assert verify.compare(top_only, ref)[0]


def test_arithmetic_coarser_than_the_dtype_fails_the_norm_though_every_element_is_within_atol():
    torch.manual_seed(0)
    x, w = torch.randn(256, 512), torch.randn(512, 512) / 512 ** 0.5     # logits ~ N(0, 1), as nn.Linear makes
    ref = torch.softmax(x @ w.T, dim=1)
    coarse = torch.softmax(x.half().float() @ w.half().float().T, dim=1)   # a GEMM reading float16 operands
    reasons, stats = verify.compare(coarse, ref)
    assert stats["max_abs_err"] < 1e-4                      # under float32's atol everywhere: a fixed atol credited it
    assert any("of its norm" in r for r in reasons) and stats["norm_off"] > 1e-4
    reordered = torch.softmax((x.double() @ w.double().T).float(), dim=1)       # more exact than the reference
    assert verify.compare(reordered, ref)[0] == []


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 with TF32's 10-bit mantissa (the low 13 bits cleared), as a tensor core reads it."""
    return (t.view(torch.int32) & ~0x1FFF).view(torch.float32)


def test_a_sum_that_cancels_allows_any_summation_order_but_not_lower_precision(monkeypatch):
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
    assert stats["mismatches"] <= 2   # 2 with torch 2.13's CPU matmul; another BLAS rounds elsewhere (2.11's: 0)
    assert verify.against_float64(reordered, ref, exact, stats["atol"], stats["rtol"], moved)[0] == 0
    # without the move too: the reference's own distances among the element's neighbours cover it
    assert verify.against_float64(reordered, ref, exact, stats["atol"], stats["rtol"])[0] == 0
    tf32 = (_tf32(x) @ _tf32(w).T / 2).sum(1, keepdim=True) * 1.5
    tf32_stats = verify.compare(tf32, ref)[1]
    bad, own, _ = verify.against_float64(tf32, ref, exact, tf32_stats["atol"], tf32_stats["rtol"], moved)
    assert bad > 100 and own > 100
    if stats["mismatches"] == 2:   # the rounding of torch 2.13's CPU matmul, where the reference is lucky once
        monkeypatch.setattr(verify, "LOCAL_BLOCK", 1)   # the element's own distances alone: without the move, refused
        assert verify.against_float64(reordered, ref, exact, stats["atol"], stats["rtol"])[0] == 1


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
        "within": (ref * (1 + 5e-6) + 1e-7, ref),
        "near the bound": (near, ref),
        "one element off at the end": (off_by_one, ref),
        "NaN": (nan_out, ref),
        "infinity out": (inf_out, ref),
        "infinity in the reference": (inf_ref.clone(), inf_ref),
        "float16": (ref.half() + 1e-3, ref.half()),
        "bfloat16": (ref.bfloat16(), ref.bfloat16()),
        "float64": ((ref * (1 + 1e-14)).double(), ref.double()),
        "float64 off": ((ref + 1e-5).double(), ref.double()),
        "one element": (ref[:1] * (1 + 2e-6), ref[:1]),
    }


@pytest.mark.device
@pytest.mark.parametrize("case", list(_cases()))
@pytest.mark.parametrize("masked", [False, True])
def test_the_fused_first_pass_finds_what_the_torch_pass_does(case, masked):
    device = "cuda" if torch.cuda.is_available() else "cpu"   # the compiled kernel on a GPU, else interpreted
    out, ref = (t.to(device) for t in _cases()[case])
    rtol = verify.TOLERANCES[ref.dtype][1]
    fused = verify._fast_pass_fused(out, ref, rtol, masked)
    plain = verify._fast_pass_torch(out, ref, rtol, masked)
    assert fused.finite == plain.finite and fused.count == plain.count
    for name in ("excess", "max_abs", "max_rel", "ref_max", "rms", "norm_err"):
        assert getattr(fused, name) == pytest.approx(getattr(plain, name), rel=1e-5, abs=1e-12), name
    accepted = {"exact", "within", "float16", "bfloat16", "float64", "one element", "infinity in the reference"}
    assert (not verify.compare(out, ref, masked=masked)[0]) == (case in accepted)


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


def test_a_masked_family_leaves_out_elements_near_overflow():
    x = torch.full((4, 64), 2.0 ** 6)
    ref = torch.cumprod(x, dim=1)                            # reaches float32's largest values, then infinity
    out = ref.clone()
    near = (ref.abs() > torch.finfo(torch.float32).max * 2.0 ** -10) & torch.isfinite(ref)
    out[near] = float("inf")                                 # another order overflows a step earlier
    assert verify.compare(out, ref)[0]                       # the target's own inputs: the positions must agree
    assert verify.compare(out, ref, to_scale=True, masked=True)[0] == []
    out[1, 40] = float("-inf")                               # an overflowing row: its order's other infinities
    assert verify.compare(out, ref, to_scale=True, masked=True)[0] == []
    fine = torch.randn(4, 64)
    wrong = fine.clone()
    wrong[0, 0] = 5.0                                        # a wrong element in a row that never overflows
    assert verify.compare(wrong, fine, masked=True)[0]


def test_an_output_beyond_the_reference_as_often_as_the_reverse_is_its_peer():
    # InstanceNorm of a convolution on small inputs (level 2's 17): each channel's mean rounds once, so the reference
    # and an honest kernel are each off by one draw of noise per channel of 4096 elements, and where the reference's
    # draw is small by luck, all 4096 of the kernel's are beyond it. As many of the reference's are beyond the kernel's.
    g = torch.Generator().manual_seed(0)
    exact = torch.randn(512, 4096, generator=g, dtype=torch.float64)

    def noisy(scale: float) -> torch.Tensor:
        per_channel = torch.randn(512, 1, generator=g, dtype=torch.float64) * 3e-4 * scale
        return (exact + per_channel + torch.randn(512, 4096, generator=g, dtype=torch.float64) * 1e-6).float()

    ref, honest, coarse = noisy(1), noisy(1), noisy(4)
    atol, rtol = 1e-5, 1e-4
    bad, own, theirs = verify.against_float64(honest, ref, exact, atol, rtol)
    beyond_out, beyond_ref = verify.exchanged(honest, ref, exact, atol, rtol)
    assert bad > 100_000 and 0.5 < beyond_out / beyond_ref < 2
    assert verify.a_peer_of_the_reference(beyond_out, beyond_ref, own, theirs, exact.numel())
    # four times the noise: beyond the reference far more often than the reverse
    bad, own, theirs = verify.against_float64(coarse, ref, exact, atol, rtol)
    beyond_out, beyond_ref = verify.exchanged(coarse, ref, exact, atol, rtol)
    assert beyond_out > 4 * beyond_ref and not verify.a_peer_of_the_reference(beyond_out, beyond_ref, own, theirs,
                                                                                   exact.numel())
    # one element off among honest ones: its worst is many times the reference's worst
    wrong = honest.clone()
    wrong[7, 99] += 0.05
    bad, own, theirs = verify.against_float64(wrong, ref, exact, atol, rtol)
    assert own > 10 * theirs and not verify.a_peer_of_the_reference(*verify.exchanged(wrong, ref, exact, atol, rtol),
                                                                    own, theirs, exact.numel())


def test_where_the_reference_left_the_truths_trajectory_only_the_worst_and_the_norm_compare():
    # A GRU of 512 steps on large inputs: a saturated gate flips on a rounding error and the flip carries to every
    # later step of its row, so two float32 runs diverge from the truth in different rows, of different sizes.
    g = torch.Generator().manual_seed(0)
    exact = torch.randn(64, 4096, generator=g, dtype=torch.float64) * 100
    atol, rtol = 1e-3, 1e-4

    def diverged(rows: slice) -> torch.Tensor:
        run = exact + torch.randn(exact.shape, generator=g, dtype=torch.float64) * 1e-6 * exact.abs()
        run[rows] = torch.randn(run[rows].shape, generator=g, dtype=torch.float64) * 100   # its own trajectory
        return run.float()

    ref, honest = diverged(slice(3, 4)), diverged(slice(20, 24))   # the kernel's flip came earlier: 4 rows
    bad, own, theirs = verify.against_float64(honest, ref, exact, atol, rtol)
    beyond_out, beyond_ref = verify.exchanged(honest, ref, exact, atol, rtol)
    assert theirs > verify.CHAOTIC and beyond_out > 3 * beyond_ref + 16 and own <= verify.WORST_FACTOR * theirs
    assert verify.a_peer_of_the_reference(beyond_out, beyond_ref, own, theirs, exact.numel())
    # the same counts where the reference stayed on the truth's trajectory: the counts still decide
    assert not verify.a_peer_of_the_reference(beyond_out, beyond_ref, own, verify.CHAOTIC / 10, exact.numel())
    # and the worst still bounds a chaotic one
    assert not verify.a_peer_of_the_reference(beyond_out, beyond_ref, 3 * theirs, theirs, exact.numel())


def test_the_worst_is_compared_with_the_worst_of_the_references_two_draws():
    # Near chaos (a GRU's hidden state on large inputs) one float32 draw's worst says little of another's: the
    # reference 250 tolerances off at its worst, its rerun on inputs moved by a rounding step 400, an honest kernel
    # 576. Against the reference alone it was refused; against the worse of its two draws it is a peer.
    exact = torch.full((4096,), 100.0, dtype=torch.float64)
    atol, rtol = 1e-3, 1e-4
    tol = atol + rtol * 100.0

    def off_by(tolerances: dict[int, float]) -> torch.Tensor:
        run = exact.clone()
        for i, k in tolerances.items():
            run[i] += k * tol
        return run.float()

    ref, moved = off_by({5: 250, 900: 40}), off_by({5: 240, 2000: 400})
    honest, sparse_wrong = off_by({5: 245, 3000: 576}), off_by({5: 245, 3000: 900})
    bad, own, theirs = verify.against_float64(honest, ref, exact, atol, rtol, moved)
    assert (bad, round(own), round(theirs)) == (1, 576, 400)   # the element at 3000 is beyond either draw's noise
    assert verify.a_peer_of_the_reference(*verify.exchanged(honest, ref, exact, atol, rtol), own, theirs,
                                          exact.numel())
    _, _, theirs_alone = verify.against_float64(honest, ref, exact, atol, rtol)   # no moved draw: the reference's
    assert round(theirs_alone) == 250 and not verify.a_peer_of_the_reference(
        *verify.exchanged(honest, ref, exact, atol, rtol), own, theirs_alone, exact.numel())
    # an element 900 tolerances off is beyond twice the worse draw too
    _, own, theirs = verify.against_float64(sparse_wrong, ref, exact, atol, rtol, moved)
    assert round(own) == 900 and not verify.a_peer_of_the_reference(
        *verify.exchanged(sparse_wrong, ref, exact, atol, rtol), own, theirs, exact.numel())
