"""Tied low-rank dot-product attention: positional vs semantic minima (Chapter 3).

Model of Cui, Behrens, Krzakala and Zdeborova (2024), derived in ``chapters/03-positional-semantic``.
Tokens :math:`z_\\ell\\sim\\mathcal N(0,\\sigma^2 I_d)`, :math:`\\ell=1,2`; positional encodings
:math:`p_1=-p_2=\\mathbf 1_d/\\sqrt d` added to the student's input only, :math:`x=z+p`;

.. math::

    f_Q(X) = \\mathrm{softmax}(X Q Q^\\top X^\\top/d)\\,X,\\qquad
    y(Z) = [(1-\\omega)\\,\\mathrm{softmax}(Z Q_* Q_*^\\top Z^\\top/d)+\\omega A]\\,Z,

    \\mathcal L(Q)=\\sum_{\\mu=1}^{n}\\frac{1}{2d}\\lVert y(Z^\\mu)-f_Q(X^\\mu)\\rVert_F^2
    +\\frac{\\lambda}{2}\\lVert Q\\rVert_F^2,\\qquad \\alpha=n/d.

Three parts:

* the **theory**: the self-consistent equations for the overlaps
  :math:`(q,m,\\theta,V)` of the global minimiser (rank 1, two tokens), solved by a damped
  fixed-point iteration vectorised over Gauss-Hermite nodes and over (alpha, omega, branch) points,
  with a batched Newton proximal step (:func:`solve_fixed_points`);
* the **linear positional baseline** :math:`f_B(Z)=BZ` in closed form (:func:`linear_baseline_error`);
* the **finite-d simulation**: full-batch gradient descent in torch, batched over seeds, omegas and
  initialisations, both initialisations paired on the same data (:func:`train_attention`).

Conventions: ``sigma`` is a standard deviation; :math:`\\varepsilon_t=\\mathcal L(\\hat Q)/d`
(regulariser included); :math:`\\varepsilon_g=\\mathbb E\\lVert y-f\\rVert^2/(2d)` per sequence;
overlaps are reported as :math:`m=\\mathbf 1^\\top Q/d` and :math:`\\theta/\\sigma^2=Q_*^\\top Q/d`.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ._validation import check_choice, check_float, check_int

__all__ = [
    "A_STANDARD",
    "A_ALTERNATIVE",
    "BRANCHES",
    "BRANCH_INITS",
    "TheoryConfig",
    "FixedPoints",
    "gauss_hermite_4d",
    "branch_symmetries",
    "fold_nodes",
    "prox_newton",
    "channel_hats",
    "prior_overlaps",
    "free_entropy",
    "test_error_theory",
    "linear_baseline_error",
    "solve_fixed_points",
    "find_crossing",
    "SimConfig",
    "SIM_PROFILES",
    "INITS",
    "draw_problem",
    "train_attention",
    "fit_linear_baseline",
    "HistogramConfig",
    "HistogramTransformer",
    "histogram_data",
    "train_histogram",
    "stroud_secrest_12",
    "reference_nodes",
    "reference_channel_hats",
    "reference_solve",
]

A_STANDARD = ((0.6, 0.4), (0.4, 0.6))
"""Positional attention matrix of the main text (row-stochastic, diagonal-dominant)."""
A_ALTERNATIVE = ((0.3, 0.7), (0.8, 0.2))
"""Off-diagonal-dominant, asymmetric alternative A' of the appendix."""

BRANCHES = ("positional", "semantic", "trivial")
BRANCH_INITS = {
    # (q, m, V, theta): the reference notebook's starting points; the semantic one with m := 0
    "positional": (0.0206838, 0.2, 14.575, 0.0),
    "semantic": (0.906838, 0.0, 14.575, 0.3472),
    "trivial": (0.5, 0.0, 14.575, 0.0),
}

_DT = torch.float64


# ----------------------------------------------------------------------------------------------
# quadrature
# ----------------------------------------------------------------------------------------------
def gauss_hermite_4d(n: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Product Gauss-Hermite rule for :math:`\\mathbb E\\,F(\\xi_1,\\xi_2,\\eta_1,\\eta_2)`, i.i.d. N(0,1).

    Returns ``nodes`` of shape ``(n**4, 4)`` (columns xi1, xi2, eta1, eta2) and probability
    ``weights`` of shape ``(n**4,)`` summing to one. Exact for polynomials of degree ``2n-1``
    in each variable.
    """
    n = check_int("n", n, minimum=1)
    x, w = np.polynomial.hermite_e.hermegauss(n)
    w = w / w.sum()
    grids = np.meshgrid(x, x, x, x, indexing="ij")
    wgrid = np.meshgrid(w, w, w, w, indexing="ij")
    nodes = np.stack([g.ravel() for g in grids], axis=1)
    weights = np.prod(np.stack([g.ravel() for g in wgrid], axis=1), axis=1)
    return (torch.as_tensor(nodes, dtype=_DT, device=device),
            torch.as_tensor(weights, dtype=_DT, device=device))


def branch_symmetries(branch: str, A=A_STANDARD) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """Signed permutations of the Gaussian variables (xi1, xi2, eta1, eta2) that leave a branch's
    channel integrands invariant (Chapter 3, "Symmetries").

    Each element is ``(perm, sign)``: it maps a node ``v`` to ``sign * v[perm]``. Generators:

    * token exchange with a sign flip, ``(xi1, xi2, eta1, eta2) -> -(xi2, xi1, eta2, eta1)``: maps
      :math:`u\\to(-u_2,-u_1)`, :math:`h^*\\to(-h^*_2,-h^*_1)` for any (m, theta); a symmetry when
      :math:`A_{11}=A_{22}`;
    * :math:`\\eta\\to-\\eta` when :math:`\\theta=0` (positional and trivial branches);
    * :math:`(\\xi,\\eta)\\to-(\\xi,\\eta)` when :math:`m=0` (semantic and trivial branches).

    The integrands of :math:`\\hat q,\\hat V`, the loss and the envelope are invariant under each
    element; those of :math:`\\hat m` (semantic) and :math:`\\hat\\theta` (positional) are odd, and
    the branch sets them to zero anyway. Returns the whole group, identity first.
    """
    check_choice("branch", branch, BRANCHES)
    gens = []
    if float(A[0][0]) == float(A[1][1]):
        gens.append(((1, 0, 3, 2), (-1.0, -1.0, -1.0, -1.0)))
    if branch in ("positional", "trivial"):
        gens.append(((0, 1, 2, 3), (1.0, 1.0, -1.0, -1.0)))
    if branch in ("semantic", "trivial"):
        gens.append(((0, 1, 2, 3), (-1.0, -1.0, -1.0, -1.0)))
    group = [((0, 1, 2, 3), (1.0, 1.0, 1.0, 1.0))]
    grew = True
    while grew:  # closure under composition (the groups here have at most 8 elements)
        grew = False
        for p, sg in list(group):
            for gp, gs in gens:
                # (g o h)(v)[k] = gs[k] * h(v)[gp[k]] = gs[k] * sg[gp[k]] * v[p[gp[k]]]
                comp = (tuple(p[gp[k]] for k in range(4)), tuple(gs[k] * sg[gp[k]] for k in range(4)))
                if comp not in group:
                    group.append(comp)
                    grew = True
    return group


def fold_nodes(nodes: torch.Tensor, weights: torch.Tensor, group) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep one node per orbit of ``group`` and give it the summed weight of its orbit.

    ``nodes`` (N, 4) must be closed under the group (a product rule with symmetric 1-d nodes is).
    For an integrand invariant under the group the folded rule gives the same average, with about
    ``len(group)`` times fewer evaluations. Returns ``(nodes, weights)`` of the representatives.
    """
    arr = nodes.detach().cpu().numpy()
    key = np.round(arr, 12)
    index = {tuple(row): i for i, row in enumerate(key)}
    canon = np.arange(len(arr))
    for perm, sign in group[1:]:
        img = np.round(arr[:, list(perm)] * np.asarray(sign), 12)
        try:
            j = np.fromiter((index[tuple(row)] for row in img), dtype=np.int64, count=len(img))
        except KeyError:
            raise ValueError("fold_nodes: the nodes are not closed under the symmetry group") from None
        canon = np.minimum(canon, j)
    reps, inverse = np.unique(canon, return_inverse=True)
    w = np.bincount(inverse, weights=weights.detach().cpu().numpy().astype(float))
    return nodes[torch.as_tensor(reps, device=nodes.device)], torch.as_tensor(w, dtype=weights.dtype,
                                                                               device=weights.device)


# ----------------------------------------------------------------------------------------------
# the channel: field-space loss, its proximal map, the hat equations
# ----------------------------------------------------------------------------------------------
def _self_attention_diag(x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Diagonal of softmax_row(x x^T) for two scalar fields: S11 = sig(x1(x1-x2)), S22 = sig(x2(x2-x1))."""
    a = x1 - x2
    return torch.sigmoid(x1 * a), torch.sigmoid(-x2 * a)


def _teacher_diag(h1, h2, omega, A):
    """Diagonal of T = (1-omega) softmax(h h^T) + omega A for L = 2."""
    s1, s2 = _self_attention_diag(h1, h2)
    return (1 - omega) * s1 + omega * A[0][0], (1 - omega) * s2 + omega * A[1][1]


def _loss_grad_hess(x1, x2, t1, t2, sigma2):
    """Field-space loss ell = sigma^2[(S11-T11)^2 + (S22-T22)^2], its gradient and Hessian in x.

    All arguments broadcast; returns ``ell, (g1, g2), (h11, h12, h22)``.
    """
    a = x1 - x2
    s1 = torch.sigmoid(x1 * a)
    s2 = torch.sigmoid(-x2 * a)
    r1, r2 = s1 - t1, s2 - t2
    d1, d2 = s1 * (1 - s1), s2 * (1 - s2)
    dd1, dd2 = d1 * (1 - 2 * s1), d2 * (1 - 2 * s2)
    # gradients of the two scores z1 = x1(x1-x2), z2 = x2(x2-x1)
    z1a, z1b = 2 * x1 - x2, -x1
    z2a, z2b = -x2, 2 * x2 - x1
    c = 2 * sigma2
    ell = sigma2 * (r1 * r1 + r2 * r2)
    g1 = c * (r1 * d1 * z1a + r2 * d2 * z2a)
    g2 = c * (r1 * d1 * z1b + r2 * d2 * z2b)
    k1 = d1 * d1 + r1 * dd1
    k2 = d2 * d2 + r2 * dd2
    e1, e2 = r1 * d1, r2 * d2  # multiply the constant score Hessians [[2,-1],[-1,0]], [[0,-1],[-1,2]]
    h11 = c * (k1 * z1a * z1a + k2 * z2a * z2a + 2 * e1)
    h12 = c * (k1 * z1a * z1b + k2 * z2a * z2b - e1 - e2)
    h22 = c * (k1 * z1b * z1b + k2 * z2b * z2b + 2 * e2)
    return ell, (g1, g2), (h11, h12, h22)


_HALVINGS = 0.5 ** torch.arange(1, 41, dtype=torch.float64)


def _prox_objective(y1, y2, u1, u2, t1, t2, iV, sigma2):
    a = y1 - y2
    r1 = torch.sigmoid(y1 * a) - t1
    r2 = torch.sigmoid(-y2 * a) - t2
    return 0.5 * iV * ((y1 - u1) ** 2 + (y2 - u2) ** 2) + sigma2 * (r1 * r1 + r2 * r2)


def prox_newton(u1, u2, t1, t2, V, sigma2, x0=None, max_iter: int = 60, tol: float = 1e-10):
    """Batched proximal map of the field-space loss by safeguarded Newton steps.

    Solves, independently for every entry of the broadcast inputs,

    .. math:: x^* = \\arg\\min_{x\\in\\mathbb R^2}\\; \\frac{\\lVert x-u\\rVert^2}{2V} + \\ell(x;T),
              \\quad \\ell = \\sigma^2[(S_{11}(x)-T_{11})^2+(S_{22}(x)-T_{22})^2].

    Where the 2x2 Hessian is not safely positive definite it is shifted (a regularised Newton step);
    a backtracking (Armijo) line search guarantees descent. Entries leave the computation once their
    gradient is below ``tol``, and the line search runs only on the entries whose full step failed,
    so the cost is set by the hard entries, not by the whole batch. Starts at ``x0`` (a pair of
    tensors; default 0, like the reference scheme). Returns ``(x1, x2, n_iter)``.
    """
    shape = torch.broadcast_shapes(u1.shape, u2.shape, t1.shape, t2.shape, V.shape)
    flat = lambda v: v.expand(shape).reshape(-1)  # noqa: E731
    u1, u2, t1, t2 = flat(u1), flat(u2), flat(t1), flat(t2)
    iV = flat(1.0 / V)
    if x0 is None:
        x1 = torch.zeros_like(u1)
        x2 = torch.zeros_like(u1)
    else:
        x1, x2 = flat(x0[0]).clone(), flat(x0[1]).clone()
    act = torch.arange(u1.shape[0], device=u1.device)
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007
        a1, a2, b1, b2, c1, c2, iv = x1[act], x2[act], u1[act], u2[act], t1[act], t2[act], iV[act]
        _, (g1, g2), (h11, h12, h22) = _loss_grad_hess(a1, a2, c1, c2, sigma2)
        g1 = g1 + iv * (a1 - b1)
        g2 = g2 + iv * (a2 - b2)
        keep = torch.maximum(g1.abs(), g2.abs()) >= tol
        if not bool(keep.any()):
            break
        act, a1, a2, b1, b2, c1, c2, iv = (v[keep] for v in (act, a1, a2, b1, b2, c1, c2, iv))
        g1, g2, h11, h12, h22 = (v[keep] for v in (g1, g2, h11, h12, h22))
        h11 = h11 + iv
        h22 = h22 + iv
        # smallest eigenvalue of the 2x2 Hessian: where it is positive take the plain Newton step
        # (quadratic convergence even when the minimum is flat), where the objective is locally
        # non-convex shift the spectrum up to 0.05/V (a regularised step; the line search guards)
        lmin = 0.5 * (h11 + h22) - torch.sqrt(0.25 * (h11 - h22) ** 2 + h12 * h12)
        shift = torch.where(lmin > 1e-8 * iv, torch.zeros_like(lmin), 0.05 * iv - lmin)
        h11, h22 = h11 + shift, h22 + shift
        det = h11 * h22 - h12 * h12
        p1 = -(h22 * g1 - h12 * g2) / det
        p2 = -(-h12 * g1 + h11 * g2) / det
        f0 = _prox_objective(a1, a2, b1, b2, c1, c2, iv, sigma2)
        slope = g1 * p1 + g2 * p2
        f1 = _prox_objective(a1 + p1, a2 + p2, b1, b2, c1, c2, iv, sigma2)
        # Armijo condition; a step whose predicted decrease is below round-off is accepted
        ok = (f1 <= f0 + 1e-4 * slope) | (-slope < 1e-14 * f0.abs())
        step = torch.ones_like(f0)
        bad = torch.nonzero(~ok).squeeze(1)
        if bad.numel():
            # backtracking, all trial steps 2^-1 .. 2^-40 at once: take the longest that satisfies
            # the Armijo condition (one batched evaluation instead of a loop of halvings)
            sb = _HALVINGS.to(f0)[None, :]
            ba1, ba2, bb1, bb2, bc1, bc2, biv, bp1, bp2, bf0, bsl = (
                v[bad][:, None] for v in (a1, a2, b1, b2, c1, c2, iv, p1, p2, f0, slope))
            fb = _prox_objective(ba1 + sb * bp1, ba2 + sb * bp2, bb1, bb2, bc1, bc2, biv, sigma2)
            okb = fb <= bf0 + 1e-4 * sb * bsl
            first = torch.argmax(okb.to(torch.int8), dim=1)
            step[bad] = torch.where(okb.any(1), sb[0, first], torch.zeros_like(first, dtype=f0.dtype))
        x1[act] = a1 + step * p1
        x2[act] = a2 + step * p2
        # an entry whose predicted decrease is below round-off of the objective is stationary
        act = act[step * (-slope) > 1e-15 * f0.abs()]
        if act.numel() == 0:
            break
    return x1.reshape(shape), x2.reshape(shape), it


def _fields(q, m, theta, sigma2, nodes):
    """Student fields u and teacher fields h* at the quadrature nodes; inputs (P,), outputs (P, N)."""
    xi1, xi2, eta1, eta2 = (nodes[:, i] for i in range(4))
    sq = torch.sqrt(q)[:, None]
    rho = sigma2
    c = (theta / torch.sqrt(q))[:, None]
    s = torch.sqrt(torch.clamp(rho - theta * theta / q, min=1e-300))[:, None]
    u1 = m[:, None] + sq * xi1
    u2 = -m[:, None] + sq * xi2
    h1 = c * xi1 + s * eta1
    h2 = c * xi2 + s * eta2
    return u1, u2, h1, h2, s[:, 0]


def channel_hats(q, m, theta, V, alpha, omega, sigma, A, nodes, weights, x0=None):
    """Conjugate overlaps from the channel (one damped-iteration half step), batched over points.

    For every point (inputs of shape ``(P,)``; ``omega`` and ``alpha`` too) with
    :math:`u_1=m+\\sqrt q\\xi_1,\\ u_2=-m+\\sqrt q\\xi_2`,
    :math:`h^*_\\ell=(\\theta/\\sqrt q)\\xi_\\ell+\\sqrt{\\rho-\\theta^2/q}\\,\\eta_\\ell`,
    :math:`g=(x^*-u)/V`:

    .. math::
        \\hat q=\\alpha\\mathbb E[g_1^2+g_2^2],\\quad \\hat m=\\alpha\\mathbb E[g_1-g_2],\\quad
        \\hat\\theta=\\frac{\\alpha\\mathbb E[g_1\\eta_1+g_2\\eta_2]}{\\sqrt{\\rho-\\theta^2/q}},\\quad
        \\hat V=-\\frac{\\alpha\\mathbb E[g_1\\xi_1+g_2\\xi_2]}{\\sqrt q}+\\frac{\\theta\\hat\\theta}{q}.

    Returns a dict with ``qh, mh, th, Vh`` and the averages ``E_ell`` (loss at the proximal point)
    and ``E_env`` (Moreau envelope), all of shape ``(P,)``, and the proximal points ``x`` (a pair
    of ``(P, N)`` tensors) that can warm-start the next call through ``x0``.
    """
    sigma2 = sigma * sigma
    u1, u2, h1, h2, s = _fields(q, m, theta, sigma2, nodes)
    om = omega[:, None]
    t1, t2 = _teacher_diag(h1, h2, om, A)
    Vc = V[:, None]
    x1, x2, n_newton = prox_newton(u1, u2, t1, t2, Vc, sigma2, x0=x0)
    g1 = (x1 - u1) / Vc
    g2 = (x2 - u2) / Vc
    w = weights
    xi1, xi2, eta1, eta2 = (nodes[:, i] for i in range(4))
    ell = sigma2 * ((torch.sigmoid(x1 * (x1 - x2)) - t1) ** 2 + (torch.sigmoid(-x2 * (x1 - x2)) - t2) ** 2)
    E = lambda f: f @ w  # noqa: E731
    qh = alpha * E(g1 * g1 + g2 * g2)
    mh = alpha * E(g1 - g2)
    th = alpha * E(g1 * eta1 + g2 * eta2) / s
    Vh = -alpha * E(g1 * xi1 + g2 * xi2) / torch.sqrt(q) + theta * th / q
    E_ell = E(ell)
    E_env = E_ell + 0.5 * V * E(g1 * g1 + g2 * g2)
    return {"qh": qh, "mh": mh, "th": th, "Vh": Vh, "E_ell": E_ell, "E_env": E_env,
            "x": (x1, x2), "n_newton": n_newton}


def prior_overlaps(qh, mh, th, Vh, lam, sigma):
    """Overlaps from the conjugates: the closed-form ridge (Gaussian prior) half step.

    .. math::
        V=\\frac{\\sigma^2}{\\lambda+\\sigma^2\\hat V},\\ m=\\frac{\\hat m}{\\lambda+\\sigma^2\\hat V},\\
        \\theta=\\frac{\\sigma^2\\rho\\hat\\theta}{\\lambda+\\sigma^2\\hat V},\\
        q=\\frac{\\sigma^2(\\sigma^2\\hat q+\\hat m^2+\\sigma^2\\rho\\hat\\theta^2)}
        {(\\lambda+\\sigma^2\\hat V)^2},
        \\quad\\rho=\\sigma^2.
    """
    s2 = sigma * sigma
    rho = s2
    den = lam + s2 * Vh
    V = s2 / den
    m = mh / den
    theta = s2 * rho * th / den
    q = s2 * (s2 * qh + mh * mh + s2 * rho * th * th) / den**2
    return q, m, theta, V


def free_entropy(q, m, theta, V, hats, alpha, lam, sigma):
    """Replica free entropy at a fixed point; the training loss is :math:`\\varepsilon_t=-\\Phi`.

    .. math::
        \\Phi=\\tfrac12(\\hat Vq-\\hat qV)-m\\hat m-\\theta\\hat\\theta
        +\\frac{\\sigma^2\\hat q+\\hat m^2+\\sigma^2\\rho\\hat\\theta^2}{2(\\lambda+\\sigma^2\\hat V)}
        -\\alpha\\,\\mathbb E\\,\\mathcal M(u,h^*).
    """
    s2 = sigma * sigma
    qh, mh, th, Vh = hats["qh"], hats["mh"], hats["th"], hats["Vh"]
    prior = 0.5 * (s2 * qh + mh * mh + s2 * s2 * th * th) / (lam + s2 * Vh)
    return 0.5 * (Vh * q - qh * V) - m * mh - theta * th + prior - alpha * hats["E_env"]


def test_error_theory(q, m, theta, omega, sigma, A, n_nodes: int = 20):
    """Test error of a student with overlaps (q, m, theta): no proximal step, bare fields.

    .. math:: \\varepsilon_g=\\sigma^2\\,\\mathbb E\\big[(S_{11}(u)-T_{11}(h^*))^2
              +(S_{22}(u)-T_{22}(h^*))^2\\big]
              =\\tfrac{\\sigma^2}{2}\\mathbb E\\lVert S(u)-T(h^*)\\rVert_F^2

    (rows of S and T sum to one). Inputs of shape ``(P,)``; product Gauss-Hermite with ``n_nodes``
    per dimension.
    """
    q, m, theta, omega = (torch.as_tensor(v, dtype=_DT) for v in (q, m, theta, omega))
    q, m, theta, omega = torch.broadcast_tensors(q, m, theta, omega)
    q, m, theta, omega = (v.reshape(-1) for v in (q, m, theta, omega))
    nodes, weights = gauss_hermite_4d(n_nodes, device=q.device)
    sigma2 = sigma * sigma
    out = []
    for i in range(q.shape[0]):  # one point at a time keeps memory at n_nodes**4
        sl = slice(i, i + 1)
        u1, u2, h1, h2, _ = _fields(q[sl], m[sl], theta[sl], sigma2, nodes)
        t1, t2 = _teacher_diag(h1, h2, omega[sl, None], A)
        s1, s2 = _self_attention_diag(u1, u2)
        out.append(sigma2 * (((s1 - t1) ** 2 + (s2 - t2) ** 2) @ weights))
    return torch.cat(out)


def linear_baseline_error(omega, sigma: float = 0.5, n_nodes: int = 200) -> np.ndarray:
    """Test error of the best purely positional linear mixer :math:`f_B(Z)=BZ` (large-d limit).

    .. math:: B^*=\\mathbb E[T],\\qquad
              \\varepsilon_g^{\\rm lin}=2\\sigma^2(1-\\omega)^2\\,
              \\mathrm{Var}\\big[\\mathrm{sig}(h_1(h_1-h_2))\\big],\\quad h\\sim\\mathcal N(0,\\sigma^2I_2),

    independent of A. The 2-d integral uses a product Gauss-Hermite rule in the rotated variables
    :math:`a=h_1-h_2, b=h_1+h_2` (independent) on which the integrand is smooth.
    """
    omega = np.asarray(omega, dtype=float)
    x, w = np.polynomial.hermite_e.hermegauss(n_nodes)
    w = w / w.sum()
    s = sigma * math.sqrt(2.0)  # a = h1 - h2, b = h1 + h2 are independent N(0, 2 sigma^2)
    a = s * x[:, None]
    b = s * x[None, :]
    h1 = 0.5 * (a + b)
    sig = 1.0 / (1.0 + np.exp(-h1 * a))
    W = w[:, None] * w[None, :]
    mean = (sig * W).sum()
    var = ((sig - mean) ** 2 * W).sum()
    return 2 * sigma**2 * (1 - omega) ** 2 * var


# ----------------------------------------------------------------------------------------------
# the damped fixed-point iteration
# ----------------------------------------------------------------------------------------------
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
    prox_start: str = "zero"    # "zero": Newton starts at x = 0 (reference); "warm": previous x*
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
        check_choice("prox_start", self.prox_start, ("warm", "zero"))
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
                            nodes, weights, x0=x0)
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
            G = dR @ dR.transpose(1, 2) + 1e-12 * torch.eye(k, dtype=_DT, device=dev)
            gam = torch.linalg.solve(G, (dR @ res[:, :, None]))[:, :, 0]
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
                        x0=(x1, x2) if warm else None)
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
    init : optional array (P, 4) of starting (q, m, V, theta); default :data:`BRANCH_INITS`.
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
        init = np.array([BRANCH_INITS[b] for b in branch])
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


# ----------------------------------------------------------------------------------------------
# finite-d simulation: batched full-batch gradient descent
# ----------------------------------------------------------------------------------------------
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


SIM_PROFILES = {
    "quick": SimConfig(d=200, n_seeds=2, steps=2000, n_test=4000),
    "full": SimConfig(d=1000, n_seeds=24, steps=5000, n_test=50_000),
}


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


# ----------------------------------------------------------------------------------------------
# the histogram (counting) task: one attention layer, positional-only vs semantic-only mechanism
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HistogramConfig:
    """Counting task: label of token i = number of occurrences of x_i in its sequence."""

    length: int = 10           # sequence length L
    vocab: int = 15            # alphabet size
    n_sequences: int = 20_000  # distinct sequences drawn (70 % train, 30 % validation)
    dim: int = 64              # model width (half semantic, half positional embedding)
    hidden: int = 128          # MLP width
    epochs: int = 30           # Adam epochs of the constrained (frozen-mechanism) model
    batch: int = 32            # minibatch size
    lr: float = 1e-3           # peak Adam step size (one-cycle schedule)
    retrain_epochs: int = 5    # SGD epochs of the unconstrained model started at each solution
    retrain_lr: float = 1e-3   # SGD step size of that check

    def __post_init__(self):
        for name in ("length", "vocab", "n_sequences", "dim", "hidden", "epochs", "batch",
                     "retrain_epochs"):
            check_int(name, getattr(self, name), minimum=1 if name != "retrain_epochs" else 0)
        if self.dim % 2:
            raise ValueError("dim must be even (half semantic, half positional)")
        check_float("lr", self.lr, minimum=0.0, strict=True)
        check_float("retrain_lr", self.retrain_lr, minimum=0.0, strict=True)


def histogram_data(config: HistogramConfig, gen: torch.Generator):
    """Distinct uniform sequences ``(N, L)`` and their count labels ``(N, L)`` (values 1..L)."""
    x = torch.randint(0, config.vocab, (config.n_sequences, config.length), generator=gen)
    x = torch.unique(x, dim=0)
    x = x[torch.randperm(x.shape[0], generator=gen)]
    y = (x[:, :, None] == x[:, None, :]).sum(-1)
    return x, y


class HistogramTransformer(torch.nn.Module):
    """Embedding [token | position] -> one softmax attention layer (no residual) -> LayerNorm -> MLP.

    ``mechanism`` masks what the query and key maps read: ``"positional"`` (positional half only),
    ``"semantic"`` (token half only) or ``"both"`` (unconstrained). The value map reads everything.
    """

    def __init__(self, config: HistogramConfig, mechanism: str = "both"):
        super().__init__()
        check_choice("mechanism", mechanism, ("positional", "semantic", "both"))
        D, h = config.dim, config.dim // 2
        self.tok = torch.nn.Embedding(config.vocab, h)
        self.pos = torch.nn.Parameter(torch.randn(config.length, h))
        self.q = torch.nn.Linear(D, D, bias=False)
        self.k = torch.nn.Linear(D, D, bias=False)
        self.v = torch.nn.Linear(D, D, bias=False)
        self.norm = torch.nn.LayerNorm(D)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D, config.hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(config.hidden, config.length + 1))
        mask = torch.ones(D)
        if mechanism == "positional":
            mask[:h] = 0.0
        elif mechanism == "semantic":
            mask[h:] = 0.0
        self.register_buffer("mask", mask)

    def attention(self, x):
        """Attention weights ``(N, L, L)`` of token ids ``x`` of shape ``(N, L)``."""
        e = torch.cat([self.tok(x), self.pos.expand(x.shape[0], -1, -1)], -1)
        em = e * self.mask
        s = self.q(em) @ self.k(em).transpose(-1, -2) / math.sqrt(e.shape[-1])
        return torch.softmax(s, -1), e

    def forward(self, x):
        a, e = self.attention(x)
        return self.mlp(self.norm(a @ self.v(e)))


def _accuracy(model, x, y, batch=4096):
    with torch.no_grad():
        correct = 0
        for i in range(0, x.shape[0], batch):
            correct += (model(x[i:i + batch]).argmax(-1) == y[i:i + batch]).sum().item()
    return correct / y.numel()


def _param_vector(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _param_distance(a, b, keys=None):
    """Sum over tensors of the L2 norm of the difference (optionally only on ``keys`` entries)."""
    return float(sum((a[k] - b[k]).norm() for k in a if keys is None or k in keys))


def _train_epochs(model, opt, xtr, ytr, config: HistogramConfig, epochs: int, gen, sched=None):
    """Mini-batch cross-entropy training over ``epochs`` shuffled passes (scheduler stepped per batch)."""
    lossf = torch.nn.CrossEntropyLoss()
    n_tr = xtr.shape[0]
    for _ in range(epochs):
        perm = torch.randperm(n_tr, generator=gen)
        for i in range(0, n_tr, config.batch):
            b = perm[i:i + config.batch]
            opt.zero_grad()
            loss = lossf(model(xtr[b]).reshape(-1, config.length + 1), ytr[b].reshape(-1))
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()


def train_histogram(config: HistogramConfig, mechanism: str, seed: int = 0) -> dict:
    """Train the constrained model with Adam, then the unconstrained model started at its solution.

    Returns validation accuracies (constrained, and after the unconstrained re-training), the
    parameter distances init -> solution and solution -> re-trained, the attention maps of the
    first three validation sequences and the trained model.
    """
    gen = torch.Generator().manual_seed(int(seed))
    torch.manual_seed(int(seed))
    x, y = histogram_data(config, gen)
    n_tr = int(0.7 * x.shape[0])
    xtr, ytr, xva, yva = x[:n_tr], y[:n_tr], x[n_tr:], y[n_tr:]
    model = HistogramTransformer(config, mechanism)
    p0 = _param_vector(model)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, betas=(0.9, 0.98), eps=1e-9)
    steps = config.epochs * math.ceil(n_tr / config.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=steps)
    _train_epochs(model, opt, xtr, ytr, config, config.epochs, gen, sched)
    acc = _accuracy(model, xva, yva)
    p1 = _param_vector(model)
    with torch.no_grad():
        maps = model.attention(xva[:3])[0].numpy()
    # stability: unconstrained model (both halves readable), tiny noise, plain SGD
    free = HistogramTransformer(config, "both")
    state = dict(model.state_dict())
    # W_Q diag(mask) and W_K diag(mask): the same function, now with every entry trainable
    state["q.weight"] = state["q.weight"] * model.mask
    state["k.weight"] = state["k.weight"] * model.mask
    state["mask"] = torch.ones(config.dim)
    free.load_state_dict(state)
    with torch.no_grad():
        for p in free.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=gen))
    p1n = _param_vector(free)
    opt = torch.optim.SGD(free.parameters(), lr=config.retrain_lr)
    _train_epochs(free, opt, xtr, ytr, config, config.retrain_epochs, gen)
    p2 = _param_vector(free)
    return {
        "mechanism": mechanism, "val_acc": acc, "val_acc_retrained": _accuracy(free, xva, yva),
        "dist_init_to_solution": _param_distance(p0, p1),
        "dist_solution_to_retrained": _param_distance(p1n, p2),
        "maps": maps, "examples": xva[:3].numpy(), "model": model,
    }


# ----------------------------------------------------------------------------------------------
# the reference scheme (for the benchmark): 144-node cubature, per-node quasi-Newton prox
# ----------------------------------------------------------------------------------------------
def stroud_secrest_12() -> tuple[np.ndarray, np.ndarray]:
    """Degree-7, 12-node cubature for E F(x), x ~ N(0, I_2) (Stroud-Secrest VI, rescaled).

    For the weight exp(-|x|^2)/pi: 4 nodes (+-sqrt 3, 0), (0, +-sqrt 3) with weight 1/36 and 8 nodes
    (+-a, +-a) with weights (5 +- 2 sqrt 5)/45 for a^2 = (9 -+ 3 sqrt 5)/8; nodes times sqrt 2 for the
    standard normal. Returns ``nodes (12, 2)`` and ``weights (12,)``.
    """
    r5 = math.sqrt(5.0)
    pts, wts = [], []
    for x in ((math.sqrt(3), 0), (-math.sqrt(3), 0), (0, math.sqrt(3)), (0, -math.sqrt(3))):
        pts.append(x)
        wts.append(1 / 36)
    for a2, w in (((9 - 3 * r5) / 8, (5 + 2 * r5) / 45), ((9 + 3 * r5) / 8, (5 - 2 * r5) / 45)):
        a = math.sqrt(a2)
        for s1 in (1, -1):
            for s2 in (1, -1):
                pts.append((s1 * a, s2 * a))
                wts.append(w)
    return math.sqrt(2.0) * np.array(pts), np.array(wts)


def reference_nodes(device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The reference 4-d rule: the 12-node rule on (xi1, xi2) times the same on (eta1, eta2)."""
    x, w = stroud_secrest_12()
    nodes = np.array([[a[0], a[1], b[0], b[1]] for a in x for b in x])
    weights = np.array([wa * wb for wa in w for wb in w])
    return (torch.as_tensor(nodes, dtype=_DT, device=device),
            torch.as_tensor(weights, dtype=_DT, device=device))


def reference_channel_hats(q, m, theta, V, alpha, omega, sigma=0.5, A=A_STANDARD):
    """Conjugates by the reference scheme: every node's prox by scipy BFGS (numerical gradient,
    started at 0), recomputed separately inside each of the four hat averages as in the original.

    Scalar inputs; returns a dict like :func:`channel_hats` (without ``x``).
    """
    from scipy.optimize import minimize

    nodes, w = reference_nodes()
    nodes, w = nodes.numpy(), w.numpy()
    s2 = sigma * sigma
    rho = s2
    c, s = theta / math.sqrt(q), math.sqrt(max(rho - theta * theta / q, 1e-300))
    sig = lambda z: 1.0 / (1.0 + math.exp(-z))  # noqa: E731

    def g_at(node):
        xi1, xi2, e1, e2 = node
        u1, u2 = m + math.sqrt(q) * xi1, -m + math.sqrt(q) * xi2
        h1, h2 = c * xi1 + s * e1, c * xi2 + s * e2
        t1 = (1 - omega) * sig(h1 * (h1 - h2)) + omega * A[0][0]
        t2 = (1 - omega) * sig(h2 * (h2 - h1)) + omega * A[1][1]

        def f(x):
            a = x[0] - x[1]
            return (((x[0] - u1) ** 2 + (x[1] - u2) ** 2) / (2 * V)
                    + s2 * ((sig(x[0] * a) - t1) ** 2 + (sig(-x[1] * a) - t2) ** 2))

        res = minimize(f, np.zeros(2))
        return (res.x[0] - u1) / V, (res.x[1] - u2) / V, res.fun

    def average(fn):
        return sum(wk * fn(node, g_at(node)) for node, wk in zip(nodes, w, strict=True))

    qh = alpha * average(lambda n, g: g[0] ** 2 + g[1] ** 2)
    mh = alpha * average(lambda n, g: g[0] - g[1])
    th = alpha * average(lambda n, g: g[0] * n[2] + g[1] * n[3]) / s
    Vh = -alpha * average(lambda n, g: g[0] * n[0] + g[1] * n[1]) / math.sqrt(q) + theta * th / q
    return {"qh": qh, "mh": mh, "th": th, "Vh": Vh}


def reference_solve(alpha, omega, branch, sigma=0.5, lam=0.01, A=A_STANDARD, damping=0.8,
                    tol=1e-4, max_iter=300, fast_prox=False):
    """The reference damped iteration (unrestricted, the authors' starting points, tolerance 1e-4).

    ``fast_prox=False``: per-node scipy BFGS (:func:`reference_channel_hats`), minutes per point.
    ``fast_prox=True``: the same 144-node map evaluated with the batched Newton prox, which follows
    the same iterates (to prox tolerance) in a fraction of the time: used to count the reference
    iterations. Returns ``(q, m, theta, V, n_iter)``.
    """
    init = {"positional": (0.0206838, 0.2, 14.575, 0.0),
            "semantic": (0.906838, 0.0002, 14.575, 0.3472)}[branch]
    q, m, V, theta = init
    nodes, w = reference_nodes()
    T1 = lambda v: torch.tensor([float(v)], dtype=_DT)  # noqa: E731
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007
        if fast_prox:
            h = channel_hats(T1(q), T1(m), T1(theta), T1(V), T1(alpha), T1(omega), sigma, A,
                             nodes, w)
            h = {k: float(h[k][0]) for k in ("qh", "mh", "th", "Vh")}
        else:
            h = reference_channel_hats(q, m, theta, V, alpha, omega, sigma, A)
        qn, mn, tn, Vn = prior_overlaps(h["qh"], h["mh"], h["th"], h["Vh"], lam, sigma)
        qn, mn, tn, Vn = (damping * o + (1 - damping) * n
                          for o, n in ((q, qn), (m, mn), (theta, tn), (V, Vn)))
        change = max(abs(qn - q), abs(mn - m), abs(tn - theta))
        q, m, theta, V = qn, mn, tn, Vn
        if change < tol:
            break
    return q, m, theta, V, it
