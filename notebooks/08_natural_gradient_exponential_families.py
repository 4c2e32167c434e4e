# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · Natural gradients for exponential families: Gaussians, Bonnet & Price, variational inference
#
# For a network the Fisher matrix is huge and has to be approximated (notebooks 06–07). For an
# **exponential family** it comes for free: the natural gradient with respect to the natural parameters is the
# ordinary gradient with respect to the expectation (moment) parameters — no matrix is ever inverted. This is
# what makes natural-gradient variational inference and natural evolution strategies cheap.
#
# **Question.** Does $F(\lambda)^{-1}\nabla_\lambda \mathcal L = \nabla_\mu \mathcal L$ hold exactly for a Gaussian
# $q(z) = N(m, V)$; how are the moment gradients estimated (Bonnet's and Price's theorems); what is the natural
# gradient of the entropy; and how much faster is stochastic natural-gradient Gaussian VI than plain gradient VI
# on a real Bayesian logistic regression?
#
# Sources: *New Insights and Perspectives on the Natural Gradient Method* (Martens); *Conjugate-Computation
# Variational Inference* (Khan & Lin) and *The Variational Gaussian Approximation Revisited* (Opper & Archambeau)
# for the Gaussian VI update; Bonnet (1964) and Price (1958) for the two Gaussian gradient identities.
# Package code: `taskloss.curvature.natural_gradient`.

# %% tags=["parameters"]
seed: int = 0
device: str = "auto"
output_dir: str = ""
n_mc: int = 20000                   # [> 0] Monte-Carlo samples for the Bonnet / Price checks
n_reps: int = 200                   # [> 0] independent replications for the confidence-interval coverage
rep_samples: int = 500              # [> 0] samples per replication
n_features: int = 4                 # [> 0] breast-cancer features used by the logistic regression (+ a bias)
prior_var: float = 1.0              # [> 0] prior N(0, prior_var · I) on the weights
vi_samples: int = 4                 # [> 0] Monte-Carlo samples per VI iteration (both methods)
vi_steps: int = 150                 # [> 0] VI iterations
ngd_lr: float = 0.1                 # [> 0] natural-gradient VI step ρ
adam_lrs: list = [0.03, 0.1, 0.3, 1.0]  # [> 0] plain-gradient VI (Adam) step sizes tried
n_seeds: int = 3                    # [> 0] VI seeds

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import Ellipse
from scipy.optimize import minimize
from sklearn.datasets import load_breast_cancer
from torch.distributions import MultivariateNormal
from torch.func import grad, hessian, vmap
from tqdm.auto import tqdm

import taskloss.runner
from taskloss.curvature import (
    NaturalGaussianVI,
    bonnet_gradient,
    gaussian_from_expectation,
    gaussian_from_natural,
    gaussian_kl,
    gaussian_log_partition,
    gaussian_natural_fisher,
    gaussian_natural_gradient,
    gaussian_samples,
    gaussian_to_expectation,
    gaussian_to_natural,
    gaussian_vi_natural_update,
    price_gradient,
    sym_to_vec,
    vec_to_sym,
)

run = taskloss.runner.start("08_natural_gradient_exponential_families", output_dir, device=device, seed=seed)
dev, D = run.device, torch.float64
gen = torch.Generator(device=dev).manual_seed(seed)
print("device:", dev)

# %% [markdown]
# ## 1 · The Gaussian as an exponential family
#
# An exponential family is $q_\lambda(z) = h(z)\exp\!\big(\langle\lambda, T(z)\rangle - A(\lambda)\big)$ with
# natural parameters $\lambda$, sufficient statistics $T$ and log-partition $A$. Its two basic identities come from
# differentiating $\int q_\lambda = 1$:
#
# $$\nabla A(\lambda) = \mathbb E_q[T(z)] =: \mu, \qquad \nabla^2 A(\lambda) = \operatorname{Cov}_q[T(z)] = F(\lambda).$$
#
# The second one is the Fisher matrix: $\nabla_\lambda \log q = T - \nabla A$, so
# $\mathbb E[\nabla\log q\,\nabla\log q^\top] = \operatorname{Cov}[T]$. The expectation parameters $\mu$ are the
# **moment parameters**; $\lambda \mapsto \mu = \nabla A(\lambda)$ is a bijection with Jacobian $F$.
#
# For $N(m, V)$ take $T(z) = (z, zz^\top)$, so $\langle \lambda, T\rangle = \lambda_1^\top z + z^\top\lambda_2 z$ and
#
# $$\lambda_1 = V^{-1}m,\quad \lambda_2 = -\tfrac12 V^{-1};\qquad \mu_1 = m,\quad \mu_2 = V + mm^\top;\qquad
# A(\lambda) = -\tfrac14\lambda_1^\top\lambda_2^{-1}\lambda_1 - \tfrac12\log\det(-2\lambda_2) + \tfrac d2\log 2\pi,$$
#
# with $h(z) = 1$. $\lambda_2$ and $\mu_2$ are symmetric matrices; to treat them as vectors we use the
# half-vectorization that keeps the diagonal and multiplies each upper off-diagonal entry by $\sqrt2$
# (`sym_to_vec`). It preserves inner products, $\langle A, B\rangle = \operatorname{tr}(AB) =
# \mathrm{vec}_s(A)\cdot\mathrm{vec}_s(B)$, so gradients and Fisher matrices in these coordinates are the honest
# ones (a plain $d^2$ vectorization would make $F$ singular along antisymmetric directions).
#
# First the 1-D case from scratch: $A(\lambda_1,\lambda_2) = -\lambda_1^2/(4\lambda_2) - \tfrac12\log(-2\lambda_2) +
# \tfrac12\log 2\pi$, whose Hessian should be $\operatorname{Cov}[(z, z^2)] = \begin{pmatrix} v & 2mv\\ 2mv & 2v^2+4m^2v
# \end{pmatrix}$.

# %%
def A_1d(lam):
    return -lam[0] ** 2 / (4 * lam[1]) - 0.5 * torch.log(-2 * lam[1]) + 0.5 * math.log(2 * math.pi)


m1d, v1d = 0.7, 1.9
lam_1d = torch.tensor([m1d / v1d, -0.5 / v1d], dtype=D, device=dev)
torch.testing.assert_close(grad(A_1d)(lam_1d), torch.tensor([m1d, v1d + m1d ** 2], dtype=D, device=dev))
F_1d = hessian(A_1d)(lam_1d)
cov_T_1d = [[v1d, 2 * m1d * v1d], [2 * m1d * v1d, 2 * v1d ** 2 + 4 * m1d ** 2 * v1d]]      # Cov[(z, z²)]
torch.testing.assert_close(F_1d, torch.tensor(cov_T_1d, dtype=D, device=dev))
# parity with the package (any dimension; here d = 1)
torch.testing.assert_close(gaussian_natural_fisher(lam_1d[:1], lam_1d[1:].reshape(1, 1)), F_1d)
print("F(λ) for N(0.7, 1.9):\n", F_1d.cpu().numpy())

# %% [markdown]
# In 2-D (five natural coordinates) we check the same identities with the package: $\log q$ built from $A$ matches
# `torch.distributions`, $\nabla A = \mu$, and $\nabla^2 A$ equals a Monte-Carlo covariance of $T(z)$.

# %%
m2d = torch.tensor([0.3, -0.2], dtype=D, device=dev)
V2d = torch.tensor([[1.0, 0.3], [0.3, 0.5]], dtype=D, device=dev)
l1, l2 = gaussian_to_natural(m2d, V2d)
mu1, mu2 = gaussian_to_expectation(m2d, V2d)
torch.testing.assert_close(gaussian_from_natural(l1, l2), (m2d, V2d))
torch.testing.assert_close(gaussian_from_expectation(mu1, mu2), (m2d, V2d))
z_test = gaussian_samples(m2d, V2d, 5, gen)
log_q = z_test @ l1 + torch.einsum("si,ij,sj->s", z_test, l2, z_test) - gaussian_log_partition(l1, l2)
torch.testing.assert_close(log_q, MultivariateNormal(m2d, V2d).log_prob(z_test))
lam_vec = torch.cat([l1, sym_to_vec(l2)])
torch.testing.assert_close(grad(lambda v: gaussian_log_partition(v[:2], vec_to_sym(v[2:])))(lam_vec),
                           torch.cat([mu1, sym_to_vec(mu2)]))
F_2d = gaussian_natural_fisher(l1, l2)
z_mc = gaussian_samples(m2d, V2d, n_mc, gen)
T_mc = torch.cat([z_mc, sym_to_vec(z_mc.unsqueeze(-1) * z_mc.unsqueeze(-2))], -1)
cov_T = torch.cov(T_mc.T)
print(f"max |∇²A - Cov_MC[T]| = {float((F_2d - cov_T).abs().max()):.3f}  (max |F| = {float(F_2d.abs().max()):.2f})")
torch.testing.assert_close(cov_T, F_2d, rtol=0.1, atol=0.1)

# %% [markdown]
# ## 2 · The natural gradient in λ is the plain gradient in μ
#
# Let $\mathcal L$ be any function of the distribution, written either in $\lambda$ or in $\mu$. Since
# $\mu = \nabla A(\lambda)$ has Jacobian $\partial\mu/\partial\lambda = \nabla^2 A = F(\lambda)$ (symmetric), the chain
# rule gives
#
# $$\nabla_\lambda \mathcal L = F(\lambda)\,\nabla_\mu \mathcal L \quad\Longrightarrow\quad
# \tilde\nabla_\lambda \mathcal L := F(\lambda)^{-1}\nabla_\lambda\mathcal L = \nabla_\mu \mathcal L .$$
#
# We test it with $\mathcal L = \mathbb E_q[f(z)]$ for $f(z) = e^{a^\top z} + (c^\top z)^4$, whose expectation has a
# closed form: with $w = c^\top z \sim N(c^\top m, c^\top Vc) =: N(\bar w, s^2)$,
# $\mathbb E[f] = e^{a^\top m + \frac12 a^\top V a} + \bar w^4 + 6\bar w^2 s^2 + 3s^4$. We write $\mathcal L$ as a
# function of the natural coordinates and of the expectation coordinates (through the package conversions),
# differentiate both with autograd, and compare $F^{-1}\nabla_\lambda\mathcal L$ — with $F$ the Hessian of the
# log-partition from `torch.func.hessian` — against $\nabla_\mu\mathcal L$, in 1-D and 2-D.

# %%
def expected_f(m, V, a, c):
    w, s2 = c @ m, c @ V @ c
    return torch.exp(a @ m + 0.5 * a @ V @ a) + w ** 4 + 6 * w ** 2 * s2 + 3 * s2 ** 2


def f_point(z, a, c):
    return torch.exp(a @ z) + (c @ z) ** 4


cases = {
    "1-D": (torch.tensor([0.4], dtype=D), torch.tensor([[0.8]], dtype=D), torch.tensor([0.5], dtype=D),
            torch.tensor([0.7], dtype=D)),
    "2-D": (m2d.cpu(), V2d.cpu(), torch.tensor([0.4, -0.3], dtype=D), torch.tensor([0.5, 0.8], dtype=D)),
}
nat_grad_exact = {}
for name, (m, V, a, c) in cases.items():
    m, V, a, c = (x.to(dev) for x in (m, V, a, c))
    d = m.shape[0]
    lam = torch.cat([t.reshape(-1) if t.ndim == 1 else sym_to_vec(t) for t in gaussian_to_natural(m, V)])
    mu = torch.cat([t.reshape(-1) if t.ndim == 1 else sym_to_vec(t) for t in gaussian_to_expectation(m, V)])
    L_of_lam = lambda v: expected_f(*gaussian_from_natural(v[:d], vec_to_sym(v[d:])), a, c)      # noqa: E731
    L_of_mu = lambda v: expected_f(*gaussian_from_expectation(v[:d], vec_to_sym(v[d:])), a, c)   # noqa: E731
    g_lam = torch.autograd.functional.jacobian(L_of_lam, lam)
    g_mu = torch.autograd.functional.jacobian(L_of_mu, mu)
    F_lam = hessian(lambda v: gaussian_log_partition(v[:d], vec_to_sym(v[d:])))(lam)
    natural = torch.linalg.solve(F_lam, g_lam)
    torch.testing.assert_close(natural, g_mu, rtol=1e-9, atol=1e-10)
    nat_grad_exact[name] = g_mu
    cos = float(g_lam @ g_mu / g_lam.norm() / g_mu.norm())
    print(f"{name}: F⁻¹∇_λL = ∇_μL to {float((natural - g_mu).abs().max()):.1e};  "
          f"the plain λ-gradient differs: cos(∇_λL, ∇_μL) = {cos:.3f}")
run.record("expfam/natural_vs_moment_max_diff_2d", float((natural - g_mu).abs().max()))

# %% [markdown]
# ## 3 · Estimating the moment gradients: Bonnet's and Price's theorems
#
# $\nabla_\mu\mathbb E_q[f]$ still has to be computed. Write $\mathcal L(m, V) = \mathbb E_{N(m,V)}[f]$; then, since
# $\mu_1 = m$ and $\mu_2 = V + mm^\top$, i.e. $m = \mu_1$, $V = \mu_2 - \mu_1\mu_1^\top$, the chain rule gives
#
# $$\nabla_{\mu_1}\mathcal L = \nabla_m\mathcal L - 2\,(\nabla_V\mathcal L)\,m ,\qquad \nabla_{\mu_2}\mathcal L =
# \nabla_V\mathcal L .$$
#
# Two classical identities turn these into expectations of derivatives of $f$:
#
# * **Bonnet:** $\nabla_m \mathbb E[f(z)] = \mathbb E[\nabla f(z)]$. With $z = m + L\varepsilon$ the mean enters
#   only by translation, so the derivative passes inside the expectation.
# * **Price:** $\nabla_V \mathbb E[f(z)] = \tfrac12\mathbb E[\nabla^2 f(z)]$. The Gaussian density obeys the heat
#   equation $\partial N/\partial V_{ij} = \tfrac12\,\partial^2 N/\partial z_i\partial z_j$ (entries of $V$ taken
#   as free variables); integrating by parts twice moves both derivatives onto $f$. For the single free entry
#   $V_{ij} = V_{ji}$ of a symmetric matrix the derivative is $c_{ij}\mathbb E[\partial_{ij} f]$ with
#   $c_{ii} = \tfrac12$, $c_{ij} = 1$ — the same statement.
#
# Together: $\tilde\nabla_{\lambda_1} = \mathbb E[\nabla f] - \mathbb E[\nabla^2 f]\,m$ and
# $\tilde\nabla_{\lambda_2} = \tfrac12\mathbb E[\nabla^2 f]$ (`gaussian_natural_gradient`). We check the Monte-Carlo
# estimators (`bonnet_gradient`, `price_gradient`, which return a mean and a standard error) against the exact
# derivatives of the closed form, with confidence intervals.

# %%
m, V, a, c = (x.to(dev) for x in cases["2-D"])
f2 = lambda z: f_point(z, a, c)                                                  # noqa: E731
mr, Vr = m.clone().requires_grad_(), V.clone().requires_grad_()
exact_gm, exact_gV = torch.autograd.grad(expected_f(mr, Vr, a, c), (mr, Vr))     # V's entries as free variables

bon = bonnet_gradient(f2, m, V, n_mc, gen)
pri = price_gradient(f2, m, V, n_mc, gen)
z_bon = ((bon.mean - exact_gm) / bon.stderr).abs().max()
z_pri = ((pri.mean - exact_gV) / pri.stderr).abs().max()
print(f"Bonnet: estimate {bon.mean.cpu().numpy().round(3)} ± {(1.96 * bon.stderr).cpu().numpy().round(3)}, "
      f"exact {exact_gm.cpu().numpy().round(3)}")
print(f"Price:  estimate {pri.mean.cpu().numpy().round(3).tolist()} ± "
      f"{(1.96 * pri.stderr).cpu().numpy().round(3).tolist()}, exact {exact_gV.cpu().numpy().round(3).tolist()}")
print(f"largest |z-score|: Bonnet {float(z_bon):.2f}, Price {float(z_pri):.2f}")
assert z_bon < 5 and z_pri < 5
# Bonnet + Price combined: the Monte-Carlo natural gradient against the exact ∇_μ L of section 2
n1_mc, n2_mc = gaussian_natural_gradient(f2, m, V, n_mc, gen)
z_nat = ((torch.cat([n1_mc.mean, sym_to_vec(n2_mc.mean)]) - nat_grad_exact["2-D"])
         / torch.cat([n1_mc.stderr, sym_to_vec(n2_mc.stderr)])).abs().max()
print(f"natural gradient by Monte Carlo vs exact ∇_μL: largest |z-score| {float(z_nat):.2f}")
assert z_nat < 5

# %% [markdown]
# Are the estimators unbiased and the intervals honest? Repeat the estimate `n_reps` times with `rep_samples`
# draws each and count how often the 95% interval (mean ± 1.96 standard errors) covers the exact value. We also
# compare the per-sample variance of Bonnet's estimator with the score-function (likelihood-ratio) estimator of the
# same gradient, $\nabla_m\mathbb E[f] = \mathbb E[f(z)\,V^{-1}(z-m)]$.

# %%
covered_b, covered_p, reps_b = [], [], []
for _ in tqdm(range(n_reps), desc="replications", leave=False):
    b, p = bonnet_gradient(f2, m, V, rep_samples, gen), price_gradient(f2, m, V, rep_samples, gen)
    covered_b.append(((b.mean - exact_gm).abs() <= 1.96 * b.stderr).float())
    covered_p.append(((p.mean - exact_gV).abs() <= 1.96 * p.stderr).float()[[0, 0, 1], [0, 1, 1]])
    reps_b.append(b.mean)
coverage = torch.cat([torch.stack(covered_b), torch.stack(covered_p)], 1).mean(0)
reps_b = torch.stack(reps_b)
bias_z = ((reps_b.mean(0) - exact_gm) / (reps_b.std(0) / math.sqrt(n_reps))).abs().max()
print("coverage of the 95% intervals, per entry (∂m₁, ∂m₂, ∂V₁₁, ∂V₁₂, ∂V₂₂):", coverage.cpu().numpy().round(3))
print(f"mean of {n_reps} Bonnet estimates vs exact: largest |z| = {float(bias_z):.2f}")
sf_samples = gaussian_samples(m, V, n_mc, gen)
sf = vmap(f2)(sf_samples).unsqueeze(-1) * torch.linalg.solve(V, (sf_samples - m).T).T
bonnet_samples = vmap(grad(f2))(sf_samples)
var_ratio = (sf.var(0) / bonnet_samples.var(0)).cpu()
print(f"score-function / Bonnet per-sample variance: {var_ratio.numpy().round(1)}")
assert bias_z < 4
assert coverage.min() > 0.85
run.record("bonnet_price/min_coverage_95", float(coverage.min()), headline=True)
run.record("bonnet_price/score_function_variance_ratio", float(var_ratio.min()))

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
labels = [r"$\partial_{m_1}$", r"$\partial_{m_2}$",
          r"$\partial_{V_{11}}$", r"$\partial_{V_{12}}$", r"$\partial_{V_{22}}$"]
est = torch.cat([bon.mean, pri.mean[[0, 0, 1], [0, 1, 1]]]).cpu()
err = 1.96 * torch.cat([bon.stderr, pri.stderr[[0, 0, 1], [0, 1, 1]]]).cpu()
ex = torch.cat([exact_gm, exact_gV[[0, 0, 1], [0, 1, 1]]]).cpu()
ax = axes[0]
ax.errorbar(range(5), est - ex, yerr=err, fmt="o", capsize=4, label=f"MC estimate − exact, 95% CI ({n_mc} samples)")
ax.axhline(0, color="k", lw=0.8)
ax.set_xticks(range(5), labels)
ax.set(title="Bonnet (∂m) and Price (∂V) estimators", ylabel="error")
ax.legend(fontsize=8)
ax = axes[1]
ax.bar(range(5), coverage.cpu(), color="tab:blue")
ax.axhline(0.95, color="k", ls="--", lw=1, label="nominal 0.95")
ax.set_xticks(range(5), labels)
ax.set(ylim=(0.5, 1.0), title=f"CI coverage over {n_reps} replications of {rep_samples} samples")
ax.legend(fontsize=8)
fig.tight_layout()
run.savefig(fig, "bonnet_price.png")
plt.show()

# %% [markdown]
# ## 4 · The natural gradient of the entropy is $-\lambda$
#
# With $\log q = \log h + \langle\lambda, T\rangle - A(\lambda)$ the entropy is
# $\mathbb H(\lambda) = -\mathbb E_q[\log q] = A(\lambda) - \langle\lambda, \mu(\lambda)\rangle - \mathbb E_q[\log h]$.
# For $h \equiv 1$ (our Gaussian convention; any constant $h$ gives the same result):
#
# $$\nabla_\lambda\mathbb H = \nabla A - \mu - (\partial\mu/\partial\lambda)^\top\lambda = -F(\lambda)\,\lambda
# \quad\Longrightarrow\quad \tilde\nabla_\lambda\mathbb H = F^{-1}\nabla_\lambda\mathbb H = -\lambda .$$
#
# Equivalently $\nabla_\mu \mathbb H = -\lambda$: the negative entropy is the convex conjugate of $A$, whose
# gradient maps $\mu$ back to $\lambda$. So the natural gradient of the **entropy** (not of the negative entropy)
# is $-\lambda = (-V^{-1}m,\ +\tfrac12 V^{-1})$: ascending it moves $\lambda$ toward 0, i.e. widens $q$. We check it
# with the entropy from `torch.distributions` (which knows nothing about $A$) in 1-D, 2-D and 3-D.

# %%
for d in (1, 2, 3):
    g_d = torch.Generator().manual_seed(seed + d)
    B = torch.randn(d, d, dtype=D, generator=g_d)
    m_e, V_e = torch.randn(d, dtype=D, generator=g_d).to(dev), (B @ B.T + 0.5 * torch.eye(d, dtype=D)).to(dev)
    le1, le2 = gaussian_to_natural(m_e, V_e)
    lam = torch.cat([le1, sym_to_vec(le2)])
    ent = lambda v: MultivariateNormal(*gaussian_from_natural(v[:d], vec_to_sym(v[d:]))).entropy()  # noqa: E731
    nat = torch.linalg.solve(gaussian_natural_fisher(le1, le2), torch.autograd.functional.jacobian(ent, lam))
    torch.testing.assert_close(nat, -lam)
    mu = torch.cat([m_e, sym_to_vec(V_e + torch.outer(m_e, m_e))])
    ent_mu = lambda v: MultivariateNormal(*gaussian_from_expectation(v[:d], vec_to_sym(v[d:]))).entropy()  # noqa: E731
    torch.testing.assert_close(torch.autograd.functional.jacobian(ent_mu, mu), -lam)
    print(f"d={d}: F⁻¹∇_λH = -λ and ∇_μH = -λ (max deviation {float((nat + lam).abs().max()):.1e})")

# %% [markdown]
# ## 5 · Natural-gradient Gaussian variational inference
#
# Bayesian logistic regression: $p(y_n\mid x_n, z) = \sigma(y_n x_n^\top z)$ with $y_n \in \{\pm1\}$, prior
# $p(z) = N(0, \sigma_0^2 I)$, Gaussian posterior approximation $q = N(m, V)$ maximizing
#
# $$\mathrm{ELBO}(q) = \mathbb E_q\Big[\underbrace{\textstyle\sum_n \log\sigma(y_n x_n^\top z)}_{f(z)}\Big]
# + \mathbb E_q[\log p(z)] + \mathbb H(q).$$
#
# Its natural gradient is the sum of three pieces we have already met: $\tilde\nabla\,\mathbb E_q[f]$ (Bonnet +
# Price), $\tilde\nabla\,\mathbb E_q[\log p(z)] = \lambda_0$ (the log-prior is linear in $T(z)$ with coefficients the
# prior's natural parameters $\lambda_0$, so its expectation is linear in $\mu$), and $\tilde\nabla\mathbb H = -\lambda$.
# A natural-gradient ascent step of size $\rho$ is therefore
#
# $$\lambda \leftarrow (1-\rho)\,\lambda + \rho\,\big(\lambda_0 + \tilde\nabla_\lambda\mathbb E_q[f]\big)
# \iff P \leftarrow (1-\rho)P + \rho\big(P_0 - \mathbb E_q[\nabla^2 f]\big),\quad
# m \leftarrow m + \rho P^{-1}\big(\mathbb E_q[\nabla f] - P_0 m\big),$$
#
# with $P = V^{-1}$ the precision (the $m$-update uses the new $P$). For $\rho = 1$ and a Gaussian likelihood it
# is the exact Bayesian update in one step. We first write one step from scratch in natural coordinates and check
# parity with `taskloss.curvature.NaturalGaussianVI` on the same random draws.

# %%
data = load_breast_cancer()
X_raw = data.data[:, :n_features]
X_std = (X_raw - X_raw.mean(0)) / X_raw.std(0)
X = torch.tensor(np.c_[X_std, np.ones(len(X_std))], dtype=D, device=dev)   # standardized features + bias
y = torch.tensor(2.0 * data.target - 1.0, dtype=D, device=dev)
Xy = X * y[:, None]
d = X.shape[1]
prior_mean, prior_prec = torch.zeros(d, dtype=D, device=dev), torch.eye(d, dtype=D, device=dev) / prior_var
print(f"{len(y)} patients, features {[str(n) for n in data.feature_names[:n_features]]} + bias → d = {d}")


def log_lik(z):
    return -torch.nn.functional.softplus(-(Xy @ z)).sum()


# one step from scratch (natural coordinates) vs the package
rho0, S0 = 0.5, vi_samples
m_init, V_init = 0.1 * torch.ones(d, dtype=D, device=dev), 0.5 * torch.eye(d, dtype=D, device=dev)
z_s = gaussian_samples(m_init, V_init, S0, torch.Generator(device=dev).manual_seed(123))
Eg, EH = vmap(grad(log_lik))(z_s).mean(0), vmap(hessian(log_lik))(z_s).mean(0)
lam1, lam2 = gaussian_to_natural(m_init, V_init)
p1, p2 = gaussian_to_natural(prior_mean, torch.linalg.inv(prior_prec))
new1 = (1 - rho0) * lam1 + rho0 * (p1 + Eg - EH @ m_init)
new2 = (1 - rho0) * lam2 + rho0 * (p2 + 0.5 * EH)
m_scratch, V_scratch = gaussian_from_natural(new1, new2)
vi = NaturalGaussianVI(log_lik, prior_mean, prior_prec, lr=rho0, n_samples=S0, init_mean=m_init,
                       init_precision=torch.linalg.inv(V_init), generator=torch.Generator(device=dev).manual_seed(123))
vi.step()
torch.testing.assert_close((vi.mean, vi.covariance), (m_scratch, V_scratch))
torch.testing.assert_close(gaussian_vi_natural_update(m_init, torch.linalg.inv(V_init), Eg, EH, rho0, prior_mean,
                                                      prior_prec), (vi.mean, vi.precision))
print("one natural-gradient VI step: scratch == taskloss")

# %% [markdown]
# **Exact ELBO and references.** Each term $\log\sigma(y_n x_n^\top z)$ depends on $z$ only through the scalar
# $a_n = y_n x_n^\top z \sim N(y_n x_n^\top m,\ x_n^\top V x_n)$, so $\mathbb E_q[f]$ is a sum of 1-D Gaussian
# integrals, which 40-point Gauss–Hermite quadrature evaluates to machine precision; the other two terms are closed
# form. This deterministic ELBO is used to *evaluate* every iterate, and, maximized with L-BFGS over $(m, $ Cholesky
# factor of $V)$, gives the reference optimum $q^*$. A second reference is the Laplace approximation (Newton to the
# MAP, $V = (-\nabla^2\log p(z\mid y))^{-1}$); being a Gaussian, its ELBO can only be lower. The quadrature ELBO is
# cross-checked against a plain Monte-Carlo ELBO built from `torch.distributions` log-densities.
#
# With the default `n_features = 4` the features are the radius, texture, perimeter and area of the cell nuclei;
# radius, perimeter and area are almost collinear, so the posterior is correlated (the condition number of the
# optimal covariance, printed below, is about 50 at the defaults: anisotropic, not extreme) — the situation in
# which a step that knows the geometry should help.

# %%
gh_t, gh_w = (torch.tensor(v, dtype=D, device=dev) for v in np.polynomial.hermite.hermgauss(40))
gh_w = gh_w / math.sqrt(math.pi)


def elbo_chol(m, L):
    """Exact ELBO of q = N(m, LLᵀ) (L lower triangular, positive diagonal)."""
    s = (X @ L).norm(dim=-1)                                 # sqrt(x_nᵀ V x_n)
    a_n = (Xy @ m)[:, None] + math.sqrt(2.0) * s[:, None] * gh_t
    e_log_lik = -(torch.nn.functional.softplus(-a_n) * gh_w).sum()
    e_log_prior = -0.5 * d * math.log(2 * math.pi * prior_var) - (L.square().sum() + m @ m) / (2 * prior_var)
    entropy = 0.5 * d * math.log(2 * math.pi * math.e) + torch.log(torch.diagonal(L)).sum()
    return e_log_lik + e_log_prior + entropy


def elbo(m, V):
    return elbo_chol(m, torch.linalg.cholesky(V))


def unpack(x):
    m, rest = x[:d], x[d:]
    L = torch.zeros(d, d, dtype=D, device=dev)
    il = torch.tril_indices(d, d, device=dev)
    L = L.index_put((il[0], il[1]), rest)
    return m, L.tril(-1) + torch.diag(torch.diagonal(L).exp())


def neg_elbo_np(x):
    xt = torch.tensor(x, dtype=D, device=dev, requires_grad=True)
    m, L = unpack(xt)
    val = -elbo_chol(m, L)
    (g,) = torch.autograd.grad(val, xt)
    return float(val.detach()), g.cpu().numpy()


opt_res = minimize(neg_elbo_np, np.zeros(d + d * (d + 1) // 2), jac=True, method="L-BFGS-B",
                   options=dict(maxiter=5000, gtol=1e-10, ftol=1e-15))
m_star, L_star = unpack(torch.tensor(opt_res.x, dtype=D, device=dev))
V_star = L_star @ L_star.T
elbo_star = float(elbo(m_star, V_star))

m_map = torch.zeros(d, dtype=D, device=dev)
for _ in range(50):
    g_post = grad(log_lik)(m_map) - prior_prec @ m_map
    H_post = hessian(log_lik)(m_map) - prior_prec
    m_map = m_map - torch.linalg.solve(H_post, g_post)
V_lap = torch.linalg.inv(-H_post)
elbo_lap = float(elbo(m_map, V_lap))
print(f"optimal Gaussian ELBO {elbo_star:.5f} (L-BFGS, {opt_res.nit} iterations); Laplace ELBO {elbo_lap:.5f} "
      f"(gap {elbo_star - elbo_lap:.4f} nats)")
assert elbo_lap <= elbo_star + 1e-8
# the quadrature ELBO against a plain Monte-Carlo ELBO built from torch.distributions log-densities
q_chk = MultivariateNormal(m_star, V_star)
n_chk = min(n_mc, 20000)
z_chk = q_chk.sample((n_chk,))
prior = MultivariateNormal(prior_mean, prior_var * torch.eye(d, dtype=D, device=dev))
terms = vmap(log_lik)(z_chk) + prior.log_prob(z_chk) - q_chk.log_prob(z_chk)
z_elbo = (terms.mean() - elbo(m_star, V_star)) / (terms.std() / math.sqrt(n_chk))
print(f"ELBO at q*: quadrature {float(elbo(m_star, V_star)):.4f}, Monte Carlo {float(terms.mean()):.4f} "
      f"± {1.96 * float(terms.std()) / math.sqrt(n_chk):.4f}")
assert abs(float(z_elbo)) < 5

cond_star = float(torch.linalg.cond(V_star))
print(f"condition number of the optimal covariance V*: {cond_star:.0f}")
run.record("vi/optimal_elbo", elbo_star)
run.record("vi/condition_number_V_star", cond_star)
run.record("vi/laplace_gap_nats", elbo_star - elbo_lap)

# %% [markdown]
# The optimum is a fixed point of the natural-gradient update with exact expectations: $P^* = P_0 -
# \mathbb E_{q^*}[\nabla^2 f]$ and $\mathbb E_{q^*}[\nabla f] = P_0 m^*$ (the stationarity conditions of the Gaussian
# ELBO). For the logistic likelihood these expectations are again 1-D integrals:
# $\mathbb E[\nabla f] = \sum_n y_n x_n\,\mathbb E[\sigma(-a_n)]$, $\mathbb E[\nabla^2 f] = -\sum_n x_n x_n^\top
# \mathbb E[\sigma(a_n)\sigma(-a_n)]$.

# %%
s_star = torch.sqrt(torch.einsum("ni,ij,nj->n", X, V_star, X))
a_star = (Xy @ m_star)[:, None] + math.sqrt(2.0) * s_star[:, None] * gh_t
E_grad = Xy.T @ (torch.sigmoid(-a_star) * gh_w).sum(1)
E_hess = -torch.einsum("ni,nj,n->ij", X, X, (torch.sigmoid(a_star) * torch.sigmoid(-a_star) * gh_w).sum(1))
fixed_m, fixed_P = gaussian_vi_natural_update(m_star, torch.linalg.inv(V_star), E_grad, E_hess, 1.0, prior_mean,
                                              prior_prec)
print(f"fixed-point residuals: |Δm| = {float((fixed_m - m_star).abs().max()):.1e}, "
      f"|ΔP| = {float((fixed_P - torch.linalg.inv(V_star)).abs().max()):.1e}")
torch.testing.assert_close(fixed_m, m_star, rtol=0, atol=1e-4)
torch.testing.assert_close(fixed_P, torch.linalg.inv(V_star), rtol=1e-4, atol=1e-3)


# %% [markdown]
# **The race.** Both methods start at the prior and draw `vi_samples` points per iteration. Natural-gradient VI
# uses `NaturalGaussianVI` (per sample a gradient *and* a Hessian of $f$ — $d = 5$ here, so a Hessian costs about
# five gradients). Plain-gradient VI parameterizes $q$ by $m$ and a Cholesky factor with log-diagonal, estimates
# the gradient of $\mathbb E_q[f]$ with the reparameterization trick on the same number of samples, uses the
# closed-form prior and entropy terms, and runs Adam at each of the step sizes in `adam_lrs`. Every iterate is
# scored with the exact ELBO; we plot the gap to the optimum over `n_seeds` seeds.

# %%
def run_ngd(seed_k: int) -> tuple[np.ndarray, NaturalGaussianVI]:
    vi = NaturalGaussianVI(log_lik, prior_mean, prior_prec, lr=ngd_lr, n_samples=vi_samples,
                           generator=torch.Generator(device=dev).manual_seed(seed_k))
    gaps = []
    for _ in range(vi_steps):
        vi.step()
        gaps.append(elbo_star - float(elbo(vi.mean, vi.covariance)))
    return np.array(gaps), vi


def run_adam(seed_k: int, lr: float) -> tuple[np.ndarray, tuple[torch.Tensor, torch.Tensor]]:
    g_k = torch.Generator(device=dev).manual_seed(seed_k)
    m = torch.zeros(d, dtype=D, device=dev, requires_grad=True)
    raw = torch.diag(torch.full((d,), 0.5 * math.log(prior_var), dtype=D, device=dev)).requires_grad_()
    adam = torch.optim.Adam([m, raw], lr=lr)
    gaps = []
    for _ in range(vi_steps):
        L = raw.tril(-1) + torch.diag(torch.diagonal(raw).exp())
        z = m + torch.randn(vi_samples, d, dtype=D, device=dev, generator=g_k) @ L.T
        V = L @ L.T
        objective = (vmap(log_lik)(z).mean() - (torch.diagonal(V).sum() + m @ m) / (2 * prior_var)
                     + torch.log(torch.diagonal(L)).sum())
        adam.zero_grad()
        (-objective).backward()
        adam.step()
        with torch.no_grad():
            L = raw.tril(-1) + torch.diag(torch.diagonal(raw).exp())
            gap = elbo_star - float(elbo_chol(m, L))
            gaps.append(gap if math.isfinite(gap) else float("inf"))      # a diverged run counts as infinitely far
    return np.array(gaps), (m.detach(), (L @ L.T).detach())


seeds = [seed + k for k in range(n_seeds)]
curves = {"natural gradient": []}
finals = {}
for s in tqdm(seeds, desc="natural-gradient VI", leave=False):
    gaps, vi_s = run_ngd(s)
    curves["natural gradient"].append(gaps)
    finals.setdefault("natural gradient", (vi_s.mean, vi_s.covariance))
for lr in tqdm(adam_lrs, desc="Adam VI", leave=False):
    key = f"Adam lr={lr:g}"
    curves[key] = []
    for s in seeds:
        gaps, q_final = run_adam(s, lr)
        curves[key].append(gaps)
        finals.setdefault(key, q_final)
curves = {k: np.stack(v) for k, v in curves.items()}


# %%
def first_below(gaps: np.ndarray, threshold: float) -> float:
    idx = np.nonzero(gaps < threshold)[0]
    return float(idx[0] + 1) if len(idx) else float("inf")


tail = max(1, vi_steps // 3)
summary = {}
for k, g in curves.items():
    summary[k] = dict(hit_1=[first_below(x, 1.0) for x in g], hit_01=[first_below(x, 0.1) for x in g],
                      tail=float(g[:, -tail:].mean()))
    print(f"{k:>17}: iterations to a gap < 1 nat {summary[k]['hit_1']}, < 0.1 nat {summary[k]['hit_01']}, "
          f"mean gap over the last {tail} iterations {summary[k]['tail']:.3f} nats")
adam_keys = [k for k in curves if k.startswith("Adam")]
best_adam = min(adam_keys, key=lambda k: summary[k]["tail"])
ngd = summary["natural gradient"]
kl_final = float(gaussian_kl(m_star, V_star, *finals["natural gradient"]))
print(f"best Adam step size by final gap: {best_adam};  KL(q* ‖ q_NGD) after {vi_steps} steps (seed {seed}): "
      f"{kl_final:.4f}")
for i, s in enumerate(seeds):
    best_adam_hit = min(summary[k]["hit_01"][i] for k in adam_keys)
    assert ngd["hit_01"][i] < best_adam_hit, f"seed {s}: natural gradient not first below 0.1 nat"
assert ngd["tail"] < summary[best_adam]["tail"]
run.record("vi/ngd_iters_to_gap_0.1_mean", float(np.mean(ngd["hit_01"])), headline=True)
run.record("vi/best_adam_iters_to_gap_0.1", [min(summary[k]["hit_01"][i] for k in adam_keys)
                                             for i in range(n_seeds)])
run.record("vi/ngd_final_gap_nats", ngd["tail"], headline=True)
run.record("vi/best_adam_final_gap_nats", summary[best_adam]["tail"], headline=True)
run.record("vi/kl_opt_to_ngd", kl_final)

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
ax = axes[0]
colors = {k: plt.cm.tab10(n % 10) for n, k in enumerate(curves)}
it = np.arange(1, vi_steps + 1)
for k, g in curves.items():
    ax.plot(it, np.median(g, 0), color=colors[k], label=k)
    ax.fill_between(it, g.min(0), g.max(0), color=colors[k], alpha=0.2)
ax.axhline(elbo_star - elbo_lap, color="k", ls=":", lw=1, label="Laplace approximation")
ax.set(yscale="log", xlabel="iteration", ylabel="ELBO* − ELBO (nats)", ylim=(1e-3, None),
       title=f"Gaussian VI, {vi_samples} samples / iteration, {n_seeds} seeds (median, range)")
ax.legend(fontsize=8)
ax = axes[1]
i, j = (0, 2) if n_features >= 3 else (0, d - 1)          # 'mean radius' against 'mean perimeter' by default
axis_name = [f"weight of '{n}'" for n in data.feature_names[:n_features]] + ["bias"]


def ellipse(mean, cov, **kw):
    sub = cov[[i, j]][:, [i, j]].cpu().numpy()
    vals, vecs = np.linalg.eigh(sub)
    angle = math.degrees(math.atan2(vecs[1, 1], vecs[0, 1]))
    w, h_ = 2 * 2 * np.sqrt(vals[::-1])
    return Ellipse((float(mean[i]), float(mean[j])), w, h_, angle=angle, fill=False, **kw)


ax.add_patch(ellipse(m_star, V_star, color="k", lw=2, label="optimal Gaussian q*"))
ax.add_patch(ellipse(m_map, V_lap, color="k", ls=":", lw=1.5, label="Laplace"))
ax.add_patch(ellipse(*finals["natural gradient"], color=colors["natural gradient"], lw=1.5, label="natural gradient"))
ax.add_patch(ellipse(*finals[best_adam], color=colors[best_adam], lw=1.5, label=best_adam))
ax.autoscale_view()
ax.set(xlabel=axis_name[i], ylabel=axis_name[j], title=f"2σ ellipses after {vi_steps} iterations (seed {seed})")
ax.legend(fontsize=8)
fig.tight_layout()
run.savefig(fig, "gaussian_vi.png")
plt.show()

# %% [markdown]
# ## Results

# %%
run.table()

# %% [markdown]
# **What the numbers say.** For the Gaussian the Fisher of the natural parameters is the Hessian of the
# log-partition and the covariance of the sufficient statistics; with it, $F^{-1}\nabla_\lambda\mathcal L$ equals
# the moment gradient $\nabla_\mu\mathcal L$ to rounding error in 1-D and 2-D, although the plain gradient in
# $\lambda$ points elsewhere. Bonnet's and Price's estimators agree with the exact derivatives within a few standard
# errors, their 95% intervals cover at the rate printed above (asserted above 0.85; the measured coverage is
# close to the nominal 95 %, as a normal interval on this many samples should be), and the reparameterized Bonnet estimator has a much
# smaller per-sample variance than the score-function estimator of the same gradient. The natural gradient of the
# entropy is exactly $-\lambda$, which is what turns the natural-gradient VI step into an interpolation between the
# current natural parameters and "prior + likelihood message".
#
# On the breast-cancer logistic regression the natural-gradient VI reaches an ELBO within 0.1 nat of the optimal
# Gaussian in the number of iterations recorded above, and is asserted to get there before Adam at any of the tried
# step sizes for every seed, and to sit closer to the optimum at the end (its remaining gap is the Monte-Carlo
# noise of a constant step with few samples). Each natural step costs a Hessian per sample on top of the gradient
# — cheap at $d = 5$, the price that grows with dimension and that the approximations of notebook 07 avoid.
# The Laplace approximation, centred at the MAP, is a little below the optimal Gaussian ELBO (gap printed above).
