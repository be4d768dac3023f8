"""The channel of Chapter 3: field-space loss, its proximal map, the conjugate (hat) equations,
the prior half step, the free entropy, the test error and the linear positional baseline."""

from __future__ import annotations

import logging
import math
import os
import shutil

import numpy as np
import torch

from .model import _DT
from .quadrature import gauss_hermite_4d


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
_HALVING_BLOCKS = ((0, 4), (4, 40))  # the trial steps of the line search, in the order tried


def _prox_objective(y1, y2, u1, u2, t1, t2, iV, sigma2):
    a = y1 - y2
    r1 = torch.sigmoid(y1 * a) - t1
    r2 = torch.sigmoid(-y2 * a) - t2
    return 0.5 * iV * ((y1 - u1) ** 2 + (y2 - u2) ** 2) + sigma2 * (r1 * r1 + r2 * r2)


def _newton_direction(x1, x2, u1, u2, t1, t2, iV, sigma2):
    """One safeguarded Newton direction of the proximal objective, elementwise.

    Returns ``(gmax, p1, p2, f0, slope, f1)``: the largest gradient component, the direction (the
    Newton step where the 2x2 Hessian is safely positive definite; elsewhere its spectrum is
    shifted up to 0.05/V, a regularised step), the objective at x, the directional derivative
    and the objective after the full step.
    """
    ell, (g1, g2), (h11, h12, h22) = _loss_grad_hess(x1, x2, t1, t2, sigma2)
    g1 = g1 + iV * (x1 - u1)
    g2 = g2 + iV * (x2 - u2)
    h11 = h11 + iV
    h22 = h22 + iV
    lmin = 0.5 * (h11 + h22) - torch.sqrt(0.25 * (h11 - h22) ** 2 + h12 * h12)
    shift = torch.where(lmin > 1e-8 * iV, torch.zeros_like(lmin), 0.05 * iV - lmin)
    h11, h22 = h11 + shift, h22 + shift
    det = h11 * h22 - h12 * h12
    p1 = -(h22 * g1 - h12 * g2) / det
    p2 = -(-h12 * g1 + h11 * g2) / det
    f0 = 0.5 * iV * ((x1 - u1) ** 2 + (x2 - u2) ** 2) + ell  # _prox_objective at x
    slope = g1 * p1 + g2 * p2
    f1 = _prox_objective(x1 + p1, x2 + p2, u1, u2, t1, t2, iV, sigma2)
    return torch.maximum(g1.abs(), g2.abs()), p1, p2, f0, slope, f1


_FUSED = {}  # device type -> the compiled _newton_direction, or None where compiling failed


def _direction(device_type: str):
    """:func:`_newton_direction`, fused into one loop by ``torch.compile`` when it is available.

    The direction is some sixty elementwise operations, so eager PyTorch spends its time writing
    temporaries; the fused loop is 4-14x faster (10^3 to 10^5 entries, one CPU thread) and agrees
    with the eager one to round-off (its products may be contracted into fused multiply-adds).
    Compiling once costs seconds (tens on a cold cache) per process; where it fails (no C++
    compiler, an unsupported platform; logged at INFO on the ``attnlib`` logger) or
    ``ATTNLIB_COMPILE=0`` is set, the eager function is used.
    """
    if device_type not in _FUSED:
        fn = None
        # on a CPU, inductor needs a C++ compiler: without one, run eagerly rather than fail
        compiler = device_type != "cpu" or any(
            shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "clang++", "c++"))
        if os.environ.get("ATTNLIB_COMPILE", "1") != "0" and hasattr(torch, "compile") and compiler:
            try:
                fn = torch.compile(_newton_direction, dynamic=True)
                # compile now, on inputs laid out as prox_newton passes them (rows of two blocks)
                x = torch.rand(2, 8, dtype=_DT, device=device_type)
                fn(*x, *torch.rand(5, 8, dtype=_DT, device=device_type).add_(0.5), 0.25)
            except Exception as exc:  # noqa: BLE001 -- any compiler failure: run eager instead
                logging.getLogger("attnlib").info(
                    "torch.compile unavailable (%s: %s); the proximal Newton step runs eagerly "
                    "(slower, same results)", type(exc).__name__, exc)
                fn = None
        _FUSED[device_type] = fn
    return _FUSED[device_type] or _newton_direction


def prox_newton(u1, u2, t1, t2, V, sigma2, x0=None, max_iter: int = 60, tol: float = 1e-10):
    """Batched proximal map of the field-space loss by safeguarded Newton steps.

    Solves, independently for every entry of the broadcast inputs,

    .. math:: x^* = \\arg\\min_{x\\in\\mathbb R^2}\\; \\frac{\\lVert x-u\\rVert^2}{2V} + \\ell(x;T),
              \\quad \\ell = \\sigma^2[(S_{11}(x)-T_{11})^2+(S_{22}(x)-T_{22})^2].

    Where the 2x2 Hessian is not safely positive definite it is shifted (a regularised Newton step);
    a backtracking (Armijo) line search guarantees descent. Entries leave the computation once their
    gradient is below ``tol``, and the line search runs only on the entries whose full step failed,
    so the cost is set by the hard entries, not by the whole batch. The direction is computed by
    :func:`_newton_direction`, compiled where possible (:func:`_direction`). Starts at ``x0`` (a
    pair of tensors; default 0, like the reference scheme). Returns ``(x1, x2, n_iter)``.
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
    direction = _direction(u1.device.type)
    # the active entries' inputs and iterates, compacted as entries finish (one gather a step)
    act = torch.arange(u1.shape[0], device=u1.device)
    cst = torch.stack([u1, u2, t1, t2, iV])  # (5, n): each row contiguous
    cur = torch.stack([x1, x2])  # (2, n)
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007
        a1, a2 = cur
        b1, b2, c1, c2, iv = cst
        # (a single entry runs eagerly: compiling the size-1 case as well costs more than it saves)
        gmax, p1, p2, f0, slope, f1 = (direction if act.numel() > 1 else _newton_direction)(
            a1, a2, b1, b2, c1, c2, iv, sigma2)
        keep = gmax >= tol  # entries at a stationary point leave unchanged
        if not bool(keep.any()):
            break
        # Armijo condition; a step whose predicted decrease is below round-off is accepted
        ok = (f1 <= f0 + 1e-4 * slope) | (-slope < 1e-14 * f0.abs())
        step = keep.to(f0.dtype)
        bad = torch.nonzero(keep & ~ok).squeeze(1)
        # backtracking over the trial steps 2^-1 .. 2^-40: take the longest that satisfies the
        # Armijo condition. The steps are tried in blocks, all entries of a block at once (one
        # batched evaluation instead of a loop of halvings); nearly every entry succeeds in the
        # first block of four, so only the rare hard ones are evaluated at the shorter steps
        for lo, hi in _HALVING_BLOCKS:
            if not bad.numel():
                break
            sb = _HALVINGS[lo:hi].to(f0)[None, :]
            ba1, ba2, bb1, bb2, bc1, bc2, biv = (
                v[:, None] for v in (*cur[:, bad], *cst[:, bad]))
            bp1, bp2, bf0, bsl = (v[bad][:, None] for v in (p1, p2, f0, slope))
            fb = _prox_objective(ba1 + sb * bp1, ba2 + sb * bp2, bb1, bb2, bc1, bc2, biv, sigma2)
            okb = fb <= bf0 + 1e-4 * sb * bsl
            found = okb.any(1)
            first = torch.argmax(okb.to(torch.int8), dim=1)
            # an entry that fails every trial step does not move (step 0)
            step[bad] = torch.where(found, sb[0, first], torch.zeros_like(bf0[:, 0]))
            bad = bad[~found]
        cur = cur + step * torch.stack([p1, p2])
        # an entry whose predicted decrease is below round-off of the objective is stationary
        going = step * (-slope) > 1e-15 * f0.abs()
        if not bool(going.all()):
            done = ~going
            x1[act[done]], x2[act[done]] = cur[:, done]
            act, cst, cur = act[going], cst[:, going], cur[:, going]
        if act.numel() == 0:
            break
    x1[act], x2[act] = cur
    return x1.reshape(shape), x2.reshape(shape), it


def loss_minimisers(t1, t2):
    """Starting points for the global proximal map: the global minimisers of the field-space loss.

    With :math:`L_\\ell=\\mathrm{logit}\\,T_{\\ell\\ell}`, the loss vanishes where the two scores equal the
    target logits, :math:`x_1(x_1-x_2)=L_1` and :math:`x_2(x_2-x_1)=L_2`. Their sum is
    :math:`(x_1-x_2)^2=L_1+L_2`, so where :math:`L_1+L_2>0` the loss has exactly two zeros,

    .. math:: \\pm z,\\qquad z=\\frac{(L_1,\\,-L_2)}{\\sqrt{L_1+L_2}},

    mapped onto each other by :math:`x\\to-x`. Where :math:`L_1+L_2\\le 0` the loss has no zero
    (the target is not a softmax of two scalar fields) and ``(0, 0)`` is returned with
    ``reachable`` false. Returns ``(z1, z2, reachable)``.
    """
    eps = 1e-12
    L1 = torch.logit(t1.clamp(eps, 1 - eps))
    L2 = torch.logit(t2.clamp(eps, 1 - eps))
    s = L1 + L2
    reachable = s > 1e-12
    r = torch.sqrt(torch.where(reachable, s, torch.ones_like(s)))
    zero = torch.zeros_like(s)
    return torch.where(reachable, L1 / r, zero), torch.where(reachable, -L2 / r, zero), reachable


def prox_global(u1, u2, t1, t2, V, sigma2, max_iter: int = 60, tol: float = 1e-10):
    """Global proximal map: :func:`prox_newton` from both minimisers of the loss, the lower kept.

    The proximal objective :math:`\\lVert x-u\\rVert^2/2V+\\ell(x)` has one local minimum in the
    basin of each zero :math:`\\pm z` of the loss (:func:`loss_minimisers`) when V is large, and
    Newton's method from x = 0 (the published scheme's start) reaches either, depending on u. At
    fixed points with V of 30 to 250 (sigma = 0.7 or lambda = 0.001) it misses the global minimum
    at nodes carrying up to 12 % of the quadrature weight, at the main text's sigma = 0.5,
    lambda = 0.01 up to 0.8 % (Chapter 3, where these are measured); the local choice jumps
    between basins as u moves, and the averaged map with it. Both starts are run as one batch of
    twice the size; where the loss has no zero (see :func:`loss_minimisers`) the
    starts are the point of the diagonal nearest u (where :math:`S_{11}=S_{22}=1/2`) and the
    origin. Where both reach the same objective value (to 1e-12, relative) the point from the
    start nearer u is returned. Returns ``(x1, x2, n_iter)``.
    """
    (xa1, xa2), (xb1, xb2), wb, it = _prox_pair(u1, u2, t1, t2, V, sigma2, max_iter, tol)
    pick = wb == 1
    return torch.where(pick, xb1, xa1), torch.where(pick, xb2, xa2), it


def _prox_pair(u1, u2, t1, t2, V, sigma2, max_iter=60, tol=1e-10):
    """Both candidates of :func:`prox_global` and the weight of the second: 1 where it is lower,
    0 where the first is, 1/2 where they tie (to 1e-12 relative in the objective).

    Ties are not rare on a product rule: at the nodes with :math:`\\xi_1=\\xi_2` and
    :math:`\\eta_1=\\eta_2` (n^2 of the n^4 nodes), :math:`u_1=u_2` and :math:`T_{11}=T_{22}`, so the
    exchange of the two tokens maps the minimisers :math:`\\pm z` onto each other at equal
    objective. The channel averages then take the mean of the two minimisers' integrands (the
    value a node at the tie stands for: half its neighbourhood lies on either side), which also
    keeps the sign symmetries of the averages exact.
    """
    shape = torch.broadcast_shapes(u1.shape, u2.shape, t1.shape, t2.shape, V.shape)
    u1, u2, t1, t2, V = (v.expand(shape) for v in (u1, u2, t1, t2, V))
    z1, z2, reachable = loss_minimisers(t1, t2)
    flip = z1 * u1 + z2 * u2 < 0
    z1, z2 = torch.where(flip, -z1, z1), torch.where(flip, -z2, z2)  # the zero nearer u first
    c = 0.5 * (u1 + u2)
    n1, n2 = torch.where(reachable, z1, c), torch.where(reachable, z2, c)
    f1, f2 = torch.where(reachable, -z1, 0 * c), torch.where(reachable, -z2, 0 * c)
    two = lambda a, b: torch.stack([a, b])  # noqa: E731
    x1, x2, it = prox_newton(two(u1, u1), two(u2, u2), two(t1, t1), two(t2, t2), two(V, V), sigma2,
                             x0=(two(n1, f1), two(n2, f2)), max_iter=max_iter, tol=tol)
    f = _prox_objective(x1, x2, two(u1, u1), two(u2, u2), two(t1, t1), two(t2, t2), 1.0 / two(V, V),
                        sigma2)
    gap = f[1] - f[0]
    tie = gap.abs() <= 1e-12 * f[0].abs()
    wb = torch.where(tie, torch.full_like(gap, 0.5), (gap < 0).to(gap.dtype))
    return (x1[0], x2[0]), (x1[1], x2[1]), wb, it


PROX_STARTS = ("global", "zero", "warm")
"""Starts of the proximal step: both loss minimisers (:func:`prox_global`, the default), x = 0
(the published scheme's start; a local minimum at some nodes when V is large) or the previous
iterate's proximal point."""


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


def channel_hats(q, m, theta, V, alpha, omega, sigma, A, nodes, weights, x0=None, start="global"):
    """Conjugate overlaps from the channel (one damped-iteration half step), batched over points.

    For every point (inputs of shape ``(P,)``; ``omega`` and ``alpha`` too) with
    :math:`u_1=m+\\sqrt q\\xi_1,\\ u_2=-m+\\sqrt q\\xi_2`,
    :math:`h^*_\\ell=(\\theta/\\sqrt q)\\xi_\\ell+\\sqrt{\\rho-\\theta^2/q}\\,\\eta_\\ell`,
    :math:`g=(x^*-u)/V`:

    .. math::
        \\hat q=\\alpha\\mathbb E[g_1^2+g_2^2],\\quad \\hat m=\\alpha\\mathbb E[g_1-g_2],\\quad
        \\hat\\theta=\\frac{\\alpha\\mathbb E[g_1\\eta_1+g_2\\eta_2]}{\\sqrt{\\rho-\\theta^2/q}},\\quad
        \\hat V=-\\frac{\\alpha\\mathbb E[g_1\\xi_1+g_2\\xi_2]}{\\sqrt q}+\\frac{\\theta\\hat\\theta}{q}.

    The proximal points are global minimisers (``start="global"``, :func:`prox_global`), or
    Newton's local minimum from x = 0 (``"zero"``, the published scheme) or from ``x0``
    (``"warm"``).

    Returns a dict with ``qh, mh, th, Vh`` and the averages ``E_ell`` (loss at the proximal point)
    and ``E_env`` (Moreau envelope), all of shape ``(P,)``, and the proximal points ``x`` (a pair
    of ``(P, N)`` tensors) that can warm-start the next call through ``x0``.
    """
    sigma2 = sigma * sigma
    u1, u2, h1, h2, s = _fields(q, m, theta, sigma2, nodes)
    om = omega[:, None]
    t1, t2 = _teacher_diag(h1, h2, om, A)
    Vc = V[:, None]
    if start not in PROX_STARTS:
        raise ValueError(f"start must be one of {PROX_STARTS}; got {start!r}")
    xi1, xi2, eta1, eta2 = (nodes[:, i] for i in range(4))

    def integrands(x1, x2):  # |g|^2, g1 - g2, g . eta, g . xi and the loss, at proximal points x
        g1, g2 = (x1 - u1) / Vc, (x2 - u2) / Vc
        a = x1 - x2
        ell = sigma2 * ((torch.sigmoid(x1 * a) - t1) ** 2 + (torch.sigmoid(-x2 * a) - t2) ** 2)
        return torch.stack([g1 * g1 + g2 * g2, g1 - g2, g1 * eta1 + g2 * eta2, g1 * xi1 + g2 * xi2, ell])

    if start == "global":
        xa, xb, wb, n_newton = _prox_pair(u1, u2, t1, t2, Vc, sigma2)
        f = torch.lerp(integrands(*xa), integrands(*xb), wb)  # the mean of the two at a tie
        x1, x2 = torch.where(wb == 1, xb[0], xa[0]), torch.where(wb == 1, xb[1], xa[1])
    else:
        x1, x2, n_newton = prox_newton(u1, u2, t1, t2, Vc, sigma2, x0=x0 if start == "warm" else None)
        f = integrands(x1, x2)
    gg, gd, ge, gx, ell = f @ weights
    qh = alpha * gg
    mh = alpha * gd
    th = alpha * ge / s
    Vh = -alpha * gx / torch.sqrt(q) + theta * th / q
    E_env = ell + 0.5 * V * gg
    return {"qh": qh, "mh": mh, "th": th, "Vh": Vh, "E_ell": ell, "E_env": E_env,
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

