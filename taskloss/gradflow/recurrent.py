"""Exact Jacobians of a recurrent network's state across time lags: ∂h_t/∂h_{t−k} and ∂c_t/∂c_{t−k}.

For a recurrence ``s_t = Φ(s_{t−1}, x_t)`` the chain rule gives, with the inputs held fixed,

    ∂s_t/∂s_{t−k} = A_t A_{t−1} ⋯ A_{t−k+1},      A_u = ∂Φ/∂s (s_{u−1}, x_u),

so whether gradients vanish or explode over ``k`` steps is a property of this product. The state is ``s = h``
for a tanh/ReLU RNN (``A_u = diag(1 − h_u²) W_hh`` for tanh) and for a GRU, and ``s = (h, c)`` for an LSTM, whose
cell path ``c_t = f_t ⊙ c_{t−1} + i_t ⊙ g_t`` has the one-step block ``∂c_t/∂c_{t−1} = diag(f_t)`` exactly (the
gates read ``h_{t−1}``, not ``c_{t−1}``). The popular argument for why the LSTM eases vanishing gradients keeps
only that block over ``k`` steps, ``dc_t/dc_{t−k} ≈ diag(∏_{u=t−k+1}^{t} f_u)``, and drops every path that leaves
the cell through ``h_u = o_u ⊙ tanh(c_u)`` and comes back through the gates; :func:`gate_product_error` measures
what that costs, against the total derivative that backpropagation delivers to ``c_{t−k}``
(:attr:`LagJacobians.cc_total`) or the state block that holds ``h_{t−k}`` fixed (:attr:`LagJacobians.cc`). For a
GRU (``h_t = (1 − z_t) ⊙ n_t + z_t ⊙ h_{t−1}``) the analogue is ``∏ z_u``.

Two exact computations, equal up to rounding (both tested against autograd through the module's own forward):

- ``method="product"`` (default): the one-step Jacobians ``A_u`` of all time steps at once (``vmap`` over batch
  and time of ``jacrev`` of the cell), then the running product over lags (``K`` batched matrix products);
- ``method="reverse"``: one rollout in which a zero perturbation is added to every state, and one reverse-mode
  Jacobian of ``s_t`` with respect to all perturbations at once (``torch.func.jacrev``): every lag in one pass.

The cell equations follow PyTorch's ``nn.RNN``/``nn.LSTM``/``nn.GRU`` (gate order i, f, g, o and r, z, n; two
bias vectors). Dropout between layers is not applied (the Jacobians are those of the deterministic recurrence).
Derived in notebook 13_recurrent_gradients; the argument analysed is from the essay on RNN gradients listed in
the README (Su, *Scientific Spaces*, 2020), following Hochreiter & Schmidhuber (*Neural Computation*, 1997) and
Pascanu, Mikolov & Bengio, *On the difficulty of training recurrent neural networks* (ICML 2013).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import jacrev, vmap

from taskloss.models.recurrent import RNNLM
from taskloss.validation import check_bool, check_finite, check_generator, check_int, check_positive, check_token_ids

__all__ = ["LagJacobians", "lag_jacobians", "jacobian_norms", "gate_product_error", "init_recurrent_"]

_KINDS = {nn.LSTM: "lstm", nn.GRU: "gru"}


# ------------------------------------------------------------------------------------------------ cells
def _cell_step(kind: str, w: dict[str, torch.Tensor], s: torch.Tensor, x: torch.Tensor):
    """One step of one layer on an unbatched state ``s`` (``[H]``, or ``[2H]`` = (h, c) for LSTM) and input
    ``x`` ``[in]`` → (new state, aux ``[2, H]``): aux[0] is the gate whose product approximates the carry (f for
    LSTM, z for GRU, ones for plain RNNs), aux[1] the diagonal of ``∂h/∂c = o ⊙ tanh′(c)`` (LSTM; else 0)."""
    gi = w["weight_ih"] @ x + w["bias_ih"]
    if kind == "lstm":
        h, c = s.chunk(2)
        i, f, g, o = (gi + w["weight_hh"] @ h + w["bias_hh"]).chunk(4)
        f = torch.sigmoid(f)
        c = f * c + torch.sigmoid(i) * torch.tanh(g)
        o, tc = torch.sigmoid(o), torch.tanh(c)
        return torch.cat([o * tc, c]), torch.stack([f, o * (1 - tc * tc)])
    gh = w["weight_hh"] @ s + w["bias_hh"]
    if kind == "gru":
        (ir, iz, in_), (hr, hz, hn) = gi.chunk(3), gh.chunk(3)
        r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
        n = torch.tanh(in_ + r * hn)
        return (1 - z) * n + z * s, torch.stack([z, torch.zeros_like(z)])
    pre = gi + gh
    return (torch.tanh(pre) if kind == "rnn_tanh" else torch.relu(pre)), torch.stack([torch.ones_like(s),
                                                                                      torch.zeros_like(s)])


def _resolve(module: nn.Module, inputs: torch.Tensor):
    """(kind, rnn module, inputs as float ``[B, T, in]``) for a supported recurrent module."""
    if isinstance(module, RNNLM):
        if module.validate_inputs:
            check_token_ids("inputs", inputs, module.vocab_size)
        return _resolve(module.rnn, module.tok_emb(inputs))
    if not isinstance(module, (nn.RNN, nn.LSTM, nn.GRU)):
        raise TypeError("module must be a torch.nn.RNN, nn.LSTM, nn.GRU or taskloss.models.RNNLM, got "
                        f"{type(module).__name__} (a non-recurrent module has no state to differentiate)")
    if module.bidirectional:
        raise ValueError("bidirectional recurrent modules are not supported: the backward direction's state at "
                         "time t depends on the future, so ∂h_t/∂h_(t−k) is not a forward lag")
    if getattr(module, "proj_size", 0):
        raise ValueError("LSTMs with proj_size > 0 are not supported")
    kind = _KINDS.get(type(module), "rnn_tanh" if getattr(module, "nonlinearity", "tanh") == "tanh" else "rnn_relu")
    if not isinstance(inputs, torch.Tensor) or not inputs.is_floating_point():
        raise TypeError(f"inputs must be a floating-point tensor for {type(module).__name__}, "
                        f"got {type(inputs).__name__ if not isinstance(inputs, torch.Tensor) else inputs.dtype}")
    if inputs.ndim != 3 or inputs.shape[-1] != module.input_size:
        order = "[B, T, input_size]" if module.batch_first else "[T, B, input_size]"
        raise ValueError(f"inputs must have shape {order} with input_size={module.input_size}, "
                         f"got {tuple(inputs.shape)}")
    xs = inputs if module.batch_first else inputs.transpose(0, 1)
    if xs.shape[0] == 0 or xs.shape[1] == 0:
        raise ValueError(f"inputs is empty: shape {tuple(inputs.shape)}")
    check_finite("inputs", xs)
    return kind, module, xs


def _layer_weights(rnn: nn.Module, layer: int, like: torch.Tensor) -> dict[str, torch.Tensor]:
    w = {k: getattr(rnn, f"{k}_l{layer}") for k in ("weight_ih", "weight_hh")}
    for k in ("bias_ih", "bias_hh"):
        w[k] = getattr(rnn, f"{k}_l{layer}") if rnn.bias else torch.zeros(w["weight_hh"].shape[0], dtype=like.dtype,
                                                                              device=like.device)
    for k, v in w.items():
        check_finite(f"module.{k}_l{layer}", v)
    return {k: v.detach().to(like.dtype) for k, v in w.items()}


# ------------------------------------------------------------------------------------------------ result
@dataclass(frozen=True)
class LagJacobians:
    """Exact Jacobians of the state at time ``t`` with respect to the state ``k`` steps earlier.

    ``state`` ``[K, B, S, S]`` holds ``∂s_t/∂s_{t−k}`` for ``k = lags[0..K−1] = 1..K`` (``S = H``, or ``2H`` with
    ``s = (h, c)`` for LSTM); ``gate_product`` ``[K, B, H]`` is ``∏_{u=t−k+1}^{t}`` of the forget gates (LSTM), the
    update gates z (GRU), or ones (RNN). ``t`` is the 0-based time index of the input last read; lag ``t + 1``
    is the initial state. ``dh_dc`` ``[K, B, H]`` is the diagonal of ``∂h_{t−k}/∂c_{t−k} = o ⊙ tanh′(c)`` at the
    source time (LSTM; 0 for the initial state, which is given, and for other cells).

    Two LSTM Jacobians of ``c_t`` with respect to ``c_{t−k}`` exist: :attr:`cc` treats ``(h, c)`` as independent
    state (``h_{t−k}`` held fixed); :attr:`cc_total` is the derivative backpropagation delivers to the node
    ``c_{t−k}``, which also moves ``h_{t−k} = o_{t−k} ⊙ tanh(c_{t−k})``. ``hh`` is both (nothing computes
    ``c`` from ``h`` within a step)."""

    kind: str
    hidden_size: int
    t: int
    lags: torch.Tensor
    state: torch.Tensor
    gate_product: torch.Tensor
    dh_dc: torch.Tensor

    @property
    def hh(self) -> torch.Tensor:
        """``∂h_t/∂h_{t−k}`` ``[K, B, H, H]`` (for LSTM: with ``c_{t−k}`` held fixed)."""
        H = self.hidden_size
        return self.state[..., :H, :H]

    @property
    def cc(self) -> torch.Tensor:
        """``∂c_t/∂c_{t−k}`` ``[K, B, H, H]`` (LSTM only; with ``h_{t−k}`` held fixed)."""
        if self.kind != "lstm":
            raise ValueError(f"cc exists only for LSTMs; this recurrence is {self.kind!r}")
        H = self.hidden_size
        return self.state[..., H:, H:]

    @property
    def cc_total(self) -> torch.Tensor:
        """``dc_t/dc_{t−k}`` ``[K, B, H, H]`` through every path, ``h_{t−k} = o_{t−k} ⊙ tanh(c_{t−k})`` included:
        ``∂c_t/∂c_{t−k} + ∂c_t/∂h_{t−k} · diag(o_{t−k} ⊙ tanh′(c_{t−k}))`` (LSTM only)."""
        H = self.hidden_size
        return self.cc + self.state[..., H:, :H] * self.dh_dc.unsqueeze(-2)


# ------------------------------------------------------------------------------------------------ main
def lag_jacobians(module: nn.Module, inputs: torch.Tensor, *, t: int = -1, max_lag: int | None = None,
                  layer: int = -1, state=None, method: str = "product") -> LagJacobians:
    """Exact ``∂s_t/∂s_{t−k}`` for ``k = 1..max_lag`` of one layer of a recurrent module, per sequence.

    Args:
        module: ``nn.RNN`` (tanh or relu), ``nn.LSTM``, ``nn.GRU`` (unidirectional, no projection) or
            :class:`~taskloss.models.recurrent.RNNLM` (its embedding feeds its ``rnn``).
        inputs: what the module reads: float ``[B, T, in]`` (``[T, B, in]`` when not ``batch_first``), or token
            ids ``[B, T]`` for an RNNLM.
        t: time index of the output state (0-based; negative counts from the end).
        max_lag: largest lag ``K`` (default ``t + 1``: back to the initial state); at most ``t + 1``.
        layer: which layer's state (negative counts from the top); lower layers only supply its inputs.
        state: initial state as the module takes it (``h0 [L, B, H]``, or ``(h0, c0)``); zeros by default.
        method: ``"product"`` (default; the faster on CPU for short sequences) or ``"reverse"`` (module
            docstring); equal up to rounding.

    Returns:
        :class:`LagJacobians` in the dtype of the inputs (float64 inputs give float64 Jacobians).

    Raises:
        TypeError: a non-recurrent module or non-tensor/wrong-dtype inputs.
        ValueError: lags beyond the sequence, a bad layer or time index, NaN inputs or weights, an unknown
            method, bidirectional or projected modules.
    """
    if method not in ("reverse", "product"):
        raise ValueError(f"method must be 'reverse' or 'product', got {method!r}")
    kind, rnn, xs = _resolve(module, inputs)
    xs = xs.detach()
    B, T = xs.shape[:2]
    check_int("t", t)
    tt = t + T if t < 0 else t
    if not 0 <= tt < T:
        raise ValueError(f"t={t} is outside the sequence of length T={T}")
    K = tt + 1 if max_lag is None else check_int("max_lag", max_lag, minimum=1)
    if K > tt + 1:
        raise ValueError(f"max_lag={K} goes beyond the sequence: at t={tt} there are only {tt + 1} earlier states "
                         "(lag t+1 is the initial state)")
    check_int("layer", layer)
    L = rnn.num_layers
    lay = layer + L if layer < 0 else layer
    if not 0 <= lay < L:
        raise ValueError(f"layer={layer} is outside the module's {L} layers")
    H = rnn.hidden_size
    s0 = _initial_states(kind, state, L, B, H, xs)
    # lower layers: their outputs are the fixed inputs of layer `lay`
    for below in range(lay):
        w = _layer_weights(rnn, below, xs)
        xs = vmap(lambda s, x, w=w: _rollout(kind, w, s, x)[0])(s0[below], xs)[:, 1:, :H]
    w = _layer_weights(rnn, lay, xs)
    states, aux = vmap(lambda s, x: _rollout(kind, w, s, x))(s0[lay], xs[:, : tt + 1])  # [B,tt+2,S], [B,tt+1,2,H]
    first = tt + 1 - K                                                                 # state index of lag K
    if method == "reverse":
        jac = vmap(lambda s, x: _reverse(kind, w, s, x))(states[:, first], xs[:, first: tt + 1])  # [B, K, S, S]
        jac = jac.flip(1)
    else:
        steps = vmap(vmap(jacrev(lambda s, x: _cell_step(kind, w, s, x)[0])))(
            states[:, first: tt + 1], xs[:, first: tt + 1])                              # [B, K, S, S], A_u
        prods, acc = [], None
        for k in range(K):                                                             # A_t ⋯ A_{t−k}
            a = steps[:, K - 1 - k]
            acc = a if acc is None else acc @ a
            prods.append(acc)
        jac = torch.stack(prods, 1)
    gprod = aux[:, first: tt + 1, 0].flip(1).cumprod(1)                                 # [B, K, H]
    lags = torch.arange(1, K + 1, device=xs.device)
    src = tt - lags                                                                     # time of s_{t−k}
    dh_dc = torch.zeros(B, K, H, dtype=xs.dtype, device=xs.device)                      # 0 at the initial state
    dh_dc[:, src >= 0] = aux[:, src[src >= 0], 1]
    return LagJacobians(kind, H, tt, lags, jac.transpose(0, 1).contiguous(), gprod.transpose(0, 1).contiguous(),
                        dh_dc.transpose(0, 1).contiguous())


def _initial_states(kind, state, L, B, H, xs) -> torch.Tensor:
    """``[L, B, S]`` initial states (zeros by default) from the module's ``h0`` / ``(h0, c0)`` convention."""
    if state is None:
        return torch.zeros(L, B, 2 * H if kind == "lstm" else H, dtype=xs.dtype, device=xs.device)
    parts = state if kind == "lstm" else (state,)
    if kind == "lstm" and not (isinstance(state, (tuple, list)) and len(state) == 2):
        raise TypeError("state of an LSTM must be a tuple (h0, c0)")
    for p in parts:
        if not isinstance(p, torch.Tensor) or tuple(p.shape) != (L, B, H):
            raise ValueError(f"initial state tensors must have shape [num_layers, B, hidden] = {[L, B, H]}, got "
                             f"{getattr(p, 'shape', type(p).__name__)}")
        check_finite("state", p)
    return torch.cat([p.detach().to(xs.dtype) for p in parts], -1)


def _rollout(kind, w, s, xs):
    """States ``[T+1, S]`` (initial state first) and the steps' aux ``[T, 2, H]`` of one sequence ``xs`` ``[T, in]``."""
    states, gates = [s], []
    for x in xs:
        s, g = _cell_step(kind, w, s, x)
        states.append(s)
        gates.append(g)
    return torch.stack(states), torch.stack(gates)


def _reverse(kind, w, s0, xs):
    """``[K, S, S]``: ∂s_K/∂s_j for j = 0..K−1 (lags K..1) of one sequence, one reverse-mode Jacobian with respect
    to zero perturbations δ_j added to every state s_j."""
    K = xs.shape[0]

    def final(deltas):
        s = s0 + deltas[0]
        for j in range(K):
            s = _cell_step(kind, w, s, xs[j])[0]
            if j + 1 < K:
                s = s + deltas[j + 1]
        return s

    return jacrev(final)(torch.zeros(K, s0.shape[0], dtype=s0.dtype, device=s0.device)).transpose(0, 1)


# ------------------------------------------------------------------------------------------------ measures
def jacobian_norms(jac: torch.Tensor, ord: str | int = "fro") -> torch.Tensor:
    """Matrix norms of a stack of Jacobians ``[..., n, m]`` → ``[...]``.

    Args:
        jac: Jacobians, e.g. ``LagJacobians.hh`` ``[K, B, H, H]``.
        ord: ``"fro"`` (Frobenius), ``2`` (spectral: the largest singular value, the worst-case gain of a
            gradient passed back through the Jacobian) or ``"nuc"``.
    """
    if not isinstance(jac, torch.Tensor) or not jac.is_floating_point():
        raise TypeError(f"jac must be a floating-point tensor, got {type(jac).__name__}")
    if jac.ndim < 2 or jac.numel() == 0:
        raise ValueError(f"jac must be a non-empty stack of matrices [..., n, m], got shape {tuple(jac.shape)}")
    if ord not in ("fro", 2, "nuc"):
        raise ValueError(f"ord must be 'fro', 2 or 'nuc', got {ord!r}")
    check_finite("jac", jac)
    return torch.linalg.matrix_norm(jac, ord=ord)


def gate_product_error(jac: LagJacobians, total: bool = True) -> torch.Tensor:
    """Relative error ``[K, B]`` of the gate-product approximation.

        err_k = ‖J_k − diag(∏ gate)‖_F / max(‖J_k‖_F, ‖diag(∏ gate)‖_F)   ∈ [0, 2],

    with ``J_k = dc_t/dc_{t−k}`` for an LSTM (``∏ f``; :attr:`LagJacobians.cc_total`, or with ``total=False`` the
    state block :attr:`LagJacobians.cc` that holds ``h_{t−k}`` fixed, for which ``err_1 = 0`` exactly) and
    ``J_k = ∂h_t/∂h_{t−k}`` for a GRU (``∏ z``). The symmetric denominator keeps the error finite when either side
    vanishes (0 when both are 0); it is near 1 when one side is much larger than the other (see
    :func:`jacobian_norms` for which).

    Args:
        jac: the Jacobians of an LSTM or GRU (:func:`lag_jacobians`).
        total: LSTM only: compare with the total derivative (what backpropagation delivers) or the state block.
    """
    total = check_bool("total", total)
    if not isinstance(jac, LagJacobians):
        raise TypeError(f"jac must be a LagJacobians, got {type(jac).__name__}")
    if jac.kind not in ("lstm", "gru"):
        raise ValueError(f"the gate-product approximation exists for LSTM and GRU, not {jac.kind!r}")
    J = (jac.cc_total if total else jac.cc) if jac.kind == "lstm" else jac.hh
    D = torch.diag_embed(jac.gate_product)
    den = torch.maximum(jacobian_norms(J), jacobian_norms(D)).clamp_min(torch.finfo(J.dtype).tiny)
    return jacobian_norms(J - D) / den


@torch.no_grad()
def init_recurrent_(module: nn.Module, *, gain: float = 1.0, forget_bias: float | None = None,
                    generator: torch.Generator | None = None) -> nn.Module:
    """Re-initialise the recurrent weights in place: every ``H × H`` gate block of ``weight_hh`` drawn from
    ``N(0, gain²/H)`` (spectral radius ≈ ``gain`` by the circular law), recurrent biases zeroed, and for an LSTM
    the forget-gate bias set to ``forget_bias`` (in ``bias_ih``; ``bias_hh``'s forget part 0). Input weights are
    kept. Returns the module. Used for the vanishing/exploding regimes of 13_recurrent_gradients.

    Args:
        module: ``nn.RNN``, ``nn.LSTM``, ``nn.GRU`` or an RNNLM (its ``rnn``).
        gain: scale of the recurrent weights (> 0).
        forget_bias: LSTM only; ``None`` keeps the input bias as it is.
        generator: random generator for the draw.
    """
    rnn = module.rnn if isinstance(module, RNNLM) else module
    if not isinstance(rnn, (nn.RNN, nn.LSTM, nn.GRU)):
        raise TypeError(f"module must be a torch.nn.RNN, nn.LSTM, nn.GRU or RNNLM, got {type(module).__name__}")
    gain = check_positive("gain", gain)
    check_generator("generator", generator)
    on = generator.device if generator is not None else torch.device("cpu")    # draws where the generator lives
    if forget_bias is not None:
        if not isinstance(rnn, nn.LSTM):
            raise ValueError("forget_bias applies to LSTMs only")
        if not math.isfinite(float(forget_bias)):
            raise ValueError(f"forget_bias must be finite, got {forget_bias}")
    H = rnn.hidden_size
    for name, p in rnn.named_parameters():
        if name.startswith("weight_hh"):
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype, device=on).to(p.device) * (gain / math.sqrt(H)))
        elif name.startswith("bias_hh"):
            p.zero_()
        elif name.startswith("bias_ih") and forget_bias is not None:
            p[H:2 * H] = float(forget_bias)
    return module
