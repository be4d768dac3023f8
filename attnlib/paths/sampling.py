"""Posterior sampling of the path network's weights with attention frozen (Chapter 4).

:func:`hmc` is a multi-chain Hamiltonian Monte Carlo sampler with step-size and diagonal-metric
adaptation; :class:`PathPosterior` is the Gibbs posterior it samples.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from .kernels import path_kernels, predict, scaled_features
from .model import DTYPE, path_forward, path_overlap


@dataclass
class HMCResult:
    """Samples ``(n_samples, chains, dim)`` and diagnostics of :func:`hmc`."""

    samples: torch.Tensor
    step_size: torch.Tensor  # (chains,)
    accept_rate: float
    divergences: int
    rhat_max: float
    ess_min: float
    seconds: float


def _rhat(x: np.ndarray) -> np.ndarray:
    """Split-chain potential scale reduction ``(n, chains, dim) -> (dim,)``."""
    n = x.shape[0] // 2
    c = np.concatenate([x[:n], x[n : 2 * n]], axis=1)  # (n, 2 chains, dim)
    W = c.var(0, ddof=1).mean(0)
    B = n * c.mean(0).var(0, ddof=1)
    var = (n - 1) / n * W + B / n
    return np.sqrt(var / np.maximum(W, 1e-300))


def _ess(x: np.ndarray, max_lag: int = 50) -> np.ndarray:
    """Crude effective sample size per dimension (initial positive autocorrelation sum)."""
    n, m, d = x.shape
    xc = x - x.mean(0, keepdims=True)
    var = (xc**2).mean(0).mean(0) + 1e-300
    rho_sum = np.zeros(d)
    alive = np.ones(d, bool)
    for lag in range(1, min(max_lag, n - 1)):
        rho = (xc[lag:] * xc[:-lag]).mean(0).mean(0) / var
        alive &= rho > 0
        rho_sum += np.where(alive, rho, 0.0)
    return n * m / (1.0 + 2.0 * rho_sum)


def hmc(
    log_prob,
    init: torch.Tensor,
    n_warmup: int,
    n_samples: int,
    n_leapfrog: int = 30,
    target_accept: float = 0.8,
    step_size: float = 1e-2,
    generator: torch.Generator | None = None,
    adapt_mass: bool = True,
    progress=None,
    stat_fn=None,
) -> HMCResult:
    """Hamiltonian Monte Carlo on several independent chains at once.

    ``log_prob(z)`` maps (chains, dim) to (chains,). Warm-up adapts a per-chain step size by dual
    averaging (target acceptance ``target_accept``) and, if ``adapt_mass``, a diagonal mass matrix
    from the second half of the warm-up. Divergences: energy error > 1000. Diagnostics (split
    R-hat, a crude effective sample size) are computed on ``stat_fn(samples)`` (n, chains, k)
    if given, else on the raw coordinates.
    """
    t0 = time.perf_counter()
    z = init.clone().to(DTYPE)
    C, d = z.shape
    dev = z.device
    inv_mass = torch.ones(C, d, dtype=DTYPE, device=dev)
    gamma, t0_da, kappa = 0.05, 10.0, 0.75
    # warm-up windows: [0, w1) step size only; [w1, w2) also collect draws for the metric;
    # at w2 set the diagonal metric and restart dual averaging; [w2, n_warmup) step size again.
    w1, w2 = int(0.3 * n_warmup), int(0.75 * n_warmup)

    def da_reset(eps0):
        return {
            "mu": torch.log(10 * eps0),
            "h": torch.zeros(C, dtype=DTYPE, device=dev),
            "lbar": torch.log(eps0),
            "m": 0,
        }

    eps = torch.full((C,), step_size, dtype=DTYPE, device=dev)
    da = da_reset(eps)

    def lp_grad(q):
        q = q.detach().requires_grad_(True)
        lp = log_prob(q)
        (g,) = torch.autograd.grad(lp.sum(), q)
        return lp.detach(), g.detach()

    lp, g = lp_grad(z)
    samples, acc_sum, n_div = [], 0.0, 0
    store = []
    for it in range(n_warmup + n_samples):
        p = torch.randn(C, d, generator=generator, dtype=DTYPE, device=dev) / torch.sqrt(inv_mass)
        H0 = -lp + 0.5 * (p * p * inv_mass).sum(1)
        q, pq, gq, lpq = z, p + 0.5 * eps[:, None] * g, g, lp
        for k in range(n_leapfrog):
            q = q + eps[:, None] * inv_mass * pq
            lpq, gq = lp_grad(q)
            if k < n_leapfrog - 1:
                pq = pq + eps[:, None] * gq
        pq = pq + 0.5 * eps[:, None] * gq
        H1 = -lpq + 0.5 * (pq * pq * inv_mass).sum(1)
        dH = H1 - H0
        dH = torch.where(torch.isfinite(dH), dH, torch.full_like(dH, 1e10))
        acc = torch.exp(torch.clamp(-dH, max=0.0))
        accept = torch.rand(C, generator=generator, dtype=DTYPE, device=dev) < acc
        z = torch.where(accept[:, None], q.detach(), z)
        lp = torch.where(accept, lpq, lp)
        g = torch.where(accept[:, None], gq, g)
        if it < n_warmup:
            da["m"] += 1
            m = da["m"]
            da["h"] = (1 - 1 / (m + t0_da)) * da["h"] + (target_accept - acc) / (m + t0_da)
            log_eps = da["mu"] - math.sqrt(m) / gamma * da["h"]
            eta = m ** (-kappa)
            da["lbar"] = eta * log_eps + (1 - eta) * da["lbar"]
            eps = torch.exp(log_eps)
            if adapt_mass and w1 <= it < w2:
                store.append(z.clone())
            if adapt_mass and it == w2 - 1 and len(store) > 5:
                w = torch.stack(store)
                n_w = w.shape[0]
                inv_mass = (n_w / (n_w + 5.0)) * w.var(0) + 1e-3 * (5.0 / (n_w + 5.0))
                inv_mass = inv_mass / inv_mass.mean(1, keepdim=True)  # keep the scale with eps
                eps = torch.exp(da["lbar"])
                da = da_reset(eps)
            if it == n_warmup - 1:
                eps = torch.exp(da["lbar"])
        else:
            acc_sum += float(acc.mean())
            n_div += int((dH > 1000).sum())
            samples.append(z.clone())
        if progress is not None:
            progress(it)
    S = torch.stack(samples)
    Sn = (S if stat_fn is None else stat_fn(S)).detach().cpu().numpy()
    return HMCResult(
        samples=S,
        step_size=eps,
        accept_rate=acc_sum / max(n_samples, 1),
        divergences=n_div,
        rhat_max=float(np.nanmax(_rhat(Sn))) if n_samples >= 4 else float("nan"),
        ess_min=float(np.nanmin(_ess(Sn))),
        seconds=time.perf_counter() - t0,
    )


class PathPosterior:
    """Gibbs posterior of the path network's trained weights, with attention frozen.

    .. math:: \\ln p(\\Theta|D) = -\\frac{1}{2T}\\sum_\\mu (f(x^\\mu)-y^\\mu)^2
              - \\sum_W \\frac{\\|W\\|^2}{2\\sigma_W^2} + \\text{const}

    ``collapsed=False`` samples every trained weight; the output is evaluated through the path
    expansion (:func:`path_forward`), which equals the forward pass. ``collapsed=True`` integrates
    the input projection ``V0`` out exactly (it enters linearly with a Gaussian prior), leaving

    .. math:: \\ln p(V^{(1..L)}, a|D) = -\\tfrac12 Y^\\top(K_U+T)^{-1}Y - \\tfrac12\\ln\\det(K_U+T)
              - \\sum_W \\frac{\\|W\\|^2}{2\\sigma_W^2},\\qquad U = w w^\\top/N_1,

    which is exact and much less stiff; predictions then average the conditional GP mean over
    samples (a Rao-Blackwellised estimate of the posterior-mean predictor).
    Parameters are flattened to one vector per chain.
    """

    def __init__(
        self,
        xi: torch.Tensor,
        Y: torch.Tensor,
        heads,
        widths,
        T: float,
        variances=None,
        collapsed: bool = True,
    ):
        self.xi = xi.to(DTYPE)
        self.Y = Y.to(DTYPE).to(xi.device)
        self.heads, self.widths, self.T = list(heads), list(widths), float(T)
        self.collapsed = collapsed
        L = len(heads)
        self.variances = [1.0] * (L + 2) if variances is None else list(variances)
        n0 = xi.shape[-1]
        shapes = [(widths[0], n0)] + [(heads[l], widths[l + 1], widths[l]) for l in range(L)] + [(widths[L],)]
        var = list(self.variances)
        if collapsed:
            shapes, var = shapes[1:], var[1:]
        self.shapes = shapes
        self.numels = [int(np.prod(s)) for s in self.shapes]
        self.dim = sum(self.numels)
        self.var_vec = torch.cat(
            [torch.full((n,), v, dtype=DTYPE) for n, v in zip(self.numels, var, strict=True)]
        ).to(xi.device)
        self.xt = scaled_features(self.xi, self.variances[0])
        P, n_paths = self.xt.shape[:2]
        self.C = path_kernels(self.xt, self.xt).reshape(n_paths * n_paths, P * P)

    def unflatten(self, z: torch.Tensor) -> dict:
        parts = torch.split(z, self.numels, dim=-1)
        lead = z.shape[:-1]
        parts = [p.reshape(*lead, *s) for p, s in zip(parts, self.shapes, strict=True)]
        if self.collapsed:
            return {"V0": None, "V": list(parts[:-1]), "a": parts[-1]}
        return {"V0": parts[0], "V": list(parts[1:-1]), "a": parts[-1]}

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        prior = -0.5 * (z * z / self.var_vec).sum(-1)
        if not self.collapsed:
            f = path_forward(self.xi, self.unflatten(z))  # (chains, P)
            return -0.5 * ((f - self.Y) ** 2).sum(-1) / self.T + prior
        U = path_overlap(self.unflatten(z))  # (chains, paths, paths)
        P = self.Y.shape[0]
        K = (U.reshape(U.shape[0], -1) @ self.C).reshape(-1, P, P)
        Lc = torch.linalg.cholesky(K + self.T * torch.eye(P, dtype=DTYPE, device=K.device))
        r = torch.cholesky_solve(self.Y.expand(K.shape[0], P)[..., None], Lc)[..., 0]
        logdet = 2.0 * torch.log(torch.diagonal(Lc, dim1=-2, dim2=-1)).sum(-1)
        return -0.5 * (self.Y * r).sum(-1) - 0.5 * logdet + prior

    def init(self, n_chains: int, generator=None) -> torch.Tensor:
        return torch.randn(
            n_chains, self.dim, generator=generator, dtype=DTYPE, device=self.xi.device
        ) * torch.sqrt(self.var_vec)

    def sample_overlaps(self, samples: torch.Tensor) -> torch.Tensor:
        """``U`` of every sample: (n_samples * chains, paths, paths)."""
        z = samples.reshape(-1, samples.shape[-1])
        return path_overlap(self.unflatten(z))

    def predictions(self, samples: torch.Tensor, xi_test: torch.Tensor) -> torch.Tensor:
        """Outputs (full) or conditional GP means (collapsed) on test inputs, per sample.

        Returns (n_samples * chains, P_test); the posterior-mean predictor is its mean over axis 0.
        """
        z = samples.reshape(-1, samples.shape[-1])
        if not self.collapsed:
            return path_forward(xi_test.to(DTYPE), self.unflatten(z))
        xt_test = scaled_features(xi_test.to(DTYPE), self.variances[0])
        Us = path_overlap(self.unflatten(z))
        return torch.stack([predict(U, self.xt, self.Y, xt_test, self.T)[0] for U in Us])

    def predictive_moments(self, samples: torch.Tensor, xi_test: torch.Tensor):
        """Posterior-predictive mean and variance of ``f(x*)`` from the samples, (P_test,) each.

        Full sampler: moments of the sampled outputs. Collapsed sampler: law of total variance,
        ``Var f = E[Var(f | U)] + Var(E[f | U])`` with the exact conditional GP moments.
        """
        z = samples.reshape(-1, samples.shape[-1])
        if not self.collapsed:
            f = path_forward(xi_test.to(DTYPE), self.unflatten(z))
            return f.mean(0), f.var(0)
        xt_test = scaled_features(xi_test.to(DTYPE), self.variances[0])
        Us = path_overlap(self.unflatten(z))
        mv = [predict(U, self.xt, self.Y, xt_test, self.T) for U in Us]
        means = torch.stack([m for m, _ in mv])
        var = torch.stack([v for _, v in mv]).mean(0) + means.var(0)
        return means.mean(0), var

    def overlaps(self, samples: torch.Tensor) -> torch.Tensor:
        """Posterior mean of ``U_{pi pi'} = w_pi . w_pi' / N_1`` over all samples."""
        return self.sample_overlaps(samples).mean(0)

    def statistics(self, samples: torch.Tensor) -> torch.Tensor:
        """Symmetry-invariant summaries for diagnostics: the upper triangle of ``U`` per sample,
        shape (n_samples, chains, n_stats). (Raw weights are not identifiable: ``a -> -a``,
        ``V -> -V`` leave the output unchanged, so R-hat on them is meaningless.)"""
        n, c = samples.shape[:2]
        U = self.sample_overlaps(samples)
        iu = torch.triu_indices(U.shape[-1], U.shape[-1])
        return U[:, iu[0], iu[1]].reshape(n, c, -1)
