"""The damped fixed-point iteration of the self-consistent equations of Chapter 3."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .._validation import check_choice, check_float, check_int
from .channel import PROX_STARTS, channel_hats, free_entropy, prior_overlaps, test_error_theory
from .model import _DT, A_STANDARD, BRANCHES, branch_init
from .quadrature import branch_symmetries, fold_nodes, gauss_hermite_4d


@dataclass(frozen=True)
class TheoryConfig:
    """Numerical settings of the theory solver."""

    sigma: float = 0.5          # token standard deviation (rho = sigma^2)
    lam: float = 0.01           # ridge strength lambda
    A: tuple = A_STANDARD       # positional attention matrix of the target
    n_nodes: int = 8            # Gauss-Hermite nodes per dimension (8**4 = 4096 in 4-d)
    damping: float = 0.8        # new = (1 - damping) * update + damping * old
    tol: float = 1e-7           # stop when max |change| of (q, m, theta, V/V0) < tol
    max_iter: int = 400         # cap (the semantic branch at alpha < 0.1 converges slowly)
    tol_stall: float = 1e-5     # after anderson_patience iterations, stop points whose change is
                                # below this (the quadrature map is only piecewise smooth)
    n_nodes_eg: int = 20        # nodes per dimension for the test error (no prox, cheap)
    prox_start: str = "global"  # "global": Newton from both zeros of the loss, the lower kept;
                                # "zero": from x = 0 (the published scheme); "warm": previous x*
    anderson: int = 5           # Anderson mixing memory on top of damping (0 = plain damping)
    anderson_patience: int = 100  # after this many iterations fall back to plain damping
    fold: bool = True           # integrate over one node per orbit of the branch's symmetry group
                                # (exact; about 4x fewer prox solves), see branch_symmetries

    def __post_init__(self):
        check_float("sigma", self.sigma, minimum=0.0, strict=True)
        check_float("lam", self.lam, minimum=0.0, strict=True)
        check_int("n_nodes", self.n_nodes, minimum=2)
        check_float("damping", self.damping, minimum=0.0, maximum=1.0)
        check_float("tol", self.tol, minimum=0.0, strict=True)
        check_int("max_iter", self.max_iter, minimum=1)
        check_int("n_nodes_eg", self.n_nodes_eg, minimum=2)
        check_choice("prox_start", self.prox_start, PROX_STARTS)
        check_int("anderson", self.anderson, minimum=0)
        check_float("tol_stall", self.tol_stall, minimum=0.0)


@dataclass
class FixedPoints:
    """Solutions of the self-consistent equations, one entry per point (all arrays of shape (P,))."""

    alpha: np.ndarray
    omega: np.ndarray
    branch: list
    q: np.ndarray
    m: np.ndarray
    theta: np.ndarray
    V: np.ndarray
    hats: dict
    eps_t: np.ndarray            # -Phi
    eps_t_direct: np.ndarray     # alpha E[ell(x*)] + lam q / (2 sigma^2): equal at a fixed point
    eps_g: np.ndarray
    n_iter: np.ndarray
    converged: np.ndarray        # last change below config.tol
    stalled: np.ndarray          # stopped with change below config.tol_stall (not converged)
    residual: np.ndarray         # last change of the (scaled) overlaps
    seconds: float
    config: TheoryConfig = field(default_factory=TheoryConfig)

    @property
    def identity_gap(self) -> np.ndarray:
        """|eps_t(-Phi) - eps_t(direct)|: zero at an exact fixed point."""
        return np.abs(self.eps_t - self.eps_t_direct)

    def to_frame(self):
        import pandas as pd

        s2 = self.config.sigma ** 2
        return pd.DataFrame({
            "alpha": self.alpha, "omega": self.omega, "branch": self.branch,
            "q": self.q, "m": self.m, "theta": self.theta, "V": self.V,
            "m_over_s2": self.m / s2, "theta_over_s2": self.theta / s2,
            "eps_t": self.eps_t, "eps_t_direct": self.eps_t_direct, "eps_g": self.eps_g,
            "n_iter": self.n_iter, "converged": self.converged, "stalled": self.stalled,
            "residual": self.residual,
        })


def _as_points(alpha, omega, branch):
    alpha = np.atleast_1d(np.asarray(alpha, dtype=float))
    omega = np.atleast_1d(np.asarray(omega, dtype=float))
    if isinstance(branch, str):
        branch = [branch]
    branch = list(branch)
    P = max(len(alpha), len(omega), len(branch))
    alpha = np.broadcast_to(alpha, (P,)).copy() if len(alpha) in (1, P) else None
    omega = np.broadcast_to(omega, (P,)).copy() if len(omega) in (1, P) else None
    if alpha is None or omega is None or len(branch) not in (1, P):
        raise ValueError("alpha, omega and branch must have length 1 or a common length P")
    branch = branch * P if len(branch) == 1 else branch
    for b in branch:
        check_choice("branch", b, BRANCHES)
    for a in alpha:
        check_float("alpha", float(a), minimum=0.0, strict=True)
    for o in omega:
        check_float("omega", float(o), minimum=0.0, maximum=1.0)
    return alpha, omega, branch


@functools.lru_cache(maxsize=32)
def _folded_rule(n_nodes: int, branch: str, A: tuple, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The product rule folded for one branch; cached, since folding costs more than a small solve."""
    nodes, weights = gauss_hermite_4d(n_nodes, device=device)
    return fold_nodes(nodes, weights, branch_symmetries(branch, A))


def _solve_branch(alpha, omega, branch, init, cfg, dev, nodes, weights) -> dict:
    """The damped (+ Anderson) iteration for points of one branch on one quadrature rule."""
    P = len(alpha)
    branch = [branch] * P
    T = lambda v: torch.as_tensor(np.asarray(v, dtype=float), dtype=_DT, device=dev)  # noqa: E731
    q, m, V, theta = (T(init[:, i]).clone() for i in range(4))
    keep_m = T([b == "positional" for b in branch])
    keep_t = T([b == "semantic" for b in branch])
    m = m * keep_m
    theta = theta * keep_t
    al, om = T(alpha), T(omega)
    n_iter = np.zeros(P, dtype=int)
    converged = np.zeros(P, dtype=bool)
    stalled = np.zeros(P, dtype=bool)
    last_change = np.full(P, np.inf)
    active = torch.arange(P, device=dev)
    N = weights.shape[0]
    x1 = torch.zeros(P, N, dtype=_DT, device=dev)
    x2 = torch.zeros(P, N, dtype=_DT, device=dev)
    warm = cfg.prox_start == "warm"
    d = cfg.damping
    k = cfg.anderson
    scale = torch.stack([torch.ones_like(V), torch.ones_like(V), V, torch.ones_like(V)], 1)
    hist_s = torch.zeros(P, k + 1, 4, dtype=_DT, device=dev)  # past damped images F(s)
    hist_r = torch.zeros(P, k + 1, 4, dtype=_DT, device=dev)  # past scaled residuals F(s) - s
    n_hist = torch.zeros(P, dtype=torch.long, device=dev)
    start = torch.stack([q, m, V, theta], 1).clone()
    use_acc = torch.ones(P, dtype=torch.bool, device=dev)
    for it in range(1, cfg.max_iter + 1):
        ix = active
        x0 = (x1[ix], x2[ix]) if warm else None
        hats = channel_hats(q[ix], m[ix], theta[ix], V[ix], al[ix], om[ix], cfg.sigma, cfg.A,
                            nodes, weights, x0=x0, start=cfg.prox_start)
        x1[ix], x2[ix] = hats["x"]
        mh = hats["mh"] * keep_m[ix]
        th = hats["th"] * keep_t[ix]
        qn, mn, tn, Vn = prior_overlaps(hats["qh"], mh, th, hats["Vh"], cfg.lam, cfg.sigma)
        old = torch.stack([q[ix], m[ix], V[ix], theta[ix]], 1)
        img = (1 - d) * torch.stack([qn, mn, Vn, tn], 1) + d * old  # damped map F(s)
        res = (img - old) / scale[ix]
        change = res.abs().amax(1)
        bad = ~torch.isfinite(img).all(1)
        if bool(bad.any()):  # an extrapolation left the domain: restart those points, undamped-free
            bi = ix[bad]
            use_acc[bi] = False
            img[bad] = start[bi]
            res[bad] = 1.0
            change[bad] = float("inf")
        new = img
        if k > 0:
            # Anderson mixing of the damped map over the last k steps (per point, least squares)
            hs, hr, nh = hist_s[ix], hist_r[ix], n_hist[ix]
            hs = torch.cat([hs[:, 1:], img[:, None]], 1)
            hr = torch.cat([hr[:, 1:], res[:, None]], 1)
            nh = torch.clamp(nh + 1, max=k + 1)
            hist_s[ix], hist_r[ix], n_hist[ix] = hs, hr, nh
            dR = hr[:, 1:] - hr[:, :-1]  # (p, k, 4)
            dS = hs[:, 1:] - hs[:, :-1]
            valid = (torch.arange(k, device=dev)[None, :] >= (k + 1 - nh)[:, None]).to(_DT)
            dR = dR * valid[:, :, None]
            G = dR @ dR.transpose(1, 2)
            tr = G.diagonal(dim1=1, dim2=2).sum(1)
            G = G + (1e-12 * tr + 1e-300)[:, None, None] * torch.eye(k, dtype=_DT, device=dev)
            # a singular or non-finite system (a stalled history) falls back to the damped step
            gam, info = torch.linalg.solve_ex(G, dR @ res[:, :, None])
            gam = gam[:, :, 0]
            gam = torch.where(((info == 0) & torch.isfinite(gam).all(1))[:, None], gam,
                              torch.zeros_like(gam))
            acc = img - (gam[:, :, None] * dS).sum(1)
            qa, Va, ta = acc[:, 0], acc[:, 2], acc[:, 3]
            ok = (qa > 0) & (Va > 0) & (ta * ta < 0.999 * qa * cfg.sigma**2) & (nh > 1)
            ok = ok & torch.isfinite(acc).all(1) & use_acc[ix] & (it <= cfg.anderson_patience)
            # never move further than ten undamped steps
            ok = ok & (((acc - old) / scale[ix]).abs().amax(1) <= 10 * change / (1 - d + 1e-12))
            new = torch.where(ok[:, None], acc, img)
        q[ix], m[ix], V[ix], theta[ix] = new[:, 0], new[:, 1], new[:, 2], new[:, 3]
        done = change < cfg.tol
        idx = ix.cpu().numpy()
        n_iter[idx] = it
        converged[idx[done.cpu().numpy()]] = True
        if it > cfg.anderson_patience:
            stop = (change < cfg.tol_stall) & ~done
            stalled[idx[stop.cpu().numpy()]] = True
            done = done | stop
        last_change[idx] = change.cpu().numpy()
        active = ix[~done]
        if active.numel() == 0:
            break
    # final evaluation at the reached state
    hats = channel_hats(q, m, theta, V, al, om, cfg.sigma, cfg.A, nodes, weights,
                        x0=(x1, x2) if warm else None, start=cfg.prox_start)
    hats.pop("x")
    hats.pop("n_newton")
    hats["mh"] = hats["mh"] * keep_m
    hats["th"] = hats["th"] * keep_t
    phi = free_entropy(q, m, theta, V, hats, al, cfg.lam, cfg.sigma)
    eps_direct = al * hats["E_ell"] + cfg.lam * q / (2 * cfg.sigma**2)
    eg = test_error_theory(q, m, theta, om, cfg.sigma, cfg.A, n_nodes=cfg.n_nodes_eg)
    npy = lambda v: v.detach().cpu().numpy()  # noqa: E731
    return {
        "q": npy(q), "m": np.abs(npy(m)), "theta": np.abs(npy(theta)), "V": npy(V),
        "hats": {k: npy(v) for k, v in hats.items()}, "eps_t": npy(-phi),
        "eps_t_direct": npy(eps_direct), "eps_g": npy(eg), "n_iter": n_iter,
        "converged": converged, "stalled": stalled, "residual": last_change,
    }


def solve_fixed_points(alpha, omega, branch, config: TheoryConfig | None = None, init=None,
                       device: torch.device | str = "cpu", quadrature=None) -> FixedPoints:
    """Solve the self-consistent equations for many (alpha, omega, branch) points at once.

    Damped iteration ``overlaps <- (1-d) prior(channel(overlaps)) + d overlaps`` vectorised over the
    quadrature nodes and the points. Each branch is restricted to its invariant subspace: the
    positional branch forces :math:`\\hat\\theta=0` (so :math:`\\theta=0`), the semantic one
    :math:`\\hat m=0` (so :math:`m=0`), the trivial one both. Points leave the batch when converged.
    Each branch is iterated on its own rule, folded by :func:`branch_symmetries` (the integrands
    are invariant, so the averages are unchanged and the cost drops about fourfold).

    Parameters
    ----------
    alpha, omega : float or array of shape (P,)
    branch : str or list of P strings, from :data:`BRANCHES`
    init : optional array (P, 4) of starting (q, m, V, theta); default :data:`BRANCH_INITS`
        rescaled to ``config.sigma`` (:func:`branch_init`).
    quadrature : optional ``(nodes (N, 4), weights (N,))`` replacing the product Gauss-Hermite rule
        (for instance a large Monte Carlo sample to make a reference solution); not folded.

    Returns
    -------
    FixedPoints, with the training loss from the free entropy and from the direct formula (their
    agreement is the convergence check) and the test error.
    """
    cfg = config or TheoryConfig()
    alpha, omega, branch = _as_points(alpha, omega, branch)
    P = len(alpha)
    if init is None:
        init = np.array([branch_init(b, cfg.sigma) for b in branch])
    init = np.asarray(init, dtype=float)
    if init.shape != (P, 4):
        raise ValueError(f"init must have shape ({P}, 4) = (points, [q, m, V, theta]); got {init.shape}")
    t0 = time.perf_counter()
    dev = torch.device(device)
    if quadrature is None:
        base = gauss_hermite_4d(cfg.n_nodes, device=dev)
    else:
        base = tuple(torch.as_tensor(v, dtype=_DT, device=dev) for v in quadrature)
        if base[0].ndim != 2 or base[0].shape[1] != 4 or base[1].shape != base[0].shape[:1]:
            raise ValueError("quadrature must be (nodes of shape (N, 4), weights of shape (N,))")
    out = {}
    for b in dict.fromkeys(branch):  # one iteration per branch, on that branch's folded rule
        idx = np.array([i for i, bb in enumerate(branch) if bb == b])
        nodes, weights = base
        if cfg.fold and quadrature is None:
            nodes, weights = _folded_rule(cfg.n_nodes, b, tuple(map(tuple, cfg.A)), str(dev))
        res = _solve_branch(alpha[idx], omega[idx], b, init[idx], cfg, dev, nodes, weights)
        for key, val in res.items():
            if key == "hats":
                hats = out.setdefault("hats", {})
                for hk, hv in val.items():
                    hats.setdefault(hk, np.zeros(P))[idx] = hv
            else:
                out.setdefault(key, np.zeros(P, dtype=np.asarray(val).dtype))[idx] = val
    return FixedPoints(alpha=alpha, omega=omega, branch=branch, seconds=time.perf_counter() - t0,
                       config=cfg, **out)


def find_crossing(x, y) -> float:
    """First zero of ``y(x)`` by linear interpolation between the two grid points that bracket it.

    ``x`` increasing; returns NaN when ``y`` does not change sign. Used for
    :math:`\\alpha_c` (zero of :math:`\\varepsilon_t^{sem}-\\varepsilon_t^{pos}`) and
    :math:`\\alpha_l` (zero of :math:`\\varepsilon_g^{sem}-\\varepsilon_g^{lin}`).
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    for i in range(len(x) - 1):
        if y[i] == 0:
            return float(x[i])
        if y[i] * y[i + 1] < 0:
            return float(x[i] - y[i] * (x[i + 1] - x[i]) / (y[i + 1] - y[i]))
    return float("nan")

