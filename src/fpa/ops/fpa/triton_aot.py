"""Ahead-of-time compilation of the Triton kernels for a GPU architecture, on a machine without a GPU.

``compile_kernel`` compiles one kernel exactly as the launcher would call it (the arguments
recorded by ``fpa.ops.fpa.triton.planned_launches``: Triton's own specialization of each argument,
the constexprs, num_warps and num_stages) with ``triton.compile`` for ``GPUTarget("cuda", arch,
32)``: Triton to PTX, then the ptxas shipped with Triton to a cubin. Its resources are read from
the cubin: registers per thread (``cuobjdump --dump-resource-usage``), spill stores and loads in
bytes (the local-memory STL/LDL instructions of the SASS, by width: the kernels keep no arrays in
local memory, so every local access is a spill; the figures equal ptxas' ``-v`` report), and
shared memory (Triton's metadata). The compiled kernels are not run.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

import torch

from fpa.ops.fpa import triton_configs as configs


@dataclass(frozen=True)
class Compiled:
    """One kernel compiled for one architecture, dtype, head dim and launch configuration."""

    kernel: str
    arch: int
    dtype: str
    head_dim: int
    block: int
    num_warps: int
    num_stages: int
    regs: int = -1
    spill_stores: int = -1  # bytes
    spill_loads: int = -1  # bytes
    shared: int = -1  # bytes
    compile_s: float = 0.0
    error: str = ""

    def problems(self) -> list[str]:
        """Why this kernel cannot be launched as compiled: an error, spills, or shared memory over
        the architecture's per-block limit. Empty when clean."""
        if self.error:
            return [f"compile error: {self.error}"]
        out = []
        if self.spill_stores or self.spill_loads:
            out.append(f"spills {self.spill_stores} B stored / {self.spill_loads} B loaded")
        if self.shared > configs.SMEM_LIMIT[self.arch]:
            out.append(f"shared memory {self.shared} B > {configs.SMEM_LIMIT[self.arch]} B (sm_{self.arch} limit)")
        return out

    def row(self) -> dict:
        return asdict(self)


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def cubin_resources(cubin: bytes) -> tuple[int, int, int]:
    """-> (registers per thread, spill store bytes, spill load bytes) of a single-kernel cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name], capture_output=True, text=True)
        sass = subprocess.run([_tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True)
    m = re.search(r"REG:(\d+)", usage.stdout)
    if usage.returncode or sass.returncode or m is None:
        raise RuntimeError(f"cuobjdump failed: {usage.stderr[-500:]} {sass.stderr[-500:]}")

    def nbytes(op: str) -> int:
        ops = re.findall(rf"\b{op}((?:\.[A-Z0-9]+)*)", sass.stdout)
        return sum(16 if ".128" in mods else 8 if ".64" in mods else 4 for mods in ops)

    return int(m.group(1)), nbytes("STL"), nbytes("LDL")


def signature(fn, args: tuple, consts: dict) -> tuple[dict, dict]:
    """Triton's specialization of ``args`` for kernel ``fn`` -> (signature, attrs) for ASTSource,
    as the JIT launcher derives them (pointer and int alignment, ints equal to 1 as constexprs)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    sig, attrs, values = {}, {}, iter(args)
    for i, (name, param) in enumerate(zip(fn.arg_names, fn.params)):
        if param.is_constexpr:
            sig[name] = "constexpr"
            continue
        ty, spec = native_specialize_impl(BaseBackend, next(values), False, True, True)
        if ty == "constexpr":
            raise ValueError(f"argument {name} was specialized to a constant; record launches without ints equal to 1")
        sig[name] = ty
        if isinstance(spec, str) and spec:
            attrs[(i,)] = BaseBackend.parse_attr(spec)
    assert set(consts) == {n for n, t in sig.items() if t == "constexpr"}, "constexprs do not match the kernel"
    return sig, attrs


def compile_kernel(
    arch: int, dtype: torch.dtype, head_dim: int, kernel: str, config: configs.LaunchConfig | None = None
) -> Compiled:
    """Compile ``kernel`` as the launcher calls it on ``arch`` for these inputs (``config``: a
    candidate to try instead of the one in triton_configs.CONFIGS)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from fpa.ops.fpa import triton_kernels
    from fpa.ops.fpa.triton import planned_launches

    name, args, consts, options = next(c for c in planned_launches(arch, dtype, head_dim, config) if c[0] == kernel)
    fn = getattr(triton_kernels, name)
    base = dict(
        kernel=kernel,
        arch=arch,
        dtype=configs.DTYPES[dtype],
        head_dim=head_dim,
        block=consts["BLOCK"],
        num_warps=options["num_warps"],
        num_stages=options["num_stages"],
    )
    t0 = time.perf_counter()
    try:
        sig, attrs = signature(fn, args, consts)
        src = ASTSource(fn, signature=sig, constexprs=consts, attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
        regs, st, ld = cubin_resources(compiled.asm["cubin"])
    except Exception as e:  # noqa: BLE001 - reported as this kernel's problem
        return Compiled(**base, compile_s=time.perf_counter() - t0, error=f"{type(e).__name__}: {str(e)[:300]}")
    return Compiled(
        **base,
        regs=regs,
        spill_stores=st,
        spill_loads=ld,
        shared=compiled.metadata.shared,
        compile_s=round(time.perf_counter() - t0, 2),
    )


def _compile_job(job: tuple) -> Compiled:
    return compile_kernel(*job)


def compile_all(jobs: list[tuple], workers: int = 2) -> list[Compiled]:
    """compile_kernel(*job) for each job, in ``workers`` processes; results in the jobs' order."""
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    if workers <= 1:
        return [_compile_job(j) for j in jobs]
    # spawn, not fork: a forked copy of a process whose torch already runs threads can deadlock
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        return list(ex.map(_compile_job, jobs))


def launcher_jobs(
    archs=tuple(configs.SMEM_LIMIT), dtypes=tuple(configs.DTYPES), head_dims=configs.HEAD_DIMS
) -> list[tuple]:
    """Every (arch, dtype, head dim, kernel) the launcher can run (an entry of CONFIGS), each to be
    compiled with the configuration it picks."""
    return [
        (a, dt, d, k)
        for a in archs
        for dt in dtypes
        for d in head_dims
        if (a, configs.DTYPES[dt], d) in configs.CONFIGS
        for k in configs.KERNELS
    ]
