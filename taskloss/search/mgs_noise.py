"""The candidates of one MGS step: the proposal built from the surrogate gradient, each candidate's update Δθ_k
drawn from its own seed, and the float64 statistics of its noise that the proposal density needs.

Used by :class:`taskloss.search.mgs.MGS` (derived in notebook 02_importance_sampling_and_mgs). With the flat
surrogate gradient g ``[P]`` and per-tensor scales σ_t, candidate k draws z_k ~ N(0, I) from its seed and is,
per tensor t,

    Δθ_{k,t} = σ_t z_{k,t}   (zero-centred component),     Δθ_{k,t} = σ_t z_{k,t} − g_t   (MLE-centred component)

(candidate 0 is −g exactly with ``include_mle``). Its log-density needs only ‖s_{k,t}‖² and ⟨s_{k,t}, g_t⟩ of
the scaled noise s = σ_t z (the float32 numbers Δθ_k is made of), accumulated in float64, so log q is the same (up
to float64 rounding) whether Δθ_k is stored (:meth:`CandidateDraws.draw_all`) or regenerated
(:meth:`CandidateDraws.draw`), and bit-identical on every rank. Per step this costs K draws of P normal numbers
plus, per cache-sized block, a float64 copy, one or two ``addmv`` per tensor and the −g shift (on a CPU the
row-by-row draw itself scales by σ_t). On a CPU the draw is a sizeable part of a step (``benchmarks/bench_mgs.py``
counts it in the floor). One generator's stream is sequential, but the candidates' streams are independent: with
P ≥ ``CandidateDraws.THREAD_MIN`` the rows are drawn by ``torch.get_num_threads()`` worker threads (each running
torch single-threaded), each row from its own seed, so the numbers do not depend on the number of threads or on
which thread draws a row. The buffers a step needs, and the views into them, are kept in a :class:`DrawPlan`
across steps.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from taskloss.search.mgs_density import log_q_floats, log_q_from_sq

__all__ = ["NORMAL_FILL", "StepProposal", "build_proposal", "DrawPlan", "CandidateDraws"]

#: numbers torch's CPU normal generator fills at a time: ``randn`` calls cut or merged at multiples of it draw the
#: same stream, and ``normal_(0, σ)`` on a piece of at least this many numbers gives ``σ·randn`` bit for bit
NORMAL_FILL = 16


def _pool(workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``workers`` threads for drawing candidates in parallel (torch's random and
    elementwise kernels release the GIL); a forked child gets its own (the parent's threads do not exist there).
    Each worker runs torch (OpenMP and MKL) with one thread: the calls of a worker are cache-sized, and MKL would
    otherwise start a team of threads for each small float64 ``addmv`` (``benchmarks/RESULTS.md``)."""
    return _pool_of(workers, os.getpid())


@lru_cache(maxsize=None)
def _pool_of(workers: int, pid: int) -> ThreadPoolExecutor:
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mgs-noise")
    main_threads, ready = torch.get_num_threads(), threading.Barrier(workers)

    def single_threaded():      # per thread: OpenMP's and MKL's thread counts are thread-local settings
        torch.set_num_threads(1)
        ready.wait()            # keeps this thread busy until every worker has started

    for f in [pool.submit(single_threaded) for _ in range(workers)]:
        f.result()
    torch.set_num_threads(main_threads)     # restore torch's process-wide default (new threads start from it)
    return pool


@dataclass
class StepProposal:
    """q = λ·N(0, σ_t²I) + (1−λ)·N(−g, σ_t²I) of one step. ``g``: flat ``[P]`` in the parameters' dtype and
    device; ``g64``: its float64 copy; ``sigma``, ``gg``, ``numel``: CPU float64 ``[T]`` (σ_t,
    ‖g_t‖², number of entries); ``numels``: entries per tensor."""

    g: Tensor
    g64: Tensor
    sigma: Tensor
    gg: Tensor
    numel: Tensor
    numels: list[int]


def build_proposal(g: Tensor, numels: list[int], sigma: float, sigma_mode: str, g64: Tensor | None = None,
                   plan: "DrawPlan | None" = None) -> StepProposal:
    """The step's proposal from the flat (clipped) surrogate gradient ``g``: σ_t = σ (``"absolute"``) or
    σ·mean|g_t| (``"relative"``), per-tensor sums in float64. ``g64``: ``g`` already copied to float64 (a
    buffer the caller reuses), else a new copy. ``plan``: the :class:`DrawPlan` that keeps ``g64`` (its
    per-tensor views and the ``numel`` tensor are then built once per layout)."""
    g64 = g.double() if g64 is None else g64
    if plan is None:
        parts, numel = g64.split(numels), torch.tensor(numels, dtype=torch.float64)
    else:
        parts, numel = plan.views("g64", g64), plan.cached("numel", (), lambda: torch.tensor(numels,
                                                                                             dtype=torch.float64))
    cpu = g64.device.type == "cpu"
    gg = torch.stack([torch.dot(x, x) for x in parts])
    gg = gg if cpu else gg.cpu()
    if sigma_mode == "relative":
        l1 = torch.stack([torch.linalg.vector_norm(x, ord=1) for x in parts])
        sig = sigma * (l1 if cpu else l1.cpu()) / numel
    else:
        sig = torch.full((len(numels),), float(sigma), dtype=torch.float64)
    return StepProposal(g, g64, sig, gg, numel, list(numels))


class DrawPlan:
    """What the steps share for one parameter layout (``numels``) on one device: the ``randn`` runs, the chunk
    layouts, one generator per row, and buffers — per-thread scratch, and for :class:`taskloss.search.mgs.MGS` the
    gradient, its float64 copy, θ, the ``[K', P]`` candidate rows and the update — and the per-tensor views into
    them (:meth:`cached`, :meth:`views`). MGS keeps one across steps: allocating those buffers anew costs page
    faults at every step, and building the layouts and views costs more Python time than a small model's draws
    (``benchmarks/RESULTS.md``, "Tuning history moved from the docstrings")."""

    def __init__(self, numels: list[int], device: torch.device):
        self.numels, self.device = list(numels), torch.device(device)
        cpu = self.device.type == "cpu"
        self.segs, self.runs, start = [], [], 0      # (t, start, stop) per tensor; randn runs
        for t, nt in enumerate(self.numels):
            self.segs.append((t, start, start + nt))
            a, b = self.runs[-1] if self.runs else (0, 0)
            if cpu and self.runs and (b - a) >= NORMAL_FILL and (b - a) % NORMAL_FILL == 0 and nt >= NORMAL_FILL:
                self.runs[-1] = (a, start + nt)
            elif nt > 0:
                self.runs.append((start, start + nt))
            start += nt
        self.layouts: dict[tuple[int, int], list] = {}
        self.gens: list[torch.Generator] = []
        self.scratch: dict[tuple, Tensor] = {}
        self.memo: dict = {}

    @classmethod
    def reuse(cls, plan: "DrawPlan | None", numels: list[int], device: torch.device) -> "DrawPlan":
        """``plan`` if it fits ``numels`` on ``device``, else a new plan (the parameters moved)."""
        if plan is None or plan.device != device or plan.numels != list(numels):
            plan = cls(numels, device)
        return plan

    def generators(self, m: int) -> list[torch.Generator]:
        """``m`` generators on the plan's device, created once and kept."""
        while len(self.gens) < m:
            self.gens.append(torch.Generator(device=self.device))
        return self.gens[:m]

    def buffer(self, key, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """A scratch tensor kept across steps (one per ``key``: a fresh allocation of a large buffer costs page
        faults at every step)."""
        buf = self.scratch.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = self.scratch[key] = torch.empty(shape, dtype=dtype, device=self.device)
        return buf

    def cached(self, key, deps: tuple, build):
        """``build()``, computed once per ``key`` while the objects ``deps`` stay the same (``is``): views of the
        kept buffers and other per-layout structures that would otherwise cost Python and kernel-dispatch time at
        every step (a small model's step is made of such calls)."""
        hit = self.memo.get(key)
        if hit is None or len(hit[0]) != len(deps) or any(a is not b for a, b in zip(hit[0], deps)):
            hit = self.memo[key] = (deps, build())
        return hit[1]

    def keeps(self, t: Tensor) -> bool:
        """Whether ``t`` is one of the buffers this plan keeps (views into others are not cached: the cache would
        keep a caller's temporary alive)."""
        return any(t is b for b in self.scratch.values())

    def views(self, key, flat: Tensor, shapes: list | None = None) -> list[Tensor]:
        """Per-tensor views of the flat ``[P]`` tensor ``flat`` (shaped ``shapes`` if given, else flat), cached
        under ``key`` while ``flat`` is the same tensor."""
        return self.cached(("views", key, shapes is None), (flat,), lambda: list(flat.split(self.numels)) if
                           shapes is None else [v.view(sh) for v, sh in zip(flat.split(self.numels), shapes)])

    def layout(self, width: int) -> list[tuple[int, int, list, list, list]]:
        """Chunks ``(start, stop, pieces, split, portions)`` of the flat vector, at most ``width`` entries each:
        ``pieces`` ``(a, b)`` are the ``randn`` calls (runs cut at multiples of ``NORMAL_FILL`` from their start:
        the cuts leave the stream unchanged, see :class:`CandidateDraws`), ``split`` ``(a, b, t)`` the same pieces
        cut again at tensor boundaries (inside a run these are multiples of ``NORMAL_FILL`` from its start too) so
        that each lies in one tensor t, ``portions`` ``(t, a, b)`` the part of each tensor in the chunk. A GPU gets
        one chunk per run (``width`` is ignored there)."""
        if width in self.layouts:
            return self.layouts[width]
        cpu = self.device.type == "cpu"
        width = max(NORMAL_FILL, width // NORMAL_FILL * NORMAL_FILL) if cpu else 0
        pieces = []
        for a, b in self.runs:
            if not cpu:
                pieces.append((a, b))
                continue
            cuts = list(range(a, b, width)) + [b]
            if len(cuts) > 2 and cuts[-1] - cuts[-2] < NORMAL_FILL:     # no piece under NORMAL_FILL numbers: merge
                del cuts[-2]
            pieces += list(zip(cuts[:-1], cuts[1:]))
        chunks, cur = [], []
        for a, b in pieces:
            if cur and (b - cur[0][0] > width):
                chunks.append(cur)
                cur = []
            cur.append((a, b))
        if cur:
            chunks.append(cur)
        out = []
        for ch in chunks:
            c, e = ch[0][0], ch[-1][1]
            portions = [(t, max(a, c), min(b, e)) for t, a, b in self.segs if a < e and b > c]
            split = [(max(a, ta), min(b, tb), t) for a, b in ch for t, ta, tb in self.segs if ta < b and tb > a]
            out.append((c, e, ch, split, portions))
        self.layouts[width] = out
        return out


class CandidateDraws:
    """Δθ_k of the candidates k = 0..n−1 of one step, from their seeds; ``mle[k]`` says whether candidate k comes
    from the MLE-centred component. :meth:`draw_all` writes every Δθ_k into the rows of one ``[n, P]`` buffer (the
    default path), :meth:`draw` one of them (``low_memory``, regenerated on demand); both fill the float64
    statistics of the scaled noise s_{k,t} = σ_t z_{k,t} (the float32 numbers Δθ_k is made of):
    ``ss[k, t] = ‖s_{k,t}‖²`` and ``sg[k, t] = ⟨s_{k,t}, g_t⟩``, which :meth:`log_q` turns into log q(Δθ_k).

    Candidate k's noise z_k comes from its own generator, seeded with ``seeds[k]``, as a sequence of ``randn`` calls
    whose concatenation is the same stream as one call per parameter tensor: on a CPU consecutive tensors are merged
    into one call while the sizes before the last are multiples of ``NORMAL_FILL``, and a long call is split at
    multiples of it (torch's CPU generator fills ``NORMAL_FILL`` = 16 numbers at a time, so such cuts and merges
    leave the numbers unchanged); on a GPU one call per tensor. On a CPU with P ≥ ``ROW_BLOCK`` each row is
    processed in blocks of at most ``ROW_BLOCK`` entries — drawn already scaled (``normal_(0, σ_t)`` gives σ_t·z bit
    for bit for pieces of ``NORMAL_FILL`` or more numbers), reduced to its float64 statistics by one ``addmv`` per
    tensor and shifted by −g while in cache — the rows spread over worker threads; otherwise (small P, or a GPU) all
    rows together, in column chunks of at most ``CPU_BLOCK`` float64 numbers (a whole GPU tensor per chunk) — fewer
    kernel calls when the work per call is small. Both paths draw the same numbers bit for bit
    (``tests/search/test_mgs.py``).
    ``plan``: the :class:`DrawPlan` of this layout and device, reused across steps (a new one by default)."""

    CPU_BLOCK = 1 << 16      # float64 numbers per chunk over all rows (batched path)
    ROW_BLOCK = (1 << 15) - NORMAL_FILL   # entries per block of one row (CPU path); a block (< ROW_BLOCK + NORMAL_FILL
                                         # entries) stays under torch's intra-op grain size, 2¹⁵
    KEEP_CHUNK64: bool | None = None   # keep the batched path's float64 chunk in the plan (None: on a CPU only;
                                       # on a GPU a whole tensor's float64 copy is taken per chunk and let go)
    THREAD_MIN = 1 << 18     # rows of fewer entries are drawn in the calling thread (measurements that chose it:
                             # benchmarks/RESULTS.md, "Tuning history moved from the docstrings")

    def __init__(self, proposal: StepProposal, seeds: list[int], mle: list[bool], include_mle: bool,
                 plan: DrawPlan | None = None):
        self.p, self.seeds, self.mle, self.include_mle = proposal, seeds, mle, include_mle
        n, T, dev = len(seeds), len(proposal.numels), proposal.g.device
        self.device, self.n = dev, n
        self.plan = DrawPlan(proposal.numels, dev) if plan is None else plan
        self.stats = torch.zeros(n, T, 2, dtype=torch.float64, device=dev)    # (⟨s_{k,t}, g_t⟩, ‖s_{k,t}‖²)
        self.sig = proposal.sigma.tolist()

    @property
    def ss(self) -> Tensor:
        """‖s_{k,t}‖², float64 ``[n, T]``."""
        return self.stats[..., 1]

    @property
    def sg(self) -> Tensor:
        """⟨s_{k,t}, g_t⟩, float64 ``[n, T]``."""
        return self.stats[..., 0]

    def _fill(self, Z: Tensor, ks: list[int], keep: bool = False) -> Tensor:
        """Rows ``Z[j]`` ← Δθ of candidates ``ks[j]`` (noise from their seeds, scaled by σ_t, −g for MLE-centred
        ones; exactly −g for candidate 0 with ``include_mle``), recording their float64 statistics. On a CPU with
        P ≥ ``ROW_BLOCK``: row by row (:meth:`_fill_rows`), the rows spread over ``torch.get_num_threads()`` worker
        threads; otherwise all rows together (:meth:`_fill_batched`). Both draw the same numbers."""
        if self.device.type != "cpu" or Z.shape[1] < self.ROW_BLOCK:    # small P: fewer calls all rows at once
            return self._fill_batched(Z, ks, keep)
        layout = self.plan.layout(self.ROW_BLOCK)
        workers = min(len(ks), torch.get_num_threads()) if Z.shape[1] >= self.THREAD_MIN else 1
        gens = self.plan.generators(len(ks))
        views = self._row_views(Z, workers, layout, keep)
        jobs = [[(ks[j], gens[j]) for j in range(len(ks))[w::workers]] for w in range(workers)]
        if workers <= 1:
            parts = [self._fill_rows(jobs[0], *views[0])]
        else:       # worker w draws rows w, w + workers, …: the same numbers whichever thread draws a row
            parts = list(_pool(workers).map(lambda w: self._fill_rows(jobs[w], *views[w]), range(workers)))
        idx = torch.tensor(ks)
        for w, part in enumerate(parts):
            self.stats[idx[w::workers]] = part
        return Z

    def _row_views(self, Z: Tensor, workers: int, layout, keep: bool) -> list:
        """Per worker w (rows w, w + workers, … of ``Z`` ``[m, P]``): its float64 accumulator ``[rows, T, 2]`` and
        per block (g64's block in row 0 of a ``[2, block]`` float64 buffer, the block of g64, row 1 of that buffer
        for s, the block of g, and per row: its block, its ``randn`` pieces ``(view, t, fused)``, its per-tensor
        portions ``(accumulator entry, [g; s] columns, s columns)``). With ``keep`` (``Z`` a kept buffer) built
        once while ``Z``, g and g64 are the same tensors: the row path makes a few hundred calls per step on a
        100K-parameter model, and taking each slice anew doubled them."""
        m, g64, g, T = Z.shape[0], self.p.g64, self.p.g, len(self.sig)

        def build():
            fused = Z.dtype in (torch.float32, torch.float64)
            width = max(chunk[1] - chunk[0] for chunk in layout)
            out = []
            for w in range(workers):
                js = range(m)[w::workers]
                acc = torch.zeros(len(js), T, 2, dtype=torch.float64)
                M = torch.empty(2, width, dtype=torch.float64)
                blocks = []
                for c, e, _, pieces, portions in layout:
                    sm = M[1, :e - c]
                    rows = [(Z[j, c:e], [(Z[j, a:b], t, fused and b - a >= NORMAL_FILL) for a, b, t in pieces],
                             [(acc[i, t], M[:, a - c:b - c], sm[a - c:b - c]) for t, a, b in portions])
                            for i, j in enumerate(js)]
                    blocks.append((M[0, :e - c], g64[c:e], sm, g[c:e], rows))
                out.append((acc, blocks))
            return out

        return self.plan.cached(("rows", m, workers), (Z, g, g64), build) if keep else build()

    def _fill_rows(self, jobs, acc: Tensor, blocks) -> Tensor:
        """Rows ← Δθ_k on a CPU for ``jobs`` = [(k, generator)] through the views of :meth:`_row_views`, one block
        of at most ``ROW_BLOCK`` entries at a time, block by block and within a block row by row (so the block of
        g stays in cache): each row's block drawn from its generator already scaled by σ_t, its float64
        statistics accumulated by one ``addmv`` of [g; s] by s per tensor, −g subtracted while in cache. Returns
        (⟨s_{k,t}, g_t⟩, ‖s_{k,t}‖²) as a float64 ``[len(jobs), T, 2]`` (``acc``, overwritten at the next call).
        Blocks stay under torch's intra-op grain size, so a worker thread never opens a parallel region
        (elementwise kernels of that size run in the calling thread)."""
        acc.zero_()
        noise = [not (self.include_mle and k == 0) for k, _ in jobs]
        for (k, gen), nz in zip(jobs, noise):
            if nz:
                gen.manual_seed(self.seeds[k])
        sig, mle = self.sig, [self.mle[k] for k, _ in jobs]
        for g64_row, g64_blk, sm, g_blk, rows in blocks:
            g64_row.copy_(g64_blk)
            for (blk, pieces, portions), (_, gen), nz, shift in zip(rows, jobs, noise, mle):
                if not nz:
                    blk.zero_()
                else:
                    for v, t, fused in pieces:      # σ_t·z drawn directly (bit for bit for ≥ NORMAL_FILL numbers)
                        if fused:
                            v.normal_(0.0, sig[t], generator=gen)
                        else:
                            torch.randn(v.numel(), generator=gen, dtype=v.dtype, out=v).mul_(sig[t])
                    sm.copy_(blk)
                    for a, gs, s in portions:       # (⟨s_t, g_t⟩, ‖s_t‖²) += [g; s] · s over this portion
                        a.addmv_(gs, s)
                if shift:
                    blk.sub_(g_blk)
        return acc

    def _fill_batched(self, Z: Tensor, ks: list[int], keep: bool = False) -> Tensor:
        """:meth:`_fill` for all rows together, a few kernel calls per tensor for every candidate (the GPU path;
        it also runs on a CPU, where it draws the same numbers as :meth:`_fill_rows`). Per column chunk: each
        row's ``randn`` pieces, one ``mul_`` by σ_t per tensor portion, one float64 copy of the chunk, then per
        portion one ``addmv_`` for ⟨s_t, g_t⟩ and (after one ``square_``) one for ‖s_t‖² (a product with ones),
        and one ``addr_`` for the −g shift of the MLE-centred rows. The views these calls take are built once
        per buffer (:meth:`_batched_views`)."""
        m, dev = Z.shape[0], self.device
        gens = [None if self.include_mle and k == 0 else gen.manual_seed(self.seeds[k])
                for gen, k in zip(self.plan.generators(m), ks)]
        M = torch.tensor([float(self.mle[k]) for k in ks], dtype=Z.dtype, device=dev) if any(
            self.mle[k] for k in ks) else None
        acc, chunks = self._batched_views(Z, keep)
        acc.zero_()
        sig = self.sig
        for zc, rows, pieces, scale, stats, s64, gc, width in chunks:
            for j, gen in enumerate(gens):
                if gen is None:
                    rows[j].zero_()
                    continue
                for v in pieces[j]:
                    v.normal_(generator=gen)
            for t, v in scale:
                v.mul_(sig[t])
            if s64 is None:          # a GPU: one temporary per chunk (a whole tensor), not kept
                s64 = zc.to(torch.float64)
                stats = [(sg, ss, s64[:, a:b], g64, ones) for sg, ss, (a, b), g64, ones in stats]
            else:
                s64.copy_(zc)
            for sg, _, s, g64, _ in stats:
                sg.addmv_(s, g64)
            s64.square_()
            for _, ss, s, _, ones in stats:
                ss.addmv_(s, ones)
            if M is not None:
                zc.addr_(M, gc, alpha=-1)
        if len(ks) == self.n and ks == list(range(self.n)):
            self.stats.copy_(acc)
        else:
            self.stats[torch.tensor(ks, device=dev)] = acc
        return Z

    def _batched_views(self, Z: Tensor, keep: bool):
        """The views :meth:`_fill_batched` writes through, for the row buffer ``Z`` ``[m, P]``: a float64
        accumulator ``[m, T, 2]`` and per chunk (chunk of Z, its rows, each row's ``randn`` pieces, the σ_t
        portions, per portion (⟨s,g⟩ column, ‖s‖² column, float64 chunk columns, g64 portion, ones), the float64
        chunk, the chunk of g). With ``keep``, kept in the plan while ``Z``, g and g64 are the same tensors (on a
        CPU the float64 chunk is then a kept buffer; on a GPU it is a temporary, its columns taken at each step)."""
        m, dev, g64, g = Z.shape[0], self.device, self.p.g64, self.p.g
        cpu = dev.type == "cpu" if self.KEEP_CHUNK64 is None else bool(self.KEEP_CHUNK64)

        def build():
            layout = self.plan.layout(self.CPU_BLOCK // m)
            cols = max(chunk[1] - chunk[0] for chunk in layout)
            acc = torch.zeros(m, len(self.sig), 2, dtype=torch.float64, device=dev)
            buf = torch.empty(m * cols, dtype=torch.float64, device=dev) if cpu else None
            ones = torch.ones(cols, dtype=torch.float64, device=dev)
            chunks = []
            for c, e, pieces, _, portions in layout:
                s64 = buf[:m * (e - c)].view(m, e - c) if cpu else None
                stats = [(acc[:, t, 0], acc[:, t, 1], s64[:, a - c:b - c] if cpu else (a - c, b - c), g64[a:b],
                          ones[:b - a]) for t, a, b in portions]
                chunks.append((Z[:, c:e], [Z[j, c:e] for j in range(m)],
                               [[Z[j, a:b] for a, b in pieces] for j in range(m)],
                               [(t, Z[:, a:b]) for t, a, b in portions], stats, s64, g[c:e], e - c))
            return acc, chunks

        return self.plan.cached(("batched", m, cpu), (Z, g, g64), build) if keep else build()

    def draw_all(self, Z: Tensor) -> Tensor:
        """Write Δθ_k of every candidate into row k of ``Z`` ``[n, P]`` (the parameters' dtype and device), record
        the statistics, return ``Z``."""
        return self._fill(Z, list(range(self.n)), self.plan.keeps(Z))

    def draw(self, k: int, out: Tensor) -> Tensor:
        """Write Δθ_k into ``out`` (flat ``[P]``) and record row k of the statistics: the same numbers per element
        as :meth:`draw_all` (the float64 sums may differ in the last bits: other reduction shapes)."""
        if self.plan.keeps(out):     # one object per kept buffer, so that the views into it stay cached
            self._fill(self.plan.cached("draw row", (out,), lambda: out[None]), [k], True)
        else:
            self._fill(out[None], [k])
        return out

    def log_q(self, mix: float, density: str) -> Tensor:
        """Log q(Δθ_k) for every candidate, CPU float64 ``[n]``, from the recorded statistics of s = σ_t z:
        ‖Δθ_t‖² = ‖s_t‖² (zero component) or ‖g_t‖² − 2⟨s_t, g_t⟩ + ‖s_t‖² (MLE component), and ‖Δθ_t + g_t‖²
        symmetrically; candidate 0 with ``include_mle`` is −g (‖Δθ‖² = ‖g‖², ‖Δθ + g‖² = 0). The n × T numbers
        are combined on Python floats (one transfer; a tensor path only for tensors with σ_t = 0)."""
        stats, gg = self.stats.tolist(), self.p.gg.tolist()
        d0, d1 = [], []
        for k, (row, mle) in enumerate(zip(stats, self.mle)):
            if self.include_mle and k == 0:
                d0.append(gg)
                d1.append([0.0] * len(gg))
            elif mle:
                d0.append([g - 2 * sg + ss for (sg, ss), g in zip(row, gg)])
                d1.append([ss for _, ss in row])
            else:
                d0.append([ss for _, ss in row])
                d1.append([ss + 2 * sg + g for (sg, ss), g in zip(row, gg)])
        out = log_q_floats(d0, d1, self.sig, self.p.numel.tolist(), mix, density)
        if out is not None:
            return torch.tensor(out, dtype=torch.float64)
        return log_q_from_sq(torch.tensor(d0, dtype=torch.float64), torch.tensor(d1, dtype=torch.float64),
                              self.p.sigma, self.p.numel, mix, density)
