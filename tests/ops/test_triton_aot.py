"""Every Triton kernel compiles ahead of time (no GPU) for every configuration the launcher can pick.

For sm_80 and sm_90, float32/bfloat16/float16 inputs and head dims 32/64/128, the forward, dq
and dk/dv kernels are compiled to cubins with the arguments, constexprs and launch options the
launcher itself passes (recorded by fpa.ops.fpa.triton.planned_launches), in two processes. A
compile error, any register spill, or shared memory over the architecture's per-block limit
fails the test of that kernel. The other candidates (pruned or not chosen) are compiled by
benchmarks/triton_aot.py, whose table is benchmarks/results/triton-aot.md.

Triton's compile cache (TRITON_CACHE_DIR, default ~/.triton/cache) makes reruns fast; a cold
run takes about 1.5-2.5 min on 2 cores (docs/design.md has the measured figure).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from fpa.ops.fpa import triton_aot as aot  # noqa: E402
from fpa.ops.fpa import triton_configs as configs  # noqa: E402
from fpa.ops.fpa.triton import planned_launches  # noqa: E402

JOBS = aot.launcher_jobs()


@pytest.fixture(scope="module")
def compiled() -> dict[tuple, aot.Compiled]:
    results = aot.compile_all(JOBS, workers=2)
    for r in results:  # the figures, in the test log (-s)
        print(
            f"{r.kernel:17s} sm_{r.arch} {r.dtype} D={r.head_dim:3d} block {r.block:2d} warps {r.num_warps}: "
            f"{r.regs} regs, spills {r.spill_stores}/{r.spill_loads} B, shared {r.shared} B, {r.compile_s:.1f} s"
        )
    return dict(zip(JOBS, results))


def test_the_table_covers_every_arch_dtype_and_head_dim_but_one():
    """float32 at head dim 128 on sm_90 spills in every candidate (benchmarks/results/triton-aot.md)."""
    keys = {(a, dt, d) for a in configs.SMEM_LIMIT for dt in configs.DTYPES.values() for d in configs.HEAD_DIMS}
    assert keys - set(configs.CONFIGS) == {(90, "fp32", 128)} and set(configs.CONFIGS) <= keys
    assert len(JOBS) == len(configs.CONFIGS) * len(configs.KERNELS)


@pytest.mark.parametrize("job", JOBS, ids=lambda j: f"sm{j[0]}-{str(j[1])[6:]}-D{j[2]}-{j[3]}")
def test_compiles_clean(compiled, job):
    r = compiled[job]
    cfg = configs.CONFIGS[(r.arch, r.dtype, r.head_dim)]
    assert (r.block, r.num_warps) == (cfg.block, cfg.options(r.kernel)["num_warps"]), "not the launcher's configuration"
    assert not r.problems(), f"{r.kernel} sm_{r.arch} {r.dtype} D={r.head_dim}: {r.problems()}"
    assert 0 < r.regs <= 255 and 0 < r.shared <= configs.SMEM_LIMIT[r.arch]


def test_planned_launches_are_the_launchers():
    """The recorded calls carry the table's tile and warps and the launcher's own constexprs."""
    calls = planned_launches(90, torch.bfloat16, 128)
    cfg = configs.CONFIGS[(90, "bf16", 128)]
    assert [c[0] for c in calls] == list(configs.KERNELS)
    for name, args, consts, options in calls:
        assert consts == dict(consts, BLOCK=cfg.block, BD=128, BDV=128, PREC=None, UPCAST=False)
        assert options == cfg.options(name)
        assert not any(isinstance(a, int) and a == 1 for a in args), "an int equal to 1 would be a constexpr"
    fp32 = planned_launches(80, torch.float32, 64)
    assert all(c[2]["PREC"] == "ieee" and c[2]["BD"] == 64 for c in fp32)


def test_a_spilling_candidate_is_reported():
    """The check can fail: the forward at tile 64 with 4 warps, bfloat16, head dim 128 spills on sm_80."""
    r = aot.compile_kernel(80, torch.bfloat16, 128, "_fwd_kernel", configs.LaunchConfig(64, (4, 4, 4)))
    assert r.spill_stores > 0 and any("spills" in p for p in r.problems()), r


def test_lookup_refuses_what_was_not_compiled():
    assert isinstance(configs.lookup(90, "sm_90", torch.bfloat16, torch.float32, 80, 80), configs.LaunchConfig)
    assert "sm_86" in str(configs.lookup(None, "sm_86", torch.bfloat16, torch.float32, 64, 64))
    assert "float64" in str(configs.lookup(90, "sm_90", torch.float64, torch.float64, 64, 64))
    assert "float64 math" in str(configs.lookup(90, "sm_90", torch.bfloat16, torch.float64, 64, 64))
    assert "head dim 256" in str(configs.lookup(80, "sm_80", torch.float16, torch.float32, 64, 256))
    assert "head dim 128" in str(configs.lookup(90, "sm_90", torch.float32, torch.float32, 128, 128))
    assert configs.padded_head_dim(8, 8) == 32 and configs.padded_head_dim(64, 80) == 128
