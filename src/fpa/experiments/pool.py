"""Run many independent pipeline stages, in this process or in a pool of worker processes.

Each task is ``(stage name, function, args)`` with a module-level ``function(*args) -> dict``
(picklable, so it can run in a worker). Only the parent process records finished stages
(``Stages.record``), so the state file has one writer. Before it starts any, it refuses code that
changed since the stamp of ``stages`` was taken (``provenance.refuse_changed_code``). Workers start
with the ``spawn`` method and ``os.cpu_count() // jobs`` torch threads each, and exit when the
parent process dies (a killed run leaves no worker behind).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context

from fpa.checks import positive_int
from fpa.experiments.provenance import refuse_changed_code
from fpa.experiments.stages import Stages, read_json

Task = tuple[str, Callable[..., dict], tuple]


PARENT_POLL_S = 1.0  # how often a worker checks that the process that started it is alive


def _init_worker(threads: int, parent_pid: int) -> None:
    import threading

    import torch

    torch.set_num_threads(threads)
    # A worker whose parent was killed would train on for minutes, holding cores, its result lost.
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _timed(fn: Callable[..., dict], args: tuple) -> tuple[dict, float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def run_tasks(
    stages: Stages, tasks: Sequence[Task], jobs: int = 1, progress: bool = True, desc: str = "stages"
) -> dict[str, dict]:
    """{stage name: output} for every task; finished stages are read back, the others run, in
    order of ``tasks``, ``jobs`` at a time (``jobs`` = 1: in this process)."""
    positive_int("jobs", jobs)
    names = [t[0] for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"stage names must be unique, got duplicates in {names}")
    out = {name: read_json(stages.output_path(name)) for name, _, _ in tasks if stages.done(name)}
    todo = [t for t in tasks if t[0] not in out]

    def record(name: str, result: tuple[dict, float]) -> None:
        out[name] = stages.record(name, *result)

    if todo:
        refuse_changed_code(stages.stamp)
    _execute(todo, jobs, progress, desc, record, stages.log)
    return out


def run_units(stages: Stages, units: Sequence[Task], jobs: int = 1, progress: bool = True, desc: str = "units") -> None:
    """Run units of several stages each, ``jobs`` at a time (``jobs`` = 1: in this process): a
    unit's function returns {stage name: {"output": dict, "seconds": float}}, and every stage it
    returns is recorded when the unit ends (the caller chooses which units still need to run)."""
    positive_int("jobs", jobs)

    def record(label: str, result: tuple[dict, float]) -> None:
        for name, r in result[0].items():
            stages.record(name, r["output"], r["seconds"])

    if units:
        refuse_changed_code(stages.stamp)
    _execute(list(units), jobs, progress, desc, record, stages.log)


def _execute(
    todo: list[Task],
    jobs: int,
    progress: bool,
    desc: str,
    on_result: Callable[[str, tuple[dict, float]], None],
    log: Callable[[str], None],
) -> None:
    """Call every task's function, ``jobs`` at a time, passing (its name, (output, seconds)) to
    ``on_result`` in this process as each ends; a failure cancels what has not started."""
    if not todo:
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc=desc, disable=not progress, dynamic_ncols=True)
    if jobs == 1:
        for name, fn, args in todo:
            bar.set_postfix_str(name)
            log(f"[stage] {name} ...")
            on_result(name, _timed(fn, args))
            bar.update(1)
        bar.close()
        return
    threads = max(1, (os.cpu_count() or 1) // jobs)
    with ProcessPoolExecutor(
        max_workers=jobs, mp_context=get_context("spawn"), initializer=_init_worker, initargs=(threads, os.getpid())
    ) as ex:
        futures = {ex.submit(_timed, fn, args): name for name, fn, args in todo}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)  # record each as it ends
            for f in done:
                name = futures[f]
                if f.exception() is not None:
                    for p in pending:
                        p.cancel()
                    bar.close()
                    raise RuntimeError(f"stage {name} failed: {f.exception()!r}") from f.exception()
                on_result(name, f.result())
                bar.update(1)
    bar.close()
