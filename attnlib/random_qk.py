r"""Random query-key attention: the random-features model of Fu, Guo, Bai and Mei (2023).

Chapter 1 (``chapters/01-random-features.md``) derives everything in this module.

The model is *not* Peng et al.'s "Random Feature Attention" (random Fourier features that
approximate softmax attention); here the query-key matrices of many ReLU attention heads are
drawn at random and frozen and only the value vectors are trained, which makes the layer a
random-features (kernel) model.  To avoid the name clash the module is called ``random_qk``.

Conventions (the book's own where the paper could not be checked; see the chapter):

* a sequence is a tensor ``x`` of shape ``(batch, N + 1, d)``; token 0 is the query
  :math:`x_0`, tokens ``1..N`` are the keys; all tokens lie on the unit sphere
  :math:`\mathbb S^{d-1}`;
* augmented tokens :math:`\tilde x = (x, a)` with ``a = 1`` (``D = d + 1``);
* one head with query-key matrix :math:`W \in \mathbb R^{D\times D}` has the feature

  .. math:: \phi_W(x_{0:N}) = \frac1N \sum_{i=1}^N \sigma(\tilde x_0^\top W \tilde x_i)\, \tilde
      x_i ,

  and the layer is :math:`f(x_{0:N}) = \sum_m \langle v_m, \phi_{W_m}(x_{0:N})\rangle`;
* RFA: :math:`W` has i.i.d. :math:`\mathcal N(0, \tau^2)` entries, :math:`\tau = 1/2`;
  BRFA: :math:`W = c\sqrt d\,[I_d, 0; 0, 0] + Z` with ``Z`` as in RFA;
* RFMLP: :math:`\sum_m a_m \sigma(\langle w_m, X\rangle)` on the concatenation
  :math:`X = (x_0, \dots, x_N, a)` with :math:`w_m \sim \mathcal N(0, I/\|X\|^2)`.

All math is float64 by default and runs on whatever device the inputs live on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ._validation import ParameterError, check_choice, check_float, check_int

__all__ = [
    "RandomQKConfig",
    "sample_tokens",
    "augment",
    "sample_qk",
    "rfa_features",
    "rfa_forward",
    "design_matrix",
    "concat_tokens",
    "sample_rfmlp_weights",
    "rfmlp_features",
    "kappa1",
    "kappa1_taylor",
    "rfa_kernel",
    "rfmlp_kernel",
    "relu_moment",
    "brfa_kernel",
    "harmonic_dim",
    "gegenbauer",
    "gegenbauer_target",
    "random_bilinear",
    "bilinear_target",
    "max_over_keys_target",
    "max_over_keys_floor",
    "max_over_keys_block_variances",
    "key_key_target",
    "cumulative_rank",
    "eigenlearning_risk_min",
    "eigenlearning_samples_to_risk",
    "level_crossing_n",
    "finite_head_spectrum",
    "kernel_ridge_path",
    "feature_ridge_path",
    "center_kernel",
    "ridge_direct",
    "validated_risk",
    "rfa_complexity_bilinear",
]


# --------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RandomQKConfig:
    r"""Sizes of the Chapter 1 experiments (one instance per profile)."""

    d: int = 8  # token dimension of the main experiments
    N_list: tuple = (2, 4, 8)  # numbers of keys compared (RFA vs RFMLP)
    N: int = 8  # number of keys in the single-N experiments
    n_list: tuple = (50, 100, 200, 400, 800)  # training-set sizes of the learning curves
    n_val: int = 250  # validation points (choose the ridge lambda)
    n_test: int = 250  # fresh test points (excess risk)
    heads: int = 250  # heads of the finite-head RFA/BRFA comparisons
    heads_list: tuple = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)  # error vs M
    mc_heads: tuple = (10, 30, 100, 300, 1000, 3000, 10000)  # kernel Monte Carlo
    mc_sequences: int = 8  # sequences in the kernel Monte Carlo check
    mc_repeats: int = 20  # independent head draws per M in the Monte Carlo check
    bias: float = 1.0  # BRFA mean strength c
    bias_list: tuple = (0.0, 0.5, 1.0, 1.5, 2.0)  # mean-strength sweep
    small_d: int = 4  # dimension of the RFA/BRFA crossing experiment
    small_N: int = 4  # keys of the crossing experiment
    small_n_list: tuple = (25, 50, 100, 200, 400, 800)  # sizes of the crossing experiment
    seeds: int = 3  # independent repetitions (data, weights, target)
    brfa_seeds: int = 4  # repetitions of the RFA/BRFA comparison
    floor_d: int = 3  # dimension of the max-over-keys experiment that reaches the floor
    floor_N: int = 2  # keys of that experiment
    floor_n_list: tuple = (50, 100, 200, 400, 800)  # its training-set sizes
    floor_n_val: int = 500  # its validation points
    floor_n_test: int = 1000  # its test points
    s2r_level: float = 0.5  # relative risk whose sample size is compared across N and d
    s2r_d: int = 4  # dimension of the samples-vs-N comparison
    s2r_N_list: tuple = (2, 4, 8)  # keys of the samples-vs-N comparison
    s2r_N: int = 4  # keys of the samples-vs-d comparison
    s2r_d_list: tuple = (3, 4, 6, 8)  # dimensions of the samples-vs-d comparison
    spec_n_cov: int = 16000  # sequences for the finite-head feature covariance (BRFA theory)
    spec_n_proj: int = 100000  # sequences for the target projections (BRFA theory)
    # ridge grid, chosen on validation data: 1e-12 ... 1 and both ends of the path -- the
    # ridgeless limit 0 and 1e6, where the fit is the training mean to within 1e-6 (kernel
    # diagonals are at most ~1, so lambda * n exceeds every eigenvalue of the n x n kernel 1e6-fold)
    lambdas: tuple = field(default_factory=lambda: (
        0.0, *(float(v) for v in 10.0 ** np.arange(-12, 1)), 1e6))

    def __post_init__(self):
        for name in ("d", "N", "n_val", "n_test", "heads", "mc_sequences", "mc_repeats",
                     "small_d", "small_N", "seeds", "brfa_seeds", "floor_d", "floor_N",
                     "floor_n_val", "floor_n_test", "s2r_d", "s2r_N", "spec_n_cov",
                     "spec_n_proj"):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("d", "small_d", "floor_d", "s2r_d"):
            check_int(name, getattr(self, name), minimum=3)
        check_float("s2r_level", self.s2r_level, minimum=0.0, maximum=1.0, strict=True)
        check_choice("N", self.N, self.N_list)
        for name in ("N_list", "n_list", "heads_list", "mc_heads", "small_n_list",
                     "floor_n_list", "s2r_N_list", "s2r_d_list"):
            values = getattr(self, name)
            if len(values) == 0:
                raise ParameterError(f"{name}={values!r} must be a non-empty tuple of positive integers")
            for v in values:
                check_int(name, v, minimum=1)
        check_float("bias", self.bias, minimum=0.0)
        for c in self.bias_list:
            check_float("bias_list", c, minimum=0.0)
        for lam in self.lambdas:
            check_float("lambdas", lam, minimum=0.0)


# --------------------------------------------------------------------------------------
# inputs and features
# --------------------------------------------------------------------------------------


def sample_tokens(n, N, d, *, generator=None, device=None, dtype=torch.float64):
    r"""``n`` sequences of one query and ``N`` keys, i.i.d. uniform on :math:`\mathbb S^{d-1}`.

    Returns a tensor of shape ``(n, N + 1, d)``; ``x[:, 0]`` is the query.
    """
    g = torch.randn(n, N + 1, d, generator=generator, device=device, dtype=dtype)
    return g / g.norm(dim=-1, keepdim=True)


def augment(x, a=1.0):
    r"""Append the constant coordinate: :math:`\tilde x = (x, a)`, shape ``(..., d + 1)``."""
    return torch.cat([x, torch.full_like(x[..., :1], a)], dim=-1)


def sample_qk(M, d, *, bias=0.0, tau=0.5, generator=None, device=None, dtype=torch.float64):
    r"""``M`` frozen query-key matrices of shape ``(M, d + 1, d + 1)``.

    RFA (``bias = 0``): i.i.d. :math:`\mathcal N(0, \tau^2)` entries.  BRFA: the mean
    :math:`W_0 = c\sqrt d\,\mathrm{diag}(I_d, 0)` with :math:`c` = ``bias`` is added, so that the
    score becomes :math:`c\sqrt d\langle x_0, x_i\rangle + \mathcal N(0, 1)` (Chapter 1, eq.
    ch1-brfa).
    """
    D = d + 1
    W = tau * torch.randn(M, D, D, generator=generator, device=device, dtype=dtype)
    if bias:
        idx = torch.arange(d, device=W.device)
        W[:, idx, idx] += bias * math.sqrt(d)
    return W


def rfa_features(x, W, *, a=1.0, chunk=512):
    r"""Per-head features
    :math:`\phi_{W_m}(x_{0:N}) = \frac1N\sum_i \sigma(\tilde x_0^\top W_m\tilde x_i)\tilde x_i`.

    ``x``: ``(n, N + 1, d)``; ``W``: ``(M, D, D)``. Returns ``(n, M, D)``.
    """
    out = []
    for s in range(0, x.shape[0], chunk):
        xt = augment(x[s:s + chunk], a)
        q, k = xt[:, 0], xt[:, 1:]
        u = torch.einsum("nd,mde->nme", q, W)  # (n, M, D): x0~^T W_m
        scores = torch.einsum("nme,nie->nmi", u, k)  # (n, M, N)
        out.append(torch.einsum("nmi,nie->nme", torch.relu(scores), k) / k.shape[1])
    return torch.cat(out, dim=0)


def rfa_forward(x, W, V, *, a=1.0):
    r"""Layer output :math:`f(x_{0:N}) = \sum_m \langle v_m, \phi_{W_m}\rangle`; ``V``: ``(M, D)``.
    Returns ``(n,)``."""
    return torch.einsum("nme,me->n", rfa_features(x, W, a=a), V)


def design_matrix(phi):
    r"""Flatten head features ``(n, M, D)`` to the ridge design :math:`\Phi/\sqrt M`,
    shape ``(n, M D)``.

    With this scaling :math:`\Psi\Psi^\top` is the finite-head kernel, an average over heads.
    """
    n, M = phi.shape[:2]
    return phi.reshape(n, -1) / math.sqrt(M)


def concat_tokens(x, a=1.0):
    r"""RFMLP input :math:`X = (x_0, x_1, \dots, x_N, a)`, shape ``(n, (N + 1) d + 1)``."""
    flat = x.reshape(x.shape[0], -1)
    return torch.cat([flat, torch.full_like(flat[:, :1], a)], dim=-1)


def sample_rfmlp_weights(M, L, *, scale2, generator=None, device=None, dtype=torch.float64):
    r"""``M`` first-layer weights :math:`w_m \sim \mathcal N(0, I_L/\text{scale2})`, shape ``(M,
    L)``."""
    w = torch.randn(M, L, generator=generator, device=device, dtype=dtype)
    return w / math.sqrt(scale2)


def rfmlp_features(X, w):
    r"""RFMLP features :math:`\sigma(\langle w_m, X\rangle)`; ``X``: ``(n, L)``, ``w``: ``(M, L)``
    -> ``(n, M)``."""
    return torch.relu(X @ w.T)


# --------------------------------------------------------------------------------------
# closed-form kernels
# --------------------------------------------------------------------------------------


def kappa1(rho):
    r"""ReLU arc-cosine function :math:`\kappa_1(\rho) = \mathbb E[\sigma(g)\sigma(g')]` (unit
    variances).

    .. math:: \kappa_1(\rho) = \frac{\sqrt{1-\rho^2} + (\pi - \arccos\rho)\,\rho}{2\pi}.
    """
    rho = rho.clamp(-1.0, 1.0)
    return (torch.sqrt(1 - rho * rho) + (math.pi - torch.arccos(rho)) * rho) / (2 * math.pi)


def kappa1_taylor(order):
    r"""Taylor coefficients :math:`c_0..c_{\text{order}}` of :math:`\kappa_1`, from the Hermite
    coefficients of ReLU: :math:`c_k = \mu_k^2/k!`, :math:`\mu_0 = 1/\sqrt{2\pi}`,
    :math:`\mu_1 = 1/2`,
    :math:`\mu_k^2 = ((k-3)!!)^2/(2\pi)` for even :math:`k\ge2`, 0 for odd :math:`k\ge3`."""

    def dfact(m):
        return 1 if m <= 0 else m * dfact(m - 2)

    out = []
    for k in range(order + 1):
        if k == 0:
            mu2 = 1 / (2 * math.pi)
        elif k == 1:
            mu2 = 0.25
        elif k % 2 == 1:
            mu2 = 0.0
        else:
            mu2 = dfact(k - 3) ** 2 / (2 * math.pi)
        out.append(mu2 / math.factorial(k))
    return np.array(out)


def _chunks(na, per_row, budget=4_000_000):
    step = max(1, int(budget // max(per_row, 1)))
    return range(0, na, step), step


def _rfa_parts(x, a):
    t = augment(x, a)
    q, k = t[:, 0], t[:, 1:]
    return q, k, q.norm(dim=-1)[:, None] * k.norm(dim=-1)  # (n, D), (n, N, D), (n, N)


def _rfa_block(A, B):
    """Unscaled kernel block, the double sum of :func:`rfa_kernel` (rows of A, columns of B)."""
    (qa, ka, ra), (qb, kb, rb) = A, B
    G = torch.einsum("aie,bje->abij", ka, kb)  # <x~_i, x~'_j>
    U = qa @ qb.T  # <x~_0, x~'_0>
    R = ra[:, None, :, None] * rb[None, :, None, :]
    rho = U[:, :, None, None] * G / R
    return (R * kappa1(rho) * G).sum(dim=(-1, -2))


def rfa_kernel(xa, xb=None, *, a=1.0, tau=0.5):
    r"""Infinite-head RFA kernel :math:`K(x, x') = \mathbb E_W\langle\phi_W(x), \phi_W(x')\rangle`.

    With :math:`r_i = \|\tilde x_0\|\|\tilde x_i\|` and
    :math:`\rho_{ij} = \langle\tilde x_0,\tilde x_0'\rangle
    \langle\tilde x_i,\tilde x_j'\rangle/(r_i r_j')`,

    .. math:: K = \frac{\tau^2}{N N'} \sum_{i,j} r_i r'_j\,\kappa_1(\rho_{ij})\,
        \langle\tilde x_i, \tilde x'_j\rangle .

    ``xa``: ``(na, N + 1, d)``, ``xb``: ``(nb, N' + 1, d)``. Returns ``(na, nb)``.
    With ``xb=None`` the symmetric matrix ``K(xa, xa)`` is computed from its upper triangle.
    Chapter 1, theorem ``thm-ch1-kernel``.
    """
    sym = xb is None
    xb = xa if sym else xb
    A = _rfa_parts(xa, a)
    B = A if sym else _rfa_parts(xb, a)
    Na, Nb = A[1].shape[1], B[1].shape[1]
    out = torch.empty(xa.shape[0], xb.shape[0], dtype=xa.dtype, device=xa.device)
    budget = 4_000_000 if xa.device.type == "cpu" else 100_000_000  # elements per temporary
    starts, step = _chunks(xa.shape[0], xb.shape[0] * Na * Nb, budget)
    for s in starts:
        e = s + step
        rows = tuple(t[s:e] for t in A)
        if sym:
            blk = _rfa_block(rows, tuple(t[s:] for t in B))
            out[s:e, s:] = blk
            out[s:, s:e] = blk.T
        else:
            out[s:e] = _rfa_block(rows, B)
    return out * (tau**2 / (Na * Nb))


def rfmlp_kernel(Xa, Xb, *, scale2):
    r"""Infinite-width RFMLP kernel for :math:`w \sim \mathcal N(0, I/\text{scale2})`:

    .. math:: K(X, X') = \frac{\|X\|\|X'\|}{\text{scale2}}\,\kappa_1\Big(\frac{\langle X,
        X'\rangle}{\|X\|\|X'\|}\Big).

    ``Xa``: ``(na, L)``, ``Xb``: ``(nb, L)`` (use :func:`concat_tokens`). Returns ``(na, nb)``.
    """
    na, nb = Xa.norm(dim=-1), Xb.norm(dim=-1)
    nn_ = na[:, None] * nb[None, :]
    return nn_ * kappa1((Xa @ Xb.T) / nn_) / scale2


_GL_CACHE = {}


def _gauss_legendre(m, dtype, device):
    key = (m, dtype, str(device))
    if key not in _GL_CACHE:
        z, w = np.polynomial.legendre.leggauss(m)
        _GL_CACHE[key] = (torch.tensor(z, dtype=dtype, device=device),
                          torch.tensor(w, dtype=dtype, device=device))
    return _GL_CACHE[key]


def _psi(u, s):
    r""":math:`\psi_s(u) = \mathbb E[\sigma(u + s g)] = u\Phi(u/s) + s\varphi(u/s)`."""
    s = s.clamp_min(1e-300)
    z = u / s
    return u * torch.special.ndtr(z) + s * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def relu_moment(alpha, beta, rho, *, nodes=40, zmax=9.0):
    r"""Bivariate shifted-ReLU moment
    :math:`m(\alpha,\beta,\rho) = \mathbb E[\sigma(\alpha + g)\sigma(\beta + g')]`.

    :math:`(g, g')` standard Gaussian with correlation :math:`\rho`.  Kink-aware quadrature of

    .. math:: m = \int_{-\alpha}^{\infty} (\alpha + z)\,\psi_{\sqrt{1-\rho^2}}(\beta + \rho
        z)\,\varphi(z)\,dz,

    integrating only over :math:`z > -\alpha` (the first ReLU's kink) and splitting at
    :math:`z = -\beta/\rho` (where :math:`\psi` has a near-kink when :math:`|\rho|\to1`), with
    Gauss-Legendre nodes on each piece.  Broadcasts over its arguments.
    """
    alpha, beta, rho = torch.broadcast_tensors(*(torch.as_tensor(t, dtype=torch.float64)
                                                 for t in (alpha, beta, rho)))
    rho = rho.clamp(-1.0, 1.0)
    s = torch.sqrt((1 - rho * rho).clamp_min(0.0))
    lo = torch.clamp(-alpha, min=-zmax)
    hi = torch.full_like(lo, zmax)
    lo = torch.minimum(lo, hi)
    safe_rho = torch.where(rho.abs() > 1e-12, rho, torch.ones_like(rho))
    kink = torch.where(rho.abs() > 1e-12, -beta / safe_rho, lo)
    mid = torch.minimum(torch.maximum(kink, lo), hi)
    zn, wn = _gauss_legendre(nodes, alpha.dtype, alpha.device)
    total = torch.zeros_like(alpha)
    for a_, b_ in ((lo, mid), (mid, hi)):
        half = (b_ - a_)[..., None] / 2
        z = (a_ + b_)[..., None] / 2 + half * zn
        f = (alpha[..., None] + z) * _psi(beta[..., None] + rho[..., None] * z, s[..., None])
        f = f * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
        total = total + (half * wn * f).sum(-1)
    return total


def brfa_kernel(xa, xb, *, bias, a=1.0, tau=0.5, nodes=40):
    r"""Infinite-head BRFA kernel by quadrature (small inputs only; one 1-D integral per key pair).

    The score of key ``i`` is :math:`\alpha_i + r_i g_i` with
    :math:`\alpha_i = c\sqrt d\langle x_0,x_i\rangle`,
    so :math:`K = \frac1{NN'}\sum_{ij} r_i r'_j\, m(\alpha_i/r_i, \alpha'_j/r'_j, \rho_{ij})
    \langle\tilde x_i,\tilde x'_j\rangle`
    with :math:`r_i = \tau\|\tilde x_0\|\|\tilde x_i\|` and :func:`relu_moment` ``m``.
    """
    d = xa.shape[-1]
    ta, tb = augment(xa, a), augment(xb, a)
    qa, ka = ta[:, 0], ta[:, 1:]
    qb, kb = tb[:, 0], tb[:, 1:]
    ra = tau * qa.norm(dim=-1)[:, None] * ka.norm(dim=-1)
    rb = tau * qb.norm(dim=-1)[:, None] * kb.norm(dim=-1)
    al_a = bias * math.sqrt(d) * torch.einsum("nd,nid->ni", xa[:, 0], xa[:, 1:])
    al_b = bias * math.sqrt(d) * torch.einsum("nd,nid->ni", xb[:, 0], xb[:, 1:])
    G = torch.einsum("aie,bje->abij", ka, kb)
    U = qa @ qb.T
    R = ra[:, None, :, None] * rb[None, :, None, :]
    rho = tau**2 * U[:, :, None, None] * G / R
    m = relu_moment((al_a / ra)[:, None, :, None], (al_b / rb)[None, :, None, :], rho, nodes=nodes)
    return (R * m * G).sum(dim=(-1, -2)) / (ka.shape[1] * kb.shape[1])


# --------------------------------------------------------------------------------------
# spherical harmonics and targets
# --------------------------------------------------------------------------------------


def harmonic_dim(d, k):
    r"""Dimension of degree-``k`` spherical harmonics on :math:`\mathbb S^{d-1}`:
    :math:`\binom{k+d-1}{k} - \binom{k+d-3}{k-2}`."""
    if k < 0:
        return 0
    return math.comb(k + d - 1, k) - (math.comb(k + d - 3, k - 2) if k >= 2 else 0)


def gegenbauer(k, t, d):
    r"""Normalised Gegenbauer polynomial :math:`Q_k^{(d)}(t)` with :math:`Q_k(1) = 1`.

    Recurrence :math:`Q_{j+1} = \frac{(2j+d-2)\,t\,Q_j - j\,Q_{j-1}}{j+d-2}`, :math:`Q_0 = 1`,
    :math:`Q_1 = t`.
    For independent uniform :math:`x, y`:
    :math:`\mathbb E[Q_k Q_l(\langle x,y\rangle)] = \delta_{kl}/\dim_{d,k}`.
    """
    t = torch.as_tensor(t)
    q_prev, q = torch.ones_like(t), t.clone()
    if k == 0:
        return q_prev
    for j in range(1, k):
        q_prev, q = q, ((2 * j + d - 2) * t * q - j * q_prev) / (j + d - 2)
    return q


def gegenbauer_target(x, k):
    r"""Degree-``k`` pairwise target
    :math:`f_k = \frac1N\sum_i \sqrt{\dim_{d,k}}\,Q_k(\langle x_0, x_i\rangle)`.

    The pair term has unit variance and lives in the harmonic block of bidegree ``(k, k)``.
    ``x``: ``(n, N + 1, d)``; returns ``(n,)``.
    """
    d = x.shape[-1]
    t = torch.einsum("nd,nid->ni", x[:, 0], x[:, 1:])
    return math.sqrt(harmonic_dim(d, k)) * gegenbauer(k, t, d).mean(dim=1)


def random_bilinear(d, *, generator=None, device=None, dtype=torch.float64):
    r"""Random :math:`S` scaled so that the pair term :math:`\langle x_0, S x_i\rangle` has unit
    variance
    (:math:`\|S\|_F = d`)."""
    S = torch.randn(d, d, generator=generator, device=device, dtype=dtype)
    return S * (d / S.norm())


def bilinear_target(x, S):
    r""":math:`f = \frac1N\sum_i \langle x_0, S x_i\rangle`; returns ``(n,)``."""
    return torch.einsum("nd,de,nie->ni", x[:, 0], S, x[:, 1:]).mean(dim=1)


def max_over_keys_target(x):
    r"""Permutation-invariant target outside the RFA class:
    :math:`\max_i \sqrt d\langle x_0, x_i\rangle`."""
    d = x.shape[-1]
    return math.sqrt(d) * torch.einsum("nd,nid->ni", x[:, 0], x[:, 1:]).amax(dim=1)


def key_key_target(x):
    r"""Key-key interaction :math:`\frac1N\sum_{i\ne j}\sqrt d\,\langle x_i, x_j\rangle`
    (permutation invariant, outside the RFA class, variance :math:`2(N-1)/N`); ``(n,)``."""
    d, N = x.shape[-1], x.shape[1] - 1
    s = x[:, 1:].sum(dim=1)
    return math.sqrt(d) * ((s * s).sum(-1) - N) / N


def _max_over_keys_parts(d, N, grid):
    r"""Grid, density of :math:`t = \langle x_0, x_1\rangle`, :math:`h(t)`, Var max and the
    trapezoid rule (shared by the floor and its block decomposition)."""
    t = np.linspace(-1.0, 1.0, grid)
    p = np.ones_like(t) if d == 3 else np.power(np.clip(1 - t * t, 0, None), (d - 3) / 2)
    dt = t[1] - t[0]
    F = np.concatenate([[0.0], np.cumsum((p[1:] + p[:-1]) / 2) * dt])
    p, F = p / F[-1], F / F[-1]

    def integ(y):
        return float(np.sum((y[1:] + y[:-1]) / 2) * dt)

    dGN = N * F ** (N - 1) * p  # density of the max
    m1, m2 = integ(t * dGN), integ(t * t * dGN)
    # h(t) = t + int_t^1 (1 - F(u)^{N-1}) du
    tail = 1 - F ** (N - 1)
    cum = np.concatenate([[0.0], np.cumsum((tail[1:] + tail[:-1]) / 2) * dt])
    return t, p, t + (cum[-1] - cum), m2 - m1**2, integ


def max_over_keys_floor(d, N, grid=200001):
    r"""Relative :math:`L^2` distance from :func:`max_over_keys_target` to the RFA function class.

    With :math:`t_i = \langle x_0, x_i\rangle` i.i.d. (density :math:`\propto(1-t^2)^{(d-3)/2}`)
    the best approximation by :math:`\frac1N\sum_i F(x_0, x_i)` is the first-order (ANOVA)
    projection, so the floor is :math:`1 - N\,\mathrm{Var}\,h(t_1)/\mathrm{Var}\max_i t_i` with
    :math:`h(t) = \mathbb E[\max_i t_i \mid t_1 = t]`.  Computed on a 1-D grid.
    """
    t, p, h, var_max, integ = _max_over_keys_parts(d, N, grid)
    hm1, hm2 = integ(h * p), integ(h * h * p)
    return 1.0 - N * (hm2 - hm1**2) / var_max


def max_over_keys_block_variances(d, N, kmax, grid=200001):
    r"""Harmonic decomposition of the learnable part of :func:`max_over_keys_target`.

    The first-order projection is :math:`\sum_i h(t_i)` up to a constant; its pair term
    :math:`N\sqrt d\,h(\langle x_0, x\rangle)` lives in the blocks :math:`(k, k)` with variance
    :math:`N\dim_{d,k}\,c_k^2` (times :math:`d`), :math:`c_k = \mathbb E[h(t) Q_k(t)]`.
    Returns ``(v, floor, var_max)``: ``v[k]`` the fraction of :math:`\mathrm{Var} f_{\max}` in
    block :math:`(k, k)` for ``k <= kmax``, the floor (:func:`max_over_keys_floor`; the
    fractions of all ``k`` sum to ``1 - floor``), and :math:`\mathrm{Var}\max_i t_i`.
    Chapter 1, eq. ``ch1-max-floor``.
    """
    t, p, h, var_max, integ = _max_over_keys_parts(d, N, grid)
    tt = torch.tensor(t, dtype=torch.float64)
    v = np.zeros(kmax + 1)
    for k in range(1, kmax + 1):
        c = integ(h * gegenbauer(k, tt, d).numpy() * p)
        v[k] = N * harmonic_dim(d, k) * c * c / var_max
    hm1, hm2 = integ(h * p), integ(h * h * p)
    return v, 1.0 - N * (hm2 - hm1**2) / var_max, var_max


# --------------------------------------------------------------------------------------
# ridge regression along a lambda path
# --------------------------------------------------------------------------------------


def kernel_ridge_path(K_tr, y_tr, K_ev, lambdas):
    r"""Kernel ridge :math:`\alpha_\lambda = (K + \lambda n I)^{-1} y` for every :math:`\lambda`
    from one ``eigh``.

    ``K_tr``: ``(n, n)``; ``y_tr``: ``(n,)`` or ``(n, T)``; ``K_ev``: ``(m, n)``; ``lambdas``:
    ``(L,)``.
    Returns predictions ``K_ev @ alpha`` of shape ``(L, m, T)``.
    """
    y = y_tr[:, None] if y_tr.ndim == 1 else y_tr
    n = K_tr.shape[0]
    lam = torch.as_tensor(lambdas, dtype=K_tr.dtype, device=K_tr.device)
    e, U = torch.linalg.eigh(K_tr)
    coef = (U.T @ y)[None] * _inverse_shifted(e, lam * n)[:, :, None]  # (L, n, T)
    return torch.einsum("mk,lkt->lmt", K_ev @ U, coef)


def _inverse_shifted(e, shifts, rtol=1e-12):
    r""":math:`1/(e_k + s_l)` for every shift, shape ``(L, len(e))``.

    A zero shift gives the pseudo-inverse: eigenvalues below ``rtol`` times the largest (round-off
    of a numerically singular Gram matrix) are treated as zero, so :math:`\lambda = 0` is the
    minimum-norm interpolant, the ridgeless limit of the path.
    """
    e = e.clamp_min(0.0)
    cut = rtol * float(e.max()) if e.numel() else 0.0
    denom = e[None, :] + shifts[:, None]
    keep = denom > cut
    return torch.where(keep, 1.0 / torch.where(keep, denom, torch.ones_like(denom)),
                       torch.zeros_like(denom))


def center_kernel(K_tr, K_ev):
    r"""Centre a kernel on the training points: ridge with an unpenalised intercept.

    Kernel ridge on :math:`K^c = HKH` (:math:`H = I - \mathbf 1\mathbf 1^\top/n`) with labels
    :math:`y - \bar y`, predicting :math:`\bar y + K^c(x, X)\alpha`, is ridge regression on the
    features centred at their training mean plus a free intercept.  ``K_tr``: ``(n, n)``,
    ``K_ev``: ``(m, n)``; returns the centred pair.
    """
    col = K_tr.mean(dim=0)
    tot = col.mean()
    K_tr_c = K_tr - col[None, :] - col[:, None] + tot
    K_ev_c = K_ev - K_ev.mean(dim=1, keepdim=True) - col[None, :] + tot
    return K_tr_c, K_ev_c


def feature_ridge_path(Psi_tr, y_tr, Psi_ev, lambdas):
    r"""Ridge on explicit features, :math:`\min_u \frac1n\|\Psi u - y\|^2 + \lambda\|u\|^2`, for
    every :math:`\lambda`.

    Uses the primal form (``eigh`` of :math:`\Psi^\top\Psi`, size ``P``) when ``P < n`` and the
    kernel
    form :math:`K = \Psi\Psi^\top` otherwise; both give the same predictions.  Shapes as in
    :func:`kernel_ridge_path` with ``Psi_tr``: ``(n, P)``, ``Psi_ev``: ``(m, P)``.
    """
    n, P = Psi_tr.shape
    if P >= n:
        return kernel_ridge_path(Psi_tr @ Psi_tr.T, y_tr, Psi_ev @ Psi_tr.T, lambdas)
    y = y_tr[:, None] if y_tr.ndim == 1 else y_tr
    lam = torch.as_tensor(lambdas, dtype=Psi_tr.dtype, device=Psi_tr.device)
    e, Q = torch.linalg.eigh(Psi_tr.T @ Psi_tr)
    coef = (Q.T @ (Psi_tr.T @ y))[None] * _inverse_shifted(e, lam * n)[:, :, None]
    return torch.einsum("mk,lkt->lmt", Psi_ev @ Q, coef)


def ridge_direct(K_tr, y_tr, K_ev, lam):
    r"""Reference: one direct solve of :math:`(K + \lambda n I)\alpha = y`; returns ``K_ev @
    alpha``."""
    n = K_tr.shape[0]
    A = K_tr + lam * n * torch.eye(n, dtype=K_tr.dtype, device=K_tr.device)
    return K_ev @ torch.linalg.solve(A, y_tr)


def validated_risk(preds, y_val, y_test, target_var, n_val):
    r"""Choose :math:`\lambda` on validation data and report the test relative excess risk.

    ``preds``: ``(L, n_val + n_test, T)`` from a ridge path evaluated on validation then test
    points; ``y_val``: ``(n_val, T)``, ``y_test``: ``(n_test, T)`` noise-free target values;
    ``target_var``: ``(T,)`` population variances.  Returns ``(risk (T,), lambda index (T,))`` with
    risk :math:`= \|\hat f - f_\star\|^2/\mathrm{Var} f_\star` (1 = no better than the mean).
    The test set is never used to choose :math:`\lambda`.
    """
    val_mse = ((preds[:, :n_val] - y_val[None]) ** 2).mean(dim=1)  # (L, T)
    best = val_mse.argmin(dim=0)  # (T,)
    test_mse = ((preds[:, n_val:] - y_test[None]) ** 2).mean(dim=1)  # (L, T)
    risk = test_mse.gather(0, best[None])[0] / target_var
    return risk, best


# --------------------------------------------------------------------------------------
# theory helpers
# --------------------------------------------------------------------------------------


def rfa_complexity_bilinear(S, *, tau=0.5):
    r"""Norm bound :math:`B` of the pair term :math:`\langle x_0, S x_i\rangle` for RFA.

    The value function :math:`v(W) = \mu_1^{-1}\,\langle G, T\rangle\, e_D` with
    :math:`T = \tau^{-1}\,\mathrm{diag}(S, 0)` reproduces the pair term exactly (it enters through
    the degree-1 Hermite coefficient :math:`\mu_1 = 1/2` of ReLU and the constant coordinate of
    :math:`\tilde x_i`), with
    :math:`B = \mathbb E\|v\|^2 = \|S\|_F^2/(\mu_1^2\tau^2) = 16\|S\|_F^2`.
    """
    return float(S.norm() ** 2 / (0.25 * tau**2))


# --------------------------------------------------------------------------------------
# experiments (one sweep point each; used by Chapter 1)
# --------------------------------------------------------------------------------------


def _targets(x, names, S):
    cols = []
    for name in names:
        if name == "bilinear":
            cols.append(bilinear_target(x, S))
        elif name == "max":
            cols.append(max_over_keys_target(x))
        elif name == "keykey":
            cols.append(key_key_target(x))
        elif name.startswith("geg"):
            cols.append(gegenbauer_target(x, int(name[3:])))
        else:
            raise ValueError(f"unknown target {name!r}")
    return torch.stack(cols, dim=1)


def target_variances(names, d, N, S=None, *, generator=None, device=None):
    r"""Population variances of the targets, all exact: :math:`1/N` for ``bilinear`` and
    ``geg<k>`` (unit-variance pair terms, uncorrelated across keys), :math:`2(N-1)/N` for
    ``keykey`` and :math:`d\,\mathrm{Var}\max_i t_i` for ``max`` (one-dimensional integral,
    :func:`max_over_keys_block_variances`)."""
    out = []
    for name in names:
        if name == "max":
            out.append(d * max_over_keys_block_variances(d, N, 0)[2])
        elif name == "keykey":
            out.append(2.0 * (N - 1) / N)
        else:
            out.append(1.0 / N)
    return torch.tensor(out, dtype=torch.float64, device=device)


def _curves_from_kernel(K, y, var, n_list, n_val, lambdas, model, names):
    """Validated risks for every n from one kernel ``K`` (rows: train|val|test; cols: train)."""
    n_max = K.shape[1]
    rows = []
    for n in n_list:
        mean = y[:n].mean(dim=0)
        K_tr, K_ev = center_kernel(K[:n, :n], K[n_max:, :n])
        preds = kernel_ridge_path(K_tr, y[:n] - mean, K_ev, lambdas) + mean
        risk, best = validated_risk(preds, y[n_max:n_max + n_val], y[n_max + n_val:], var, n_val)
        for t, name in enumerate(names):
            rows.append({"model": model, "target": name, "n": int(n), "risk": float(risk[t]),
                         "lam": float(lambdas[int(best[t])])})
    return rows


def _data(d, N, n_max, n_val, n_test, seed, targets, device):
    """Sequences (train | validation | test), the bilinear matrix, target values and variances."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = sample_tokens(n_max + n_val + n_test, N, d, generator=g, device=device)
    S = random_bilinear(d, generator=g, device=device)
    y = _targets(x, targets, S)
    var = target_variances(targets, d, N, S, generator=g, device=device)
    return x, y, var, g


def kernel_curves_point(*, d, N, n_list, n_val, n_test, seed, lambdas,
                        targets=("bilinear", "max"), models=("RFA", "RFMLP"), device="cpu"):
    r"""Learning curves of the infinite-width RFA and RFMLP (closed-form kernels) for one seed.

    Returns rows ``{model, target, n, risk, lam}``; ``risk`` is the relative excess risk on
    ``n_test`` fresh sequences with :math:`\lambda` chosen on ``n_val`` validation sequences.
    The fit has an unpenalised intercept (:func:`center_kernel`), in this and the other
    ``*_point`` functions.
    """
    n_max = max(n_list)
    x, y, var, _ = _data(d, N, n_max, n_val, n_test, seed, targets, device)
    rows = []
    if "RFA" in models:
        K = torch.cat([rfa_kernel(x[:n_max]), rfa_kernel(x[n_max:], x[:n_max])], dim=0)
        rows += _curves_from_kernel(K, y, var, n_list, n_val, lambdas, "RFA", targets)
    if "RFMLP" in models:
        X = concat_tokens(x)
        Kmlp = rfmlp_kernel(X, X[:n_max], scale2=N + 2.0)
        rows += _curves_from_kernel(Kmlp, y, var, n_list, n_val, lambdas, "RFMLP", targets)
    return rows


def heads_sweep_point(*, d, N, n_list, n_val, n_test, seed, lambdas, heads_list,
                      targets=("bilinear",), device="cpu", chunk=256):
    r"""Validated risk of finite-head RFA at the largest ``n`` of ``n_list`` for every ``M``.

    Same data as :func:`kernel_curves_point` with the same arguments (so the infinite-head
    value of that function is the ``M -> infinity`` limit of these rows).  The head sets are
    nested: the first ``M`` heads of one stream of draws, so the finite-head kernel
    :math:`K_M = \frac1M\sum_{m\le M}\phi_{W_m}\phi_{W_m}^\top` is accumulated ``chunk``
    heads at a time and every ``M`` of ``heads_list`` costs no more than the largest alone.
    Returns rows ``{heads, target, n, risk, lam}``.
    """
    n_max = max(n_list)
    x, y, var, g = _data(d, N, n_max, n_val, n_test, seed, targets, device)
    W = sample_qk(max(heads_list), d, generator=g, device=device)  # one stream of draws
    K = torch.zeros(x.shape[0], n_max, dtype=x.dtype, device=x.device)
    rows, done = [], 0
    for M in sorted(heads_list):
        while done < M:
            m = min(chunk, M - done)
            F = rfa_features(x, W[done:done + m]).reshape(x.shape[0], -1)
            K += F @ F[:n_max].T
            done += m
        for r in _curves_from_kernel(K / M, y, var, [n_max], n_val, lambdas, "", targets):
            r.pop("model")
            rows.append({"heads": int(M), **r})
    return rows


def heads_curves_point(*, d, N, n_list, n_val, n_test, seed, lambdas, heads, biases,
                       targets=("geg1", "geg2", "geg3"), device="cpu"):
    """Learning curves of finite-head RFA (``bias = 0``) and BRFA (``bias = c > 0``) for one seed.

    The same data and the same Gaussian part of the query-key matrices are used for every
    ``bias`` (common random numbers), so differences between biases are not sampling noise.
    Returns rows ``{bias, heads, target, n, risk, lam}``.
    """
    n_max = max(n_list)
    x, y, var, g = _data(d, N, n_max, n_val, n_test, seed, targets, device)
    W0 = sample_qk(heads, d, generator=g, device=device)
    idx = torch.arange(d, device=device)
    rows = []
    for c in biases:
        W = W0.clone()
        W[:, idx, idx] += c * math.sqrt(d)
        Psi = design_matrix(rfa_features(x, W))
        K = Psi @ Psi[:n_max].T
        for r in _curves_from_kernel(K, y, var, n_list, n_val, lambdas, "", targets):
            r.pop("model")
            rows.append({"bias": float(c), "heads": int(heads), **r})
    return rows


def kernel_mc_point(*, d, N, sequences, heads, repeats, seed, device="cpu"):
    r"""Monte Carlo error of the finite-head kernel :math:`\Psi\Psi^\top` vs :func:`rfa_kernel`.

    For each ``M`` in ``heads`` draws ``repeats`` independent sets of ``M`` heads and returns the
    root-mean-square relative Frobenius error, with the exact CLT prediction
    :math:`\sqrt{v_1/M}`, where :math:`v_1 = \mathbb E\|\phi_W\phi_W^\top - K\|_F^2/\|K\|_F^2` is
    the one-head variance (estimated from ``max(20000, 2 max(heads))`` separate heads).
    """
    g = torch.Generator(device=device).manual_seed(seed)
    x = sample_tokens(sequences, N, d, generator=g, device=device)
    K = rfa_kernel(x, x)
    kn = K.norm()
    # one-head variance, in chunks of heads
    big, v1, done = max(20_000, 2 * max(heads)), 0.0, 0
    while done < big:
        m = min(20_000, big - done)
        phi = rfa_features(x, sample_qk(m, d, generator=g, device=device))  # (s, m, D)
        per = torch.einsum("ame,bme->mab", phi, phi)  # one-head kernels
        v1 += float(((per - K) ** 2).sum())
        done += m
    v1 /= big * float(kn**2)
    rows = []
    for M in heads:
        errs = []
        for _ in range(repeats):
            Psi = design_matrix(rfa_features(x, sample_qk(M, d, generator=g, device=device)))
            errs.append(float(((Psi @ Psi.T - K).norm() / kn) ** 2))
        rows.append({"heads": int(M), "rms_rel_err": math.sqrt(sum(errs) / repeats),
                     "theory": math.sqrt(v1 / M)})
    return rows


# --------------------------------------------------------------------------------------
# spectral theory of the learning curves
# --------------------------------------------------------------------------------------


def _sphere_coordinate_rule(d, nodes):
    """Gauss rule for :math:`\\mathbb E g(t)`, :math:`t` one coordinate of a uniform point of
    :math:`\\mathbb S^{d-1}` (density :math:`\\propto (1-t^2)^{(d-3)/2}`)."""
    from scipy.special import roots_jacobi

    a = (d - 3) / 2
    t, w = roots_jacobi(nodes, a, a)
    return t, w / w.sum()


def rfa_pair_spectrum(d, lmax, *, nodes=200):
    r"""Eigenvalues :math:`\lambda_{l,l'}` of the RFA pair kernel on the product of two spheres.

    :math:`k(u, w) = (1+w)\,\kappa_1\big((1+u)(1+w)/4\big)` with :math:`u = \langle x_0, x_0'\rangle`,
    :math:`w = \langle x, x'\rangle`; by Funk-Hecke in each factor
    :math:`\lambda_{l,l'} = \mathbb E[k(u,w)\,Q_l(u)\,Q_{l'}(w)]` (independent :math:`u, w`), with
    multiplicity :math:`\dim_{d,l}\dim_{d,l'}`. Returns a ``(lmax + 1, lmax + 1)`` array.
    """
    t, w = _sphere_coordinate_rule(d, nodes)
    tt = torch.tensor(t, dtype=torch.float64)
    U, Wv = torch.meshgrid(tt, tt, indexing="ij")
    k = ((1 + Wv) * kappa1((1 + U) * (1 + Wv) / 4)).numpy()
    Q = np.stack([gegenbauer(q, tt, d).numpy() for q in range(lmax + 1)])  # (l, nodes)
    return (Q * w) @ k @ (Q * w).T


def set_kernel_spectrum(d, N, lmax, *, nodes=200):
    r"""Spectrum of the infinite-head RFA kernel (Chapter 1, eq. ``ch1-kernel``) for ``N`` keys.

    Query-only blocks :math:`(l, 0)` keep the eigenvalue :math:`\lambda_{l,0}`; blocks with
    :math:`l' \ge 1` are divided by :math:`N` (mean embedding; exercise ``ex-ch1-meanembed``).
    Returns ``(eig, mult, trace)``: arrays over the blocks :math:`(l, l')`, ``l, l' <= lmax``,
    and the total trace :math:`\mathbb E K(x, x)` (for the eigenvalues beyond ``lmax``).
    """
    lam = rfa_pair_spectrum(d, lmax, nodes=nodes)
    eig = lam.copy()
    eig[:, 1:] /= N
    dims = np.array([harmonic_dim(d, q) for q in range(lmax + 1)], dtype=float)
    mult = dims[:, None] * dims[None, :]
    t, w = _sphere_coordinate_rule(d, nodes)
    tt = torch.tensor(t, dtype=torch.float64)
    diag_pair = float(np.sum(w * ((1 + tt) * kappa1((1 + tt) / 2)).numpy()))  # i != j terms
    trace = (1 - 1 / N) * diag_pair + 1 / N * float(2 * kappa1(torch.tensor(1.0)))
    return eig, mult, trace


def eigenlearning_risk(eig, mult, target_var, n, ridge, trace=None):
    r"""Predicted relative test risk of kernel ridge regression (noise-free labels).

    The omniscient-risk estimate of the "eigenlearning" theory: the effective regularisation
    :math:`\kappa` solves :math:`\sum_i m_i\frac{\lambda_i}{\lambda_i+\kappa} + \frac{t}{\kappa}
    + \frac{\delta}{\kappa} = n` with :math:`\delta = \lambda n` (ridge of eq. ``ch1-ridge``) and
    :math:`t` the trace not covered by the listed eigenvalues; the risk is
    :math:`\frac{n}{n - \sum_i m_i L_i^2}\sum_i (1 - L_i)^2 v_i / \sum_i v_i`,
    :math:`L_i = \lambda_i/(\lambda_i + \kappa)`, with ``target_var`` :math:`v_i` the target's
    variance in block ``i``. Arrays ``eig``, ``mult``, ``target_var`` have a common shape.
    """
    eig, mult, tv = (np.asarray(a, dtype=float).ravel() for a in (eig, mult, target_var))
    tail = 0.0 if trace is None else max(trace - float(np.sum(eig * mult)), 0.0)
    delta = ridge * n

    def lhs(kappa):
        return np.sum(mult * eig / (eig + kappa)) + (tail + delta) / kappa - n

    lo, hi = 1e-300, 1e300
    for _ in range(400):  # bisection in log space; lhs is decreasing in kappa
        mid = math.sqrt(lo * hi)
        if lhs(mid) > 0:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-12:
            break
    kappa = math.sqrt(lo * hi)
    L = eig / (eig + kappa)
    e0 = n / max(n - float(np.sum(mult * L**2)), 1e-300)
    return e0 * float(np.sum((1 - L) ** 2 * tv)) / float(np.sum(tv))


def cumulative_rank(eig, mult):
    r"""Sample-size thresholds of the blocks of a spectrum: for every block, the number of
    eigenvalues (with multiplicity) at least as large as its own.

    Kernel ridge regression with :math:`n` samples resolves roughly the :math:`n` largest
    eigenvalues, so block :math:`i` is learned once :math:`n` passes this cumulative rank --
    the eigenvalues above it included, not its own dimension alone.  Arrays of any common shape;
    returns an array of that shape.
    """
    e, m = np.asarray(eig, dtype=float), np.asarray(mult, dtype=float)
    flat_e, flat_m = e.ravel(), m.ravel()
    out = np.array([flat_m[flat_e >= v * (1 - 1e-12)].sum() for v in flat_e])
    return out.reshape(e.shape)


def dot_kernel_spectrum(L, qmax, *, nodes=400):
    r"""Eigenvalues :math:`\mu_q = \mathbb E[\kappa_1(t) Q_q(t)]` of the RFMLP kernel, treating the
    normalised concatenation :math:`X/\|X\|` as uniform on :math:`\mathbb S^{L-1}` (an
    approximation). Returns ``(eig, mult, trace)`` with multiplicities :math:`\dim_{L,q}`."""
    t, w = _sphere_coordinate_rule(L, nodes)
    tt = torch.tensor(t, dtype=torch.float64)
    k = kappa1(tt).numpy()
    eig = np.array([float(np.sum(w * k * gegenbauer(q, tt, L).numpy())) for q in range(qmax + 1)])
    mult = np.array([harmonic_dim(L, q) for q in range(qmax + 1)], dtype=float)
    return eig, mult, 0.5


def eigenlearning_risk_min(eig, mult, target_var, n, lambdas, trace=None):
    r"""Smallest :func:`eigenlearning_risk` over a ridge grid (what validation approximates).

    The effective regularisations of all ridges are found together by a vectorised bisection in
    :math:`\log\kappa`; the result equals ``min(eigenlearning_risk(..., lam, ...) for lam in
    lambdas)``.
    """
    eig, mult, tv = (np.asarray(a, dtype=float).ravel() for a in (eig, mult, target_var))
    tail = 0.0 if trace is None else max(trace - float(np.sum(eig * mult)), 0.0)
    delta = np.asarray(lambdas, dtype=float) * n
    lo, hi = np.full(delta.shape, -700.0), np.full(delta.shape, 700.0)  # log kappa
    for _ in range(64):
        mid = (lo + hi) / 2
        kappa = np.exp(mid)
        lhs = (mult * eig / (eig + kappa[:, None])).sum(1) + (tail + delta) / kappa - n
        lo, hi = np.where(lhs > 0, mid, lo), np.where(lhs > 0, hi, mid)
    kappa = np.exp((lo + hi) / 2)
    L = eig / (eig + kappa[:, None])
    e0 = n / np.maximum(n - (mult * L**2).sum(1), 1e-300)
    return float(np.min(e0 * ((1 - L) ** 2 * tv).sum(1)) / np.sum(tv))


def eigenlearning_samples_to_risk(eig, mult, target_var, level, lambdas, trace=None,
                                  n_lo=1.0, n_hi=1e7):
    r"""Sample size at which the eigenlearning risk (best ridge of ``lambdas``) reaches ``level``.

    Bisection in :math:`\log n` on :func:`eigenlearning_risk_min` (the risk at the best ridge
    is non-increasing in :math:`n`).  Returns ``nan`` when the level is not reached below
    ``n_hi``.
    """
    def risk(n):
        return eigenlearning_risk_min(eig, mult, target_var, n, lambdas, trace)

    if risk(n_hi) > level:
        return float("nan")
    lo, hi = n_lo, n_hi
    while hi / lo > 1 + 1e-4:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if risk(mid) > level else (lo, mid)
    return math.sqrt(lo * hi)


def level_crossing_n(ns, risks, level):
    r"""Sample size where a measured learning curve first drops below ``level``, by log-log
    interpolation between the two grid points around it; ``nan`` if it never does, or
    already does at the first point."""
    ns, risks = np.asarray(ns, float), np.asarray(risks, float)
    below = np.nonzero(risks < level)[0]
    if len(below) == 0 or below[0] == 0:
        return float("nan")
    j = below[0]
    a = (np.log(level) - np.log(risks[j - 1])) / (np.log(risks[j]) - np.log(risks[j - 1]))
    return float(np.exp(np.log(ns[j - 1]) + a * (np.log(ns[j]) - np.log(ns[j - 1]))))


def finite_head_spectrum(W, d, N, targets, *, n_cov, n_proj, generator, device="cpu",
                         chunk=2000):
    r"""Spectrum of the :math:`M`-head kernel operator and the targets' variance along it.

    The finite-head kernel :math:`K_M(x, x') = \langle\psi(x), \psi(x')\rangle`,
    :math:`\psi = \Phi/\sqrt M` (heads ``W``, shape ``(M, D, D)``, RFA or BRFA), has the same
    non-zero eigenvalues as the feature covariance :math:`\Sigma = \mathrm{Cov}\,\psi` (centred:
    the fits have an unpenalised intercept), and eigenfunctions
    :math:`q_i^\top(\psi - \E\psi)/\sqrt{\lambda_i}`.  Three independent samples are used, so
    that no estimate is fitted to its own noise:

    * the eigenvectors :math:`q_i` of the sample covariance of ``n_cov`` sequences;
    * the variance along each of them, :math:`\lambda_i = q_i^\top\Sigma q_i`, re-measured on
      ``n_cov`` fresh sequences (an unbiased value for a fixed direction, which removes the
      spreading of sample eigenvalues that would otherwise inflate :math:`1/\lambda_i`);
    * :math:`b = \mathrm{Cov}(\psi, f)` from two independent halves of ``n_proj`` sequences,
      giving the unbiased :math:`(q_i^\top b)^2 \approx (q_i^\top b_A)(q_i^\top b_B)` and the
      target's variance :math:`v_i = (q_i^\top b)^2/\lambda_i` along eigenfunction :math:`i`.

    The variance no eigenfunction reaches is :math:`\mathrm{Var} f - \sum_i v_i` (exact
    :math:`\mathrm{Var} f`).  Returns ``(eig (P,), v (T, P), outside (T,), var (T,))``, ``eig``
    in decreasing order, for the ``T`` named targets (:func:`target_variances` names); feed them
    to :func:`eigenlearning_risk` with the outside part as an eigenvalue-0 component.  Used for
    the theory of the BRFA learning curves (Chapter 1).
    """
    M = W.shape[0]
    P = M * W.shape[1]
    var = target_variances(targets, d, N, device=device)

    def batches(total):
        done = 0
        while done < total:
            m = min(chunk, total - done)
            x = sample_tokens(m, N, d, generator=generator, device=device)
            yield design_matrix(rfa_features(x, W)), _targets(x, targets, None)
            done += m

    s1 = torch.zeros(P, dtype=torch.float64, device=device)
    s2 = torch.zeros(P, P, dtype=torch.float64, device=device)
    for Psi, _ in batches(n_cov):
        s1 += Psi.sum(0)
        s2 += Psi.T @ Psi
    mean = s1 / n_cov
    Q = torch.linalg.eigh(s2 / n_cov - torch.outer(mean, mean))[1]
    z1 = torch.zeros(P, dtype=torch.float64, device=device)
    z2 = torch.zeros(P, dtype=torch.float64, device=device)
    for Psi, _ in batches(n_cov):
        z = Psi @ Q
        z1 += z.sum(0)
        z2 += (z * z).sum(0)
    eig = (z2 / n_cov - (z1 / n_cov) ** 2).clamp_min(0.0)
    proj = []
    n_half = n_proj // 2
    for _half in range(2):
        b = torch.zeros(P, len(targets), dtype=torch.float64, device=device)
        ysum = torch.zeros(len(targets), dtype=torch.float64, device=device)
        psum = torch.zeros(P, dtype=torch.float64, device=device)
        for Psi, y in batches(n_half):
            b += Psi.T @ y
            ysum += y.sum(0)
            psum += Psi.sum(0)
        proj.append(Q.T @ (b / n_half - torch.outer(psum / n_half, ysum / n_half)))  # (P, T)
    order = torch.argsort(eig, descending=True)
    eig = eig[order]
    keep = eig > 1e-12 * eig[0]
    v = (proj[0] * proj[1])[order] / torch.where(keep, eig, 1.0)[:, None]
    v = torch.where(keep[:, None], v, 0.0)
    outside = (var - v.sum(0)).clamp_min(0.0)
    return eig.cpu().numpy(), v.T.cpu().numpy(), outside.cpu().numpy(), var.cpu().numpy()
