"""The candidates of one MGS step: the proposal built from the surrogate gradient, each candidate's update Δθ_k
drawn from its own seed, and the float64 statistics of its noise that the proposal density needs.

Used by :class:`taskloss.search.mgs.MGS` (derived in notebook 02_importance_sampling_and_mgs). With the flat
surrogate gradient g ``[P]`` and per-tensor scales σ_t, candidate k draws z_k ~ N(0, I) from its seed and is,
per tensor t,

    Δθ_{k,t} = σ_t z_{k,t}   (zero-centred component),     Δθ_{k,t} = σ_t z_{k,t} − g_t   (MLE-centred component)

(candidate 0 is −g exactly with ``include_mle``). Its log-density needs only ‖z_{k,t}‖² and ⟨z_{k,t}, g_t⟩,
accumulated in float64 from the float32 noise, so log q is the same (up to float64 rounding) whether Δθ_k is
stored (:meth:`CandidateDraws.draw_all`) or regenerated (:meth:`CandidateDraws.draw`), and bit-identical on every
rank. Per step this costs K ``randn`` of P numbers plus a float64 copy, two dot products and the scaling of each
block of the noise while it is in cache. On a CPU the ``randn`` is a sizeable part of a step (torch's generator
draws ~3·10⁸ normals per second on one core: about a tenth of an MGS step's floor for the 1M-parameter MLP of
``benchmarks/bench_mgs.py``, which counts it in the floor). One generator's stream is sequential, but the
candidates' streams are independent: with P ≥ ``CandidateDraws.ROW_BLOCK`` the rows are drawn by
``torch.get_num_threads()`` worker threads, each row from its own seed, so the numbers do not depend on the
number of threads or on which thread draws a row.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from taskloss.search.mgs_density import _log_q_from_sq

__all__: list[str] = []


def _pool(workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``workers`` threads for drawing candidates in parallel (torch's random and
    elementwise kernels release the GIL); a forked child gets its own (the parent's threads do not exist there)."""
    return _pool_of(workers, os.getpid())


@lru_cache(maxsize=None)
def _pool_of(workers: int, pid: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mgs-noise")


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


def build_proposal(g: Tensor, numels: list[int], sigma: float, sigma_mode: str) -> StepProposal:
    """The step's proposal from the flat (clipped) surrogate gradient ``g``: σ_t = σ (``"absolute"``) or
    σ·mean|g_t| (``"relative"``), per-tensor sums in float64."""
    g64 = g.double()
    parts = g64.split(numels)
    gg = torch.stack([torch.dot(x, x) for x in parts]).cpu()
    numel = torch.tensor(numels, dtype=torch.float64)
    if sigma_mode == "relative":
        sig = sigma * torch.stack([torch.linalg.vector_norm(x, ord=1) for x in parts]).cpu() / numel
    else:
        sig = torch.full((len(numels),), float(sigma), dtype=torch.float64)
    return StepProposal(g, g64, sig, gg, numel, list(numels))


class CandidateDraws:
    """Δθ_k of the candidates k = 0..n−1 of one step, from their seeds; ``mle[k]`` says whether candidate k comes
    from the MLE-centred component. :meth:`draw_all` writes every Δθ_k into the rows of one ``[n, P]`` buffer (the
    default path), :meth:`draw` one of them (``low_memory``, regenerated on demand); both fill the float64
    statistics ``zz[k, t] = ‖z_{k,t}‖²`` and ``zg[k, t] = ⟨z_{k,t}, g_t⟩`` that :meth:`log_q` turns into log q(Δθ_k).

    Candidate k's noise z_k comes from its own generator, seeded with ``seeds[k]``, as a sequence of ``randn``
    calls whose concatenation is the same stream as one call per parameter tensor: on a CPU consecutive tensors
    are merged into one call while the sizes before the last are multiples of 16, and a long call is split at
    multiples of 16 (torch's CPU generator fills 16 numbers at a time, so such cuts and merges leave the numbers
    unchanged); on a GPU one call per tensor. On a CPU with P ≥ ``ROW_BLOCK`` each row is processed in blocks of
    at most ``ROW_BLOCK`` entries (drawn, reduced to its float64 statistics and scaled to Δθ while in cache), the
    rows spread over worker threads; otherwise (small P, or a GPU) all rows together, in column chunks of at most
    ``CPU_BLOCK`` float64 numbers (a whole GPU tensor per chunk) — fewer kernel calls when the work per call is
    small. Both paths draw the same numbers bit for bit (``tests/search/test_mgs.py``)."""

    CPU_BLOCK = 1 << 16      # float64 numbers per chunk over all rows (batched path)
    ROW_BLOCK = (1 << 15) - 16   # entries per block of one row (CPU path); a block (≤ ROW_BLOCK + 15 entries)
                                 # stays under torch's intra-op grain size, 2¹⁵

    def __init__(self, proposal: StepProposal, seeds: list[int], mle: list[bool], include_mle: bool):
        self.p, self.seeds, self.mle, self.include_mle = proposal, seeds, mle, include_mle
        n, T, dev = len(seeds), len(proposal.numels), proposal.g.device
        self.device, self.n = dev, n
        self.zz = torch.zeros(n, T, dtype=torch.float64, device=dev)
        self.zg = torch.zeros(n, T, dtype=torch.float64, device=dev)
        self.sig = proposal.sigma.tolist()
        self._segs, self._runs, start = [], [], 0      # (t, start, stop) per tensor; randn runs
        for t, nt in enumerate(proposal.numels):
            self._segs.append((t, start, start + nt))
            a, b = self._runs[-1] if self._runs else (0, 0)
            if dev.type == "cpu" and self._runs and (b - a) >= 16 and (b - a) % 16 == 0 and nt >= 16:
                self._runs[-1] = (a, start + nt)
            elif nt > 0:
                self._runs.append((start, start + nt))
            start += nt
        self._layouts: dict[tuple[int, int], list] = {}
        self._gens: list[torch.Generator] = []

    def _layout(self, m: int, block: int | None = None) -> list[tuple[int, int, list, list]]:
        """Chunks (start, stop, randn pieces, per-tensor portions) of the flat vector for ``m`` rows processed
        together, at most ``block`` (default ``CPU_BLOCK // m``) entries per row and chunk."""
        block = block or self.CPU_BLOCK // m
        if (m, block) in self._layouts:
            return self._layouts[(m, block)]
        cpu = self.device.type == "cpu"
        width = max(16, block // 16 * 16) if cpu else 0
        pieces = []
        for a, b in self._runs:
            if not cpu:
                pieces.append((a, b))
                continue
            cuts = list(range(a, b, width)) + [b]
            if len(cuts) > 2 and cuts[-1] - cuts[-2] < 16:     # no piece under 16 numbers: merge the remainder
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
            portions = [(t, max(a, c), min(b, e)) for t, a, b in self._segs if a < e and b > c]
            out.append((c, e, ch, portions))
        self._layouts[(m, block)] = out
        return out

    def _fill(self, Z: Tensor, ks: list[int]) -> Tensor:
        """Rows ``Z[j]`` ← Δθ of candidates ``ks[j]`` (noise from their seeds, scaled by σ_t, −g for MLE-centred
        ones; exactly −g for candidate 0 with ``include_mle``), recording their float64 statistics. On a CPU with
        P ≥ ``ROW_BLOCK``: row by row (:meth:`_fill_rows`), the rows spread over ``torch.get_num_threads()`` worker
        threads; otherwise all rows together (:meth:`_fill_batched`). Both draw the same numbers."""
        if self.device.type != "cpu" or Z.shape[1] < self.ROW_BLOCK:    # small P: fewer calls all rows at once
            return self._fill_batched(Z, ks)
        layout = self._layout(1, self.ROW_BLOCK)
        workers = min(len(ks), torch.get_num_threads())
        while len(self._gens) < len(ks):
            self._gens.append(torch.Generator())
        jobs = [[(Z[j], k, self._gens[j]) for j, k in list(enumerate(ks))[w::workers]] for w in range(workers)]
        if workers <= 1:
            parts = [self._fill_rows(jobs[0], layout)]
        else:       # worker w draws rows w, w + workers, …: the same numbers whichever thread draws a row
            parts = list(_pool(workers).map(lambda job: self._fill_rows(job, layout), jobs))
        stats = [None] * len(ks)
        for w, part in enumerate(parts):
            stats[w::workers] = part
        idx = torch.tensor(ks)
        self.zz[idx] = torch.tensor([zz for zz, _ in stats], dtype=torch.float64).reshape(len(ks), -1)
        self.zg[idx] = torch.tensor([zg for _, zg in stats], dtype=torch.float64).reshape(len(ks), -1)
        return Z

    def _fill_rows(self, jobs, layout) -> list[tuple[list[float], list[float]]]:
        """Rows ← Δθ_k on a CPU for ``jobs`` = [(row, k, generator)], one block of at most ``ROW_BLOCK`` entries
        at a time, block by block and within a block row by row (so the block of g stays in cache): each row's
        block drawn from its generator, its float64 statistics taken, scaled to Δθ while in cache. Returns
        (‖z_{k,t}‖², ⟨z_{k,t}, g_t⟩) per tensor t for each job. Blocks stay under torch's intra-op grain size, so
        a worker thread never opens a parallel region (elementwise and BLAS-1 kernels of that size run in the
        calling thread)."""
        T = len(self.sig)
        stats = [([0.0] * T, [0.0] * T) for _ in jobs]
        noise = [not (self.include_mle and k == 0) for _, k, _ in jobs]
        for (_, k, gen), nz in zip(jobs, noise):
            if nz:
                gen.manual_seed(self.seeds[k])
        buf = torch.empty(max(e - c for c, e, _, _ in layout), dtype=torch.float64)
        g64, g = self.p.g64, self.p.g
        for c, e, pieces, portions in layout:
            for (row, k, gen), nz, (zz, zg) in zip(jobs, noise, stats):
                if not nz:
                    row[c:e].zero_()
                else:
                    for a, b in pieces:
                        torch.randn(b - a, generator=gen, dtype=row.dtype, out=row[a:b])
                    z64 = buf[:e - c].copy_(row[c:e])
                    for t, a, b in portions:
                        zp = z64[a - c:b - c]
                        zg[t] += float(torch.dot(zp, g64[a:b]))
                        zz[t] += float(torch.dot(zp, zp))
                for t, a, b in portions:
                    row[a:b].mul_(self.sig[t])
                if self.mle[k]:
                    row[c:e].sub_(g[c:e])
        return stats

    def _fill_batched(self, Z: Tensor, ks: list[int]) -> Tensor:
        """:meth:`_fill` for all rows together, a few kernel calls per tensor for every candidate (the GPU path;
        it also runs on a CPU, where it draws the same numbers as :meth:`_fill_rows`)."""
        m, dev = Z.shape[0], self.device
        while len(self._gens) < m:
            self._gens.append(torch.Generator(device=dev))
        gens = [None if self.include_mle and k == 0 else self._gens[j].manual_seed(self.seeds[k])
                for j, k in enumerate(ks)]
        M = torch.tensor([float(self.mle[k]) for k in ks], dtype=Z.dtype, device=dev) if any(
            self.mle[k] for k in ks) else None
        layout = self._layout(m)
        cols = max(e - c for c, e, _, _ in layout)
        buf = torch.empty(m * cols, dtype=torch.float64) if dev.type == "cpu" else None
        g64, g = self.p.g64, self.p.g
        zz: list[list[Tensor]] = [[] for _ in self.sig]
        zg: list[list[Tensor]] = [[] for _ in self.sig]
        for c, e, pieces, portions in layout:
            for j, gen in enumerate(gens):
                if gen is None:
                    Z[j, c:e].zero_()
                    continue
                for a, b in pieces:
                    torch.randn(b - a, generator=gen, device=dev, dtype=Z.dtype, out=Z[j, a:b])
            z64 = Z[:, c:e].to(torch.float64) if buf is None else buf[:m * (e - c)].view(m, e - c).copy_(Z[:, c:e])
            for t, a, b in portions:
                zg[t].append(z64[:, a - c:b - c] @ g64[a:b])
            z64.square_()
            for t, a, b in portions:
                zz[t].append(z64[:, a - c:b - c].sum(1))
                Z[:, a:b].mul_(self.sig[t])
            if M is not None:
                Z[:, c:e].addr_(M, g[c:e], alpha=-1)
        zero = torch.zeros(m, dtype=torch.float64, device=dev)
        cat = lambda x: zero if not x else x[0] if len(x) == 1 else torch.stack(x).sum(0)  # noqa: E731
        idx = torch.tensor(ks, device=dev)
        self.zz[idx] = torch.stack([cat(x) for x in zz], 1)
        self.zg[idx] = torch.stack([cat(x) for x in zg], 1)
        return Z

    def draw_all(self, Z: Tensor) -> Tensor:
        """Write Δθ_k of every candidate into row k of ``Z`` ``[n, P]`` (the parameters' dtype and device), record
        the statistics, return ``Z``."""
        return self._fill(Z, list(range(self.n)))

    def draw(self, k: int, out: Tensor) -> Tensor:
        """Write Δθ_k into ``out`` (flat ``[P]``) and record row k of the statistics: the same numbers per element
        as :meth:`draw_all` (the float64 sums may differ in the last bits: other reduction shapes)."""
        self._fill(out[None], [k])
        return out

    def log_q(self, mix: float, density: str) -> Tensor:
        """log q(Δθ_k) for every candidate, CPU float64 ``[n]``, from the recorded statistics:
        ‖Δθ_t‖² = σ_t²‖z_t‖² (zero component) or ‖g_t‖² − 2σ_t⟨z_t, g_t⟩ + σ_t²‖z_t‖² (MLE component), and
        ‖Δθ_t + g_t‖² symmetrically; candidate 0 with ``include_mle`` is −g (‖Δθ‖² = ‖g‖², ‖Δθ + g‖² = 0)."""
        zz, zg = self.zz.cpu(), self.zg.cpu()
        n = zz.shape[0]
        s, gg = self.p.sigma[None, :], self.p.gg.expand(n, -1)
        m = torch.tensor(self.mle, dtype=torch.bool)[:, None]
        d0 = torch.where(m, gg - 2 * s * zg + s * s * zz, s * s * zz)     # ‖Δθ_t‖²
        d1 = torch.where(m, s * s * zz, s * s * zz + 2 * s * zg + gg)     # ‖Δθ_t + g_t‖²
        if self.include_mle:
            d0[0], d1[0] = gg[0], torch.zeros_like(gg[0])
        return _log_q_from_sq(d0, d1, self.p.sigma, self.p.numel, mix, density)
