"""The copy ceiling and the timed repetitions' sampled comparison, on a real GPU."""
from __future__ import annotations

import pytest
import torch

from core.evaluation.roofline import copy_kernels, measure_ceilings
from core.evaluation.timer import COMPARE_SAMPLES, Timer, TimerSettings, agrees

pytestmark = pytest.mark.gpu


def test_every_copy_kernel_copies_and_the_ceiling_is_the_fastest_copy():
    n = (1 << 20) + 12                     # not a multiple of any block: the tails are copied too
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    kernels = copy_kernels(src, dst)
    assert {"torch copy_", "ca_copy_v1", "ca_copy_v4", "ca_copy_stride"} <= set(kernels)
    for name, fn in kernels.items():
        dst.zero_()
        fn()
        torch.cuda.synchronize()
        assert torch.equal(dst, src), name
    c = measure_ceilings(torch.device("cuda"), torch.cuda.get_device_name())
    assert c.copy_kernel in kernels and 500 < c.copy_gbps < 10_000
    print(f"copy ceiling {c.copy_gbps:.0f} GB/s by {c.copy_kernel}")


def test_a_kernel_that_skips_a_thousandth_of_its_output_on_later_calls_is_caught():
    """A large output (beyond 4 x COMPARE_SAMPLES elements) is compared at sampled positions."""
    n = 16 * COMPARE_SAMPLES
    x = torch.rand(n, device="cuda")
    out = torch.empty_like(x)
    calls = []

    def call():
        calls.append(1)
        torch.mul(x, 3.0, out=out)
        if len(calls) > 4:
            out[n // 2: n // 2 + n // 1000] = float("nan")
        return [out]

    timer = Timer(torch.device("cuda"), 50 << 20, TimerSettings(warmup_ms=1.0, min_reps=20, min_total_ms=1.0))
    run = timer.run(call, [x], [[x.clone()]], poison_outputs=lambda: out.fill_(float("nan")))
    assert run.mismatched_reps == 1
    honest = Timer(torch.device("cuda"), 50 << 20, TimerSettings(warmup_ms=1.0, min_reps=20, min_total_ms=1.0))
    calls.clear()
    ok = honest.run(lambda: [torch.mul(x, 3.0, out=out)], [x], [[x.clone()]],
                    poison_outputs=lambda: out.fill_(float("nan")))
    assert ok.mismatched_reps == 0 and len(ok.samples_ms) >= 20
    g = torch.Generator(device="cuda").manual_seed(3)
    assert agrees(out, out.clone(), 1e-4, 1e-4, g)
