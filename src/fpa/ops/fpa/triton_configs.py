"""Which launch configurations the Triton kernels use on a GPU: only ones compiled clean ahead of time.

A configuration (tile size, num_warps per kernel) is "compiled clean" for a GPU architecture when
all three kernels compile for it (Triton to PTX, then the ptxas shipped with Triton) with no
register spills and with shared memory within the architecture's per-block limit.
``benchmarks/triton_aot.py`` compiles every candidate (``CANDIDATE_BLOCKS`` x ``CANDIDATE_WARPS``)
for every architecture, dtype and head dim and picks by ``choose``; ``CONFIGS`` is its result,
and ``tests/ops/test_triton_aot.py`` compiles every entry of it with exactly the arguments the
launcher passes, failing on a compile error, a spill or too much shared memory. No GPU is needed
for any of this; how fast each configuration runs is measured only on a GPU (gpu_check.py).

Covered: sm_80 (A100) and sm_90 (H100/H200); float32, bfloat16 and float16 inputs with float32
math; head dims up to 128 (D and Dv padded to a power of two >= 32: 32, 64 or 128). Anything else
(another architecture, float64, head dim > 128) has no configuration, and the triton backend
refuses it with that reason (``backend="auto"`` then picks another backend).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KERNELS = ("_fwd_kernel", "_bwd_dq_kernel", "_bwd_dkdv_kernel")
# Opt-in maximum dynamic shared memory per block (bytes): CUDA C Programming Guide, compute
# capabilities table (8.0: 163 KB, 9.0: 227 KB).
SMEM_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
HEAD_DIMS = (32, 64, 128)
# Tiles tried, in order of preference: larger first (fewer programs, fewer field scans). float32
# (exact IEEE dots, done as FMAs) never tries 64: its forward alone spilled 27-58 KB at head dim
# 128 and 29 KB at 64, and took 22-84 s per compile (see docs/design.md).
CANDIDATE_BLOCKS = {"fp32": (32, 16), "bf16": (64, 32, 16), "fp16": (64, 32, 16)}
CANDIDATE_WARPS = (4, 8)  # Triton's default first


@dataclass(frozen=True)
class LaunchConfig:
    """How the three kernels of one (architecture, input dtype, head dim) are launched.

    block: queries and keys per tile, shared by the forward and the backward (the saved
    log-sum-exp is laid out per tile); warps: num_warps of the kernels in ``KERNELS`` order.
    num_stages: Triton's default; the kernels' loops hold data-dependent branches (tile
    skipping), which Triton does not software-pipeline, so it changes nothing (checked on the
    compiled sizes).
    """

    block: int
    warps: tuple[int, int, int]
    num_stages: int = 3

    def options(self, kernel: str) -> dict[str, int]:
        """Triton launch options (num_warps, num_stages) of ``kernel``, one of ``KERNELS``."""
        return {"num_warps": self.warps[KERNELS.index(kernel)], "num_stages": self.num_stages}

    def describe(self) -> str:
        """One-line form, e.g. "block 64, num_warps fwd 8 / dq 4 / dkdv 8"."""
        f, q, k = self.warps
        return f"block {self.block}, num_warps fwd {f} / dq {q} / dkdv {k}"


def _c(block: int, fwd: int, dq: int, dkdv: int) -> LaunchConfig:
    return LaunchConfig(block, (fwd, dq, dkdv))


# (arch, dtype, padded head dim) -> configuration; written from benchmarks/triton_aot.py's sweep
# (benchmarks/results/triton-aot.md), checked by tests/ops/test_triton_aot.py.
# No entry for float32 at head dim 128 on sm_90: every candidate spills there (the dq kernel at
# tile 16 with 8 warps by 12 bytes), so the triton backend refuses it. No tile of 64 compiles clean
# for the backward at any dtype, so 16-bit inputs use 32.
CONFIGS: dict[tuple[int, str, int], LaunchConfig] = {
    (80, "bf16", 32): _c(32, 4, 4, 4),
    (80, "bf16", 64): _c(32, 4, 4, 4),
    (80, "bf16", 128): _c(32, 4, 8, 8),
    (80, "fp16", 32): _c(32, 4, 4, 4),
    (80, "fp16", 64): _c(32, 4, 4, 4),
    (80, "fp16", 128): _c(32, 4, 8, 8),
    (80, "fp32", 32): _c(32, 4, 4, 8),
    (80, "fp32", 64): _c(16, 4, 8, 4),
    (80, "fp32", 128): _c(16, 8, 8, 8),
    (90, "bf16", 32): _c(32, 4, 4, 4),
    (90, "bf16", 64): _c(32, 4, 4, 4),
    (90, "bf16", 128): _c(32, 4, 8, 4),
    (90, "fp16", 32): _c(32, 4, 4, 4),
    (90, "fp16", 64): _c(32, 4, 4, 4),
    (90, "fp16", 128): _c(32, 4, 8, 4),
    (90, "fp32", 32): _c(32, 4, 4, 8),
    (90, "fp32", 64): _c(16, 4, 8, 4),
}


def padded_head_dim(D: int, Dv: int) -> int:
    """The head dim the kernels are compiled for: one power of two >= 32 covering D and Dv (the
    loads are masked to the true sizes)."""
    return max(32, 1 << max(max(D, Dv) - 1, 0).bit_length())


def cuda_arch(device: torch.device) -> tuple[int | None, str]:
    """-> (the key of CONFIGS for this GPU (80 or 90), or None; "sm_XY")."""
    major, minor = torch.cuda.get_device_capability(device)
    arch = 10 * major + minor
    return (arch if arch in SMEM_LIMIT else None), f"sm_{arch}"


def lookup(
    arch: int | None, arch_name: str, dtype: torch.dtype, acc: torch.dtype, D: int, Dv: int
) -> LaunchConfig | str:
    """The configuration for these inputs, or why there is none."""
    covered = "covered: sm_80, sm_90; float32/bfloat16/float16 inputs with float32 math; head dims <= 128"
    if arch is None:
        return f"no launch configuration compiled for {arch_name} ({covered})"
    if dtype not in DTYPES or acc != torch.float32:
        return f"no launch configuration compiled for {dtype} inputs with {acc} math ({covered})"
    bd = padded_head_dim(D, Dv)
    cfg = CONFIGS.get((arch, DTYPES[dtype], bd))
    if cfg is None:
        return f"no launch configuration compiled for head dim {max(D, Dv)} on {arch_name} ({covered})"
    return cfg


def choose(dtype: str, clean: dict[tuple[int, int, str], bool]) -> LaunchConfig | None:
    """The rule CONFIGS follows, for one (arch, dtype, head dim): ``clean[(block, warps, kernel)]``
    says whether that kernel compiled clean -> the largest block at which every kernel has a
    clean num_warps, each kernel taking the first clean one of CANDIDATE_WARPS; None if no block."""
    for block in CANDIDATE_BLOCKS[dtype]:
        warps = [next((w for w in CANDIDATE_WARPS if clean.get((block, w, k))), None) for k in KERNELS]
        if all(w is not None for w in warps):
            return LaunchConfig(block, (warps[0], warps[1], warps[2]))  # type: ignore[arg-type]
    return None
