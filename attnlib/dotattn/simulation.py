"""Finite-d simulation of Chapter 3: batched full-batch gradient descent on the tied attention student."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import check_choice, check_float, check_int
from .model import _DT, A_STANDARD

INITS = ("semantic", "positional", "random")


@dataclass(frozen=True)
class SimConfig:
    """Sizes and hyper-parameters of the finite-d experiments (one figure's worth)."""

    d: int = 200                # token dimension
    n_seeds: int = 2            # independent (teacher, train set, test set) draws per point
    steps: int = 2000           # full-batch GD steps (loss summed over samples)
    lr: float = 0.15            # GD step size (Adam: 0.01)
    lam: float = 0.01           # ridge lambda (weight decay)
    sigma: float = 0.5          # token standard deviation
    n_test: int = 4000          # fresh test sequences per seed
    optimizer: str = "gd"       # "gd" or "adam"
    rank: int = 1               # student rank r
    A: tuple = A_STANDARD       # positional matrix of the target

    def __post_init__(self):
        check_int("d", self.d, minimum=2)
        check_int("n_seeds", self.n_seeds, minimum=1)
        check_int("steps", self.steps, minimum=1)
        check_float("lr", self.lr, minimum=0.0, strict=True)
        check_float("lam", self.lam, minimum=0.0)
        check_float("sigma", self.sigma, minimum=0.0, strict=True)
        check_int("n_test", self.n_test, minimum=1)
        check_choice("optimizer", self.optimizer, ("gd", "adam"))
        check_int("rank", self.rank, minimum=1)


def draw_problem(n: int, d: int, n_seeds: int, sigma: float, gen: torch.Generator,
                 device, dtype=_DT):
    """Raw tokens ``Z`` of shape (S, n, 2, d), student inputs ``X = Z + P`` and teacher ``Q*`` (S, d).

    ``Q*`` has i.i.d. Gaussian direction and exact norm ``||Q*||^2 = d`` (removes the seed-to-seed
    fluctuation of the teacher's sharpness). ``P`` has rows ``p_1 = -p_2 = 1_d/sqrt(d)``.
    """
    qs = torch.randn(n_seeds, d, generator=gen, device=device, dtype=dtype)
    qs = qs * math.sqrt(d) / qs.norm(dim=1, keepdim=True)
    Z = sigma * torch.randn(n_seeds, n, 2, d, generator=gen, device=device, dtype=dtype)
    P = torch.ones(2, d, device=device, dtype=dtype) / math.sqrt(d)
    P[1] = -P[1]
    return Z, Z + P, qs


def _grams(Z, X, Qstar, omegas, A, d):
    """Per-sequence 2x2 statistics: G = XX^T/d, K = XZ^T/d, Zg = ZZ^T/d and the teacher T.

    Shapes: G, K, Zg (S, n, 2, 2); T (S, W, n, 2, 2) for the W omegas.
    """
    G = X @ X.transpose(-1, -2) / d
    K = X @ Z.transpose(-1, -2) / d
    Zg = Z @ Z.transpose(-1, -2) / d
    hs = torch.einsum("snld,sd->snl", Z, Qstar) / math.sqrt(d)
    Ss = torch.softmax(hs[..., :, None] * hs[..., None, :], dim=-1)
    Am = torch.as_tensor(A, dtype=Z.dtype, device=Z.device)
    om = omegas[None, :, None, None, None]
    T = (1 - om) * Ss[:, None] + om * Am
    return G, K, Zg, T


def _attention_loss_terms(Q, X, G, K, Zg, T, d):
    """Per-sequence squared error ||y - f||^2/(2d), exact at finite d through 2x2 Gram matrices.

    ``f = S X`` with ``S = softmax(h h^T)``, ``h = X Q/sqrt(d)``; ``y = T Z``:
    ``||f||^2/d = Tr(S G S^T)``, ``<f, y>/d = Tr(S K T^T)``, ``||y||^2/d = Tr(T Zg T^T)``.
    Q: (S, W, I, d, r); returns (S, W, I, n).
    """
    h = torch.einsum("snld,swidr->swinlr", X, Q) / math.sqrt(d)
    S = torch.softmax(h @ h.transpose(-1, -2), dim=-1)
    ff = torch.einsum("swinab,snbc,swinac->swin", S, G, S)
    fy = torch.einsum("swinab,snbc,swnac->swin", S, K, T)
    yy = torch.einsum("swnab,snbc,swnac->swn", T, Zg, T)
    return 0.5 * (ff - 2 * fy + yy[:, :, None])


def fit_linear_baseline(Zg, T):
    """Least-squares positional mixer on raw tokens: ``B = (sum_mu T Zg)(sum_mu Zg)^{-1}``.

    Zg: (S, n, 2, 2), T: (S, W, n, 2, 2); returns B of shape (S, W, 2, 2).
    """
    num = torch.einsum("swnab,snbc->swac", T, Zg)
    den = Zg.sum(1)
    return num @ torch.linalg.inv(den)[:, None]


def _init_Q(init, Qstar, n_omega, rank, gen, dtype):
    S, d = Qstar.shape
    if init == "semantic":
        Q = Qstar[:, None, :, None].expand(S, n_omega, d, 1).clone()
    elif init == "positional":
        Q = torch.ones(S, n_omega, d, 1, dtype=dtype, device=Qstar.device) / math.sqrt(d)
    else:
        Q = 0.1 * torch.randn(S, n_omega, d, rank, generator=gen, device=Qstar.device, dtype=dtype)
        return Q
    if rank > 1:  # informed inits fill the first column; the others start at zero
        Q = torch.cat([Q, torch.zeros(S, n_omega, d, rank - 1, dtype=dtype, device=Q.device)], -1)
    return Q


def train_attention(alphas, omegas, config: SimConfig, inits=("semantic", "positional"),
                    seed: int = 0, device="cpu", dtype=_DT) -> list:
    """Train the tied attention student on the mixed target, batched over alphas, seeds, omegas, inits.

    For every (alpha, seed) one teacher, one training set (``n = round(alpha d)`` sequences, padded
    to the largest n with zero-weight rows) and one test set are drawn; every omega in ``omegas``
    and every initialisation in ``inits`` is trained on that same data (paired design). Full-batch
    GD on the summed loss

    .. math:: \\mathcal L(Q)=\\sum_\\mu \\lVert y^\\mu-f_Q(X^\\mu)\\rVert^2/(2d)
              +\\tfrac\\lambda2\\lVert Q\\rVert^2

    with step ``config.lr`` (or Adam), all problems in one tensor of shape
    ``(len(alphas) * n_seeds, len(omegas), len(inits), d, rank)``. The linear positional baseline
    is fitted in closed form on the same training data.

    Returns a list of row dicts: ``alpha, seed, omega, init, eps_t`` (= L/d), ``eps_g, eps_g_lin,
    m`` (|1^T Q|/d), ``theta_over_s2`` (|Q*^T Q|/d), ``m_over_s2, q, grad_norm``.
    """
    cfg = config
    alist = [check_float("alpha", float(a), minimum=0.0, strict=True)
             for a in np.atleast_1d(np.asarray(alphas, dtype=float))]
    for i in inits:
        check_choice("init", i, INITS)
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    d = cfg.d
    ns = [max(1, round(a * d)) for a in alist]
    n = max(ns)
    S = len(alist) * cfg.n_seeds
    mask = torch.zeros(S, n, dtype=dtype, device=device)
    for k, nk in enumerate(ns):
        mask[k * cfg.n_seeds:(k + 1) * cfg.n_seeds, :nk] = 1.0
    om = torch.as_tensor(np.atleast_1d(np.asarray(omegas, dtype=float)), dtype=dtype, device=device)
    W, I = om.shape[0], len(inits)
    Z, X, Qstar = draw_problem(n, d, S, cfg.sigma, gen, device, dtype)
    G, K, Zg, T = _grams(Z, X, Qstar, om, cfg.A, d)
    B = fit_linear_baseline(Zg * mask[:, :, None, None], T)
    Q = torch.stack([_init_Q(i, Qstar, W, cfg.rank, gen, dtype) for i in inits], dim=2)
    Q.requires_grad_(True)
    lam = cfg.lam

    def total_loss(Q):
        per = (_attention_loss_terms(Q, X, G, K, Zg, T, d) * mask[:, None, None]).sum(-1)
        return per + 0.5 * lam * (Q * Q).sum((-1, -2))  # (S, W, I)

    if cfg.optimizer == "adam":
        mom = torch.zeros_like(Q)
        vel = torch.zeros_like(Q)
        b1, b2, eps = 0.9, 0.999, 1e-8
    for t in range(1, cfg.steps + 1):
        loss = total_loss(Q)
        (grad,) = torch.autograd.grad(loss.sum(), Q)
        with torch.no_grad():
            if cfg.optimizer == "gd":
                Q -= cfg.lr * grad
            else:
                mom.mul_(b1).add_((1 - b1) * grad)
                vel.mul_(b2).add_((1 - b2) * grad * grad)
                mh = mom / (1 - b1**t)
                vh = vel / (1 - b2**t)
                Q -= cfg.lr * mh / (vh.sqrt() + eps)
    Q = Q.detach()
    with torch.no_grad():
        loss = total_loss(Q)
    Qg = Q.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(total_loss(Qg).sum(), Qg)
    # test error on fresh sequences, in chunks
    eg = torch.zeros(S, W, I, dtype=dtype, device=device)
    eg_lin = torch.zeros(S, W, dtype=dtype, device=device)
    chunk = max(16, min(cfg.n_test, 20_000_000 // (2 * d * S)))  # <= ~160 MB of tokens
    done = 0
    while done < cfg.n_test:
        nb = min(chunk, cfg.n_test - done)
        Zt = cfg.sigma * torch.randn(S, nb, 2, d, generator=gen, device=device, dtype=dtype)
        P = torch.ones(2, d, device=device, dtype=dtype) / math.sqrt(d)
        P[1] = -P[1]
        Xt = Zt + P
        Gt, Kt, Zgt, Tt = _grams(Zt, Xt, Qstar, om, cfg.A, d)
        eg += _attention_loss_terms(Q, Xt, Gt, Kt, Zgt, Tt, d).sum(-1)
        R = Tt - B[:, :, None]
        eg_lin += 0.5 * torch.einsum("swnab,snbc,swnac->sw", R, Zgt, R)
        done += nb
    eg /= cfg.n_test
    eg_lin /= cfg.n_test
    ones = torch.ones(d, dtype=dtype, device=device)
    mvec = torch.einsum("d,swidr->swir", ones, Q) / d
    tvec = torch.einsum("sd,swidr->swir", Qstar, Q) / d
    m = mvec.norm(dim=-1)
    th = tvec.norm(dim=-1)
    qq = cfg.sigma**2 * (Q * Q).sum((-1, -2)) / d
    gn = grad.norm(dim=(-1, -2))
    rows = []
    for s in range(S):
        for w in range(W):
            for i, init in enumerate(inits):
                rows.append({
                    "alpha": alist[s // cfg.n_seeds], "seed": int(s % cfg.n_seeds),
                    "omega": float(om[w]), "init": init, "d": int(d), "n": ns[s // cfg.n_seeds],
                    "eps_t": float(loss[s, w, i]) / d,
                    "eps_g": float(eg[s, w, i]), "eps_g_lin": float(eg_lin[s, w]),
                    "m": float(m[s, w, i]), "m_over_s2": float(m[s, w, i]) / cfg.sigma**2,
                    "theta_over_s2": float(th[s, w, i]), "q": float(qq[s, w, i]),
                    "grad_norm": float(gn[s, w, i]),
                })
    return rows


