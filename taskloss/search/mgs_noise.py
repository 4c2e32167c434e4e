"""The candidates of one MGS step: the proposal built from the surrogate gradient, each candidate's update Δθ_k
drawn from its own seed, and the float64 statistics of its noise that the proposal density needs.

Used by :class:`taskloss.search.mgs.MGS` (derived in notebook 02_importance_sampling_and_mgs). With the flat
surrogate gradient g ``[P]`` and per-tensor scales σ_t, candidate k draws z_k ~ N(0, I) from its seed and is,
per tensor t,

    Δθ_{k,t} = σ_t z_{k,t}   (zero-centred component),     Δθ_{k,t} = σ_t z_{k,t} − g_t   (MLE-centred component)

(candidate 0 is −g exactly with ``include_mle``). Its log-density needs only ‖z_{k,t}‖² and ⟨z_{k,t}, g_t⟩,
accumulated in float64 from the float32 noise (:meth:`CandidateDraws.draw`), so log q is the same whether Δθ_k
is stored or regenerated, on every rank. Per candidate this costs one ``randn`` of P numbers plus a few passes
over P, block by block while the block is in cache (no allocation beyond the output row). On a CPU the ``randn``
alone is a sizeable part of a step (torch's generator draws ~10⁸ normals per second and core, about a sixth of
an MLP forward over 1 000 examples per parameter): ``benchmarks/bench_mgs.py`` counts it in the step's floor.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from taskloss.search.mgs_density import _log_q_from_sq

__all__: list[str] = []


@dataclass
class StepProposal:
    """q = λ·N(0, σ_t²I) + (1−λ)·N(−g, σ_t²I) of one step. ``g``, ``neg_g``: flat ``[P]`` in the parameters'
    dtype and device; ``g64``: its float64 copy; ``sigma``, ``gg``, ``numel``: CPU float64 ``[T]`` (σ_t,
    ‖g_t‖², number of entries); ``numels``: entries per tensor."""

    g: Tensor
    neg_g: Tensor
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
    return StepProposal(g, -g, g64, sig, gg, numel, list(numels))


class CandidateDraws:
    """Δθ_k of the candidates k = 0..n−1 of one step, regenerated on demand from ``seeds[k]``; ``mle[k]`` says
    whether candidate k comes from the MLE-centred component. :meth:`draw` fills the float64 statistics
    ``zz[k, t] = ‖z_{k,t}‖²``, ``zg[k, t] = ⟨z_{k,t}, g_t⟩`` when asked; :meth:`log_q` turns them into log q(Δθ_k).

    On a CPU the statistics and the scaling σ_t z (− g_t) run over blocks of ``CPU_BLOCK`` entries that stay in
    cache (a float64 copy of the whole noise vector and a separate scaling pass cost about as much again as
    drawing it); on a GPU each tensor is one block."""

    CPU_BLOCK = 1 << 16

    def __init__(self, proposal: StepProposal, seeds: list[int], mle: list[bool], include_mle: bool):
        self.p, self.seeds, self.mle, self.include_mle = proposal, seeds, mle, include_mle
        n, T, dev = len(seeds), len(proposal.numels), proposal.g.device
        self.zz = torch.zeros(n, T, dtype=torch.float64, device=dev)
        self.zg = torch.zeros(n, T, dtype=torch.float64, device=dev)
        self.sig = proposal.sigma.tolist()
        block = self.CPU_BLOCK if dev.type == "cpu" else max(proposal.numels)
        self._blocks = []          # (tensor index t, start, stop) over the flat vector
        self._offsets = []         # where tensor t starts in the flat vector
        start = 0
        for t, nt in enumerate(proposal.numels):
            self._blocks += [(t, a, min(a + block, start + nt)) for a in range(start, start + nt, block)]
            self._offsets.append(start)
            start += nt
        self._buf = torch.empty(min(block, max(proposal.numels)), dtype=torch.float64, device=dev)

    def draw(self, k: int, out: Tensor, stats: bool = False, load: tuple[Tensor, list[Tensor]] | None = None
             ) -> Tensor:
        """Write Δθ_k into ``out`` (flat ``[P]``, the parameters' dtype/device) and return it; with ``stats``
        also record row k of ``zz``/``zg`` (float64 sums per block, added per tensor in a fixed order: the same
        arithmetic in every memory mode and on every rank). ``load = (θ, views)`` also writes θ + Δθ_k into
        ``views`` (one flat tensor per parameter, e.g. ``p.view(-1)``) block by block while the block is in
        cache — the same elementwise sum as a separate pass would compute."""
        p = self.p
        if self.include_mle and k == 0:
            out.copy_(p.neg_g)
            if load is not None:
                for t, a, b in self._blocks:
                    self._write(load, t, a, b, out)
            return out
        gen = torch.Generator(device=out.device).manual_seed(self.seeds[k])
        mle = self.mle[k]
        zz: list[list[Tensor]] = [[] for _ in self.sig]
        zg: list[list[Tensor]] = [[] for _ in self.sig]
        for t, a, b in self._blocks:
            z = torch.randn(b - a, generator=gen, device=out.device, dtype=out.dtype, out=out[a:b])
            if stats:
                z64 = self._buf[:b - a].copy_(z)
                zz[t].append(torch.dot(z64, z64))
                zg[t].append(torch.dot(z64, p.g64[a:b]))
            if mle:
                torch.add(p.neg_g[a:b], z, alpha=self.sig[t], out=z)
            else:
                z.mul_(self.sig[t])
            if load is not None:
                self._write(load, t, a, b, out)
        if stats:
            self.zz[k] = torch.stack([torch.stack(x).sum() if x else self._buf.new_zeros(()) for x in zz])
            self.zg[k] = torch.stack([torch.stack(x).sum() if x else self._buf.new_zeros(()) for x in zg])
        return out

    def _write(self, load: tuple[Tensor, list[Tensor]], t: int, a: int, b: int, out: Tensor) -> None:
        theta, views = load
        o = self._offsets[t]
        torch.add(theta[a:b], out[a:b], out=views[t][a - o:b - o])

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
