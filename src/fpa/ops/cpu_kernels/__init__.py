"""The fused CPU kernels of the chunked engine: C++ sources in ``fpa/ops/csrc``, built on first use.

The kernels are plain C++ without torch headers, so the build takes a few seconds:
``csrc/fpa_kernels.h`` holds the per-row work, ``csrc/fpa_rows.cpp`` the driver for one query
chunk between torch's GEMMs, ``csrc/fpa_whole.cpp`` the whole-op driver, whose GEMMs go through the
BLAS torch has already loaded. They are compiled once per (sources, flags, compiler) with the
system's C++ compiler (``$CXX``, else ``g++``, else ``c++``) into a cache folder and called through
ctypes on tensors' data pointers. They link against the OpenMP runtime torch has already loaded, so
``torch.set_num_threads`` governs them too.

Modules:

- :mod:`fpa.ops.cpu_kernels.builder`: the compiler, the flags, the cache folder, the build.
- :mod:`fpa.ops.cpu_kernels.blas`: finding the BLAS of the whole-op driver and checking it.
- :mod:`fpa.ops.cpu_kernels.loader`: the process's library (built and loaded once), whether the
  kernels can run, what is in use.
- :mod:`fpa.ops.cpu_kernels.calls`: the typed calls into the library, every array checked first.

Environment: ``FPA_CPU_KERNEL=0`` turns the kernels off (the chunked backends then build their bias
with torch ops: slower, same results up to float rounding); ``FPA_KERNEL_CACHE`` sets the cache
folder (default ``$XDG_CACHE_HOME/fpa/kernels``, i.e. ``~/.cache/fpa/kernels``; a folder that cannot
be written falls back to a private one in the temp dir); ``CXX`` the compiler. A failed build warns
once and falls back to the torch ops.
"""
