"""Execute a notebook in a fresh Jupyter kernel: explicit environment and working folder, per-cell progress,
a one-line failure reason, and cancellation that stops the kernel.

The runner never changes its own process state for a kernel (no ``os.environ`` writes, no ``chdir``, which
would race between the threads of a parallel sweep): each kernel gets its environment and working folder as
arguments (:func:`kernel_env`). The kernel's own stdout/stderr (ipykernel's log lines such as the
"KeyboardInterrupt caught in kernel" that every shutdown triggers, or debugger warnings) go to a log file in the
run folder, not to the terminal.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import threading
from pathlib import Path
from typing import Any, Callable

__all__ = ["INLINE_BACKEND", "KERNEL_LOG", "Cancellation", "available_cores", "threads_per_run", "kernel_env",
           "execute_notebook", "failure_reason", "progress_text_fallbacks"]

# Kernels would inherit MPLBACKEND=Agg from a test shell, which drops every inline figure.
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
KERNEL_LOG = "kernel.log"
# Variables only the test suite sets for the kernels nbval starts (see taskloss.results.run).
_TEST_ONLY_VARS = ("TASKLOSS_CHECK_HEADLINES",)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_QUIET = logging.getLogger("taskloss.runner.kernel")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


class Cancellation:
    """A flag shared by the runs of a sweep: once set, queued runs do not start and running kernels are killed."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._managers: set = set()

    def is_set(self) -> bool:
        """Whether the sweep was cancelled."""
        return self._event.is_set()

    def register(self, km) -> None:
        """Track a running kernel's manager ``km`` (killed at once when the sweep is already cancelled)."""
        with self._lock:
            self._managers.add(km)
        if self.is_set():
            _kill(km)

    def unregister(self, km) -> None:
        """Stop tracking ``km`` (its kernel ended)."""
        with self._lock:
            self._managers.discard(km)

    def cancel(self) -> None:
        """Set the flag and kill every registered kernel (its whole process group)."""
        self._event.set()
        with self._lock:
            managers = list(self._managers)
        for km in managers:
            _kill(km)


def _kill(km) -> None:
    proc = getattr(getattr(km, "provisioner", None), "process", None)
    if proc is None or proc.poll() is not None:
        return
    try:  # the kernel leads its own session (jupyter_client starts it so): kill it and its children
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


class _Cancelled(Exception):
    pass


def available_cores() -> int:
    """The CPU cores this process may use (its affinity mask where the system has one, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):     # no load average on this system
        return 0.0


def threads_per_run(jobs: int, environ: dict | None = None, threads: int | None = None,
                    load: float | None = None) -> int:
    """BLAS/OpenMP threads each kernel gets: ``threads`` (``--threads``) when given; else the cores split between
    the ``jobs`` runs, ``max(1, cores // jobs)``, capped by an ``OMP_NUM_THREADS`` the caller set
    (``OMP_NUM_THREADS=1 … run NN``: one thread per run, as for a plain Python process; a value that is not a
    positive integer is ignored) and by the cores the machine has free, ``cores − load`` (``load``: the one-minute
    load average, read when ``None``). A busy laptop thus gets one thread per kernel: OpenMP threads that wait for
    a core spin, and notebook 12's smoke run, given both cores of a 2-core machine at load 8–16, took 3.7–10× the
    wall time and 5–9× the CPU time of a one-thread run."""
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        return threads
    environ = os.environ if environ is None else environ
    cores = available_cores()
    split = max(1, cores // jobs)
    free = max(1, int(cores - (_load() if load is None else load)))
    given = str(environ.get("OMP_NUM_THREADS", "")).strip()
    split = min(split, free)
    return min(split, int(given)) if given.isdigit() and int(given) > 0 else split


def kernel_env(threads: int | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a kernel: this process's, with the inline matplotlib backend, ``threads`` BLAS/OpenMP
    threads when given, without the test suite's variables, plus ``extra``. ``os.environ`` is only read."""
    env = {k: v for k, v in os.environ.items() if k not in _TEST_ONLY_VARS}
    env["MPLBACKEND"] = INLINE_BACKEND
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger warns about frozen modules
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env.update(extra or {})
    return env


def failure_reason(nb, cell_index: int | None, exc: BaseException, timeout: float | None = None) -> tuple[str, str]:
    """``(reason, traceback)`` of a failed execution: the reason names the failing cell (execution count and
    first source line) and the exception's last line, e.g. ``In [5] "assert ok": AssertionError: asked to
    fail``."""
    where = ""
    if cell_index is not None and 0 <= cell_index < len(nb.cells):
        cell = nb.cells[cell_index]
        first = next((ln.strip() for ln in cell.source.splitlines() if ln.strip()), "")
        first = first if len(first) <= 60 else first[:57] + "…"
        where = f"In [{cell.get('execution_count') or '?'}] (cell {cell_index}: {first!r}): "
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    if type(exc).__name__ == "CellTimeoutError":     # nbclient's text ends in a row of dashes
        limit = f"{timeout:g} s" if timeout else "its time limit"
        return where + f"CellTimeoutError: the cell ran longer than {limit} (--timeout); raise the limit or " \
                       "make the cell cheaper", _ANSI.sub("", str(exc))[-4000:]
    if ename:
        last = f"{ename}: {evalue}" if evalue else ename
    else:
        lines = [ln for ln in _ANSI.sub("", str(exc)).strip().splitlines() if ln.strip()]
        last = f"{type(exc).__name__}: {lines[-1].strip() if lines else ''}".rstrip(": ")
    last = " ".join(last.split())
    return where + last[:300], _ANSI.sub("", str(exc))[-4000:]


def execute_notebook(nb, *, cwd: str | Path, env: dict[str, str], timeout: float | None = None,
                     log_path: str | Path | None = None, on_cell: Callable[[int, int], None] | None = None,
                     cancel: Cancellation | None = None) -> dict[str, Any]:
    """Execute ``nb`` in place in a new ``python3`` kernel started in ``cwd`` with environment ``env``.

    Args:
        nb: an nbformat notebook; its cells receive the outputs (also when a cell fails).
        cwd: the kernel's working folder.
        env: the kernel's complete environment (see :func:`kernel_env`).
        timeout: seconds per cell (``None``: no limit).
        log_path: file for the kernel's own stdout/stderr (``None``: discarded).
        on_cell: called as ``on_cell(done, total)`` after each code cell.
        cancel: a :class:`Cancellation`; when set, the kernel is killed and the run ends ``cancelled``.

    Returns:
        ``{"status": "ok" | "failed" | "cancelled", "cpu_seconds": s, "error": reason, "traceback": text}``
        (the last two only when the run did not succeed; ``cpu_seconds``, the kernel process's user + system
        CPU time after its last cell, when it could be read). Notebook errors never raise.
    """
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    total = sum(c.cell_type == "code" for c in nb.cells)
    state = {"index": None, "done": 0}

    def on_cell_start(cell, cell_index):
        state["index"] = cell_index
        if cancel is not None and cancel.is_set():
            raise _Cancelled()

    def on_cell_complete(cell, cell_index):
        state["done"] += 1
        cpu = _kernel_cpu_seconds(km)
        if cpu is not None:
            state["cpu"] = cpu
        if on_cell is not None:
            on_cell(state["done"], total)

    km = AsyncKernelManager(kernel_name="python3")  # nbclient polls an async client (a blocking one hangs)
    client = NotebookClient(nb, km=km, timeout=timeout, kernel_name="python3", log=_QUIET,
                            on_cell_start=on_cell_start, on_cell_complete=on_cell_complete,
                            shutdown_kernel="immediate", resources={"metadata": {"path": str(cwd)}})
    if cancel is not None:
        cancel.register(km)
    log = open(log_path, "ab") if log_path else open(os.devnull, "wb")
    try:
        client.execute(cleanup_kc=True, env=env, cwd=str(cwd), stdout=log, stderr=log)
        return {"status": "ok", **({"cpu_seconds": round(state["cpu"], 2)} if "cpu" in state else {})}
    except BaseException as exc:  # noqa: BLE001 - a failing notebook is reported, not raised
        if isinstance(exc, KeyboardInterrupt):
            raise
        if cancel is not None and cancel.is_set():
            return {"status": "cancelled", "error": "cancelled (Ctrl-C)"}
        reason, tb = failure_reason(nb, state["index"], exc, timeout)
        return {"status": "failed", "error": reason, "traceback": tb}
    finally:
        log.close()
        if cancel is not None:
            cancel.unregister(km)


def _kernel_cpu_seconds(km) -> float | None:
    """User + system CPU seconds of the kernel process so far (``None`` when it cannot be read)."""
    proc = getattr(getattr(km, "provisioner", None), "process", None)
    try:
        import psutil

        t = psutil.Process(proc.pid).cpu_times()
        return float(t.user + t.system)
    except Exception:  # noqa: BLE001 - no psutil, no process, or it ended: the time is simply not recorded
        return None


def progress_text_fallbacks(nb) -> int:
    """Rewrite the ``text/plain`` of each tqdm widget output to the bar's final state, read from the widget
    state nbclient saved in the notebook metadata; returns the number of outputs rewritten.

    A notebook viewer without widgets (a repository browser) shows ``text/plain``, which tqdm set when the bar
    was created: ``0%| | 0/11``. The final state reads ``α sweep: 100%|██████████| 11/11 [00:01<00:00, …]``.
    """
    import html

    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    changed = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            box = state.get(view.get("model_id", "")) if view else None
            if not box or box.get("model_name") != "HBoxModel":
                continue
            parts = [state.get(str(c).replace("IPY_MODEL_", ""), {}) for c in box["state"].get("children", [])]
            if [p.get("model_name") for p in parts] != ["HTMLModel", "FloatProgressModel", "HTMLModel"]:
                continue
            left, bar, right = (p.get("state", {}) for p in parts)
            frac = (bar.get("value") or 0) / bar["max"] if bar.get("max") else 0.0
            filled = max(0, min(10, int(frac * 10)))
            text = f"{left.get('value', '')}|{'█' * filled}{' ' * (10 - filled)}|{right.get('value', '')}"
            out["data"]["text/plain"] = html.unescape(text).replace("\u2007", " ")
            changed += 1
    return changed
