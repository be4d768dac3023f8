"""The published solver's scheme, re-implemented (the benchmark's baseline, Chapter 3).

The authors' theory notebook (repository ``SPOC-group/positional-and-semantic-attention``, commit
``0b867fa``, ``theory/theory.ipynb``) solves the self-consistent equations of Chapter 3 as follows;
this module does the same, step for step, in its own code:

* **Conjugates** from a nested product cubature: the 12-node degree-7 Stroud-Secrest rule on the
  student variables :math:`(\\xi_1,\\xi_2)` times the same rule on the teacher variables
  :math:`(\\eta_1,\\eta_2)` (144 nodes); :math:`\\hat V` carries the correction
  :math:`\\theta\\hat\\theta/q`.
* **Proximal step** at every node by quasi-Newton minimisation (BFGS, finite-difference gradient,
  start at 0) of the notebook's form of the Moreau objective, written with the full 2x2 attention
  matrices and twice our normalisation,

  .. math:: \\frac{\\lVert x-u\\rVert^2}{V}+\\mathrm{Tr}(S\\Sigma S^\\top)-2\\,\\mathrm{Tr}(T\\Sigma S^\\top),
            \\qquad \\Sigma=\\sigma^2 I_2,

  repeated inside each of the four conjugate averages.
* **Iteration** from the published starting points, unrestricted (no invariant subspace), damping
  0.8 on (q, m, V, theta); the stopping test compares the **undamped** update with the current state,
  ``max(|dq|, |dm|, |dtheta|) < 1e-4``, and the state returned is the one *before* that update,
  with the conjugates computed at it.
* **Test error and free entropy** with the degree-11 Rabinowitz-Richter rule (28 nodes per pair of
  variables): ``mse`` (twice our :math:`\\varepsilon_g`) from three averages, the cross term with
  the degree-11 rule outside and the degree-7 rule inside; :math:`\\Phi` with the degree-11 rule on
  both pairs and a proximal step at each of the 784 nodes.

``prox="bfgs"`` runs the scheme as published (minutes per point); ``prox="newton"`` replaces only
the per-node BFGS by the batched Newton prox of :func:`~attnlib.dotattn.channel.prox_newton` on
the same nodes. The two reach the same minimiser up to BFGS's gradient tolerance, so the iterates
agree to a few parts in 10^6 and the iteration counts agree; the cheap variant is how the tests
regenerate the published tables.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .channel import channel_hats, free_entropy, prior_overlaps
from .model import _DT, A_STANDARD

PUBLISHED_STARTS = {
    # (q, m, V, theta) of the published notebook
    "positional": (0.0206838209589, 0.2, 14.575, 0.0),
    "semantic": (0.906838209589, 0.0002, 14.575, 0.3472),
}

PUBLISHED_ROWS = {
    # rows of the authors' tables theory/repl_softmax_Mixed_sig0.5_lamb0.01_omega0.3[_para].csv
    # (commit 0b867fa): omega = 0.3, sigma = 0.5, lambda = 0.01; mse = 2 eps_g, Phi = -eps_t
    ("semantic", 2.0): dict(q=0.11415017990617564, m=0.0, V=12.327885683844869,
                            theta=0.15856055220203275, mse=0.0027930868446673918,
                            Phi=-0.003599352337970492),
    ("semantic", 1.25): dict(q=0.08188248022049105, m=0.0, V=17.26700951687913,
                             theta=0.12171494957975484, mse=0.004545061800608985,
                             Phi=-0.002720275075475354),
    ("positional", 2.0): dict(q=0.050012313500147836, m=0.25856717789921435, V=11.036146049061081,
                              theta=0.0, mse=0.006980917367439443, Phi=-0.004515268863535892),
    ("positional", 1.25): dict(q=0.04636068503764697, m=0.2533450029525329, V=14.454688224214648,
                               theta=0.0, mse=0.006837080443428012, Phi=-0.002709734719703341),
}
"""A few rows of the published theory tables, the targets of the faithful re-implementation."""

PUBLISHED_ALPHA_C = {0.0: 0.5480511155124588, 0.1: 0.7071599112677189, 0.15: 0.8180015676221762,
                     0.2: 0.9277860822926854, 0.25: 1.06, 0.3: 1.2410177405149914,
                     0.35: 1.4541109691229464, 0.4: 1.7505718608649372, 0.425: 1.93929723421423}
"""The alpha_c(omega) table hard-coded in the authors' plotting notebook (``02-toy_model_plots``,
both lists sorted, as there)."""

PUBLISHED_ALPHA_L = {0.0: 0.7224524901475151, 0.05: 0.7652803696599021, 0.075: 0.8076328324972342,
                     0.1: 0.8505675450846425, 0.15: 0.941534866004223, 0.2: 1.0714067387463304,
                     0.25: 1.2254411566145098, 0.275: 1.32705219011143, 0.3: 1.4505799369795134,
                     0.325: 1.5843728192149278, 0.35: 1.749529526524848, 0.38: 1.9932320281583897}
"""The alpha_l(omega) table of the same notebook."""


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


def rabinowitz_richter_28() -> tuple[np.ndarray, np.ndarray]:
    """Degree-11, 28-node fully symmetric cubature for E F(x), x ~ N(0, I_2) (Rabinowitz-Richter 1969,
    their second rule for the weight exp(-|x|^2)), rescaled to the standard normal.

    Orbits: (+-r, 0), (0, +-r) for three radii and (+-a, +-b), (+-b, +-a) for two pairs; the
    weights are for the weight exp(-|x|^2) (summing to pi) before normalisation.
    """
    axis = ((0.8176645817675417e-3, 2.757816396257008), (0.4363323129985824e-1, 1.732050807568877),
            (0.5373255214498174e0, 0.6280515301597559))
    pairs = ((0.3636102608321520e-2, 1.224744871391589, 2.121320343559643),
             (0.9817477042468103e-1, 0.7071067811865475, 1.224744871391589))
    pts, wts = [], []
    for w, r in axis:
        for p in ((r, 0.0), (-r, 0.0), (0.0, r), (0.0, -r)):
            pts.append(p)
            wts.append(w)
    for w, a, b in pairs:
        for p in ((a, b), (-a, b), (a, -b), (-a, -b), (b, a), (-b, a), (b, -a), (-b, -a)):
            pts.append(p)
            wts.append(w)
    wts = np.array(wts)
    return math.sqrt(2.0) * np.array(pts), wts / wts.sum()


def _product(rule_xi, rule_eta) -> tuple[torch.Tensor, torch.Tensor]:
    """4-d nodes (xi1, xi2, eta1, eta2) and weights of a product of two 2-d rules."""
    (x, wx), (y, wy) = rule_xi, rule_eta
    nodes = np.array([[a[0], a[1], b[0], b[1]] for a in x for b in y])
    weights = np.array([ua * ub for ua in wx for ub in wy])
    return torch.as_tensor(nodes, dtype=_DT), torch.as_tensor(weights, dtype=_DT)


def reference_nodes(device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The reference 4-d rule: the 12-node rule on (xi1, xi2) times the same on (eta1, eta2)."""
    nodes, weights = _product(stroud_secrest_12(), stroud_secrest_12())
    return nodes.to(device), weights.to(device)


def _softmax2(a, b):
    """Rows of softmax(v v^T) for v = (a, b): returns S11, S12, S21, S22 (numpy scalars or arrays)."""
    s11 = 1.0 / (1.0 + np.exp(-a * (a - b)))
    s22 = 1.0 / (1.0 + np.exp(-b * (b - a)))
    return s11, 1.0 - s11, 1.0 - s22, s22


def _teacher_matrix(h1, h2, omega, A):
    s = _softmax2(h1, h2)
    a = (A[0][0], A[0][1], A[1][0], A[1][1])
    return tuple((1 - omega) * si + omega * ai for si, ai in zip(s, a, strict=True))


def published_moreau(x, u, T, V, sigma2) -> float:
    """The notebook's form of the proximal objective at x = (x1, x2) for target matrix entries T.

    ``|x - u|^2/V + Tr(S Sigma S^T) - 2 Tr(T Sigma S^T)`` with ``Sigma = sigma2 I``: twice the
    objective of :func:`~attnlib.dotattn.channel.prox_newton` minus a constant, same minimiser.
    """
    S = _softmax2(x[0], x[1])
    quad = ((x[0] - u[0]) ** 2 + (x[1] - u[1]) ** 2) / V
    return quad + sigma2 * sum(s * s for s in S) - 2 * sigma2 * sum(t * s for t, s in zip(T, S, strict=True))


def reference_channel_hats(q, m, theta, V, alpha, omega, sigma=0.5, A=A_STANDARD):
    """Conjugates by the published scheme: every node's prox by scipy BFGS (numerical gradient,
    started at 0) on :func:`published_moreau`, recomputed separately inside each of the four
    conjugate averages as in the original.

    Scalar inputs; returns a dict with ``qh, mh, th, Vh`` and ``n_prox`` (BFGS solves made).
    """
    from scipy.optimize import minimize

    nodes, w = reference_nodes()
    nodes, w = nodes.numpy(), w.numpy()
    s2 = sigma * sigma
    rho = s2
    c, s = theta / math.sqrt(q), math.sqrt(max(rho - theta * theta / q, 1e-300))
    count = [0]

    def g_at(node):
        xi1, xi2, e1, e2 = node
        u = (m + math.sqrt(q) * xi1, -m + math.sqrt(q) * xi2)
        T = _teacher_matrix(c * xi1 + s * e1, c * xi2 + s * e2, omega, A)
        res = minimize(lambda x: published_moreau(x, u, T, V, s2), np.zeros(2))
        count[0] += 1
        return (res.x[0] - u[0]) / V, (res.x[1] - u[1]) / V

    def average(fn):
        return sum(wk * fn(node, g_at(node)) for node, wk in zip(nodes, w, strict=True))

    qh = alpha * average(lambda n, g: g[0] ** 2 + g[1] ** 2)
    mh = alpha * average(lambda n, g: g[0] - g[1])
    th = alpha * average(lambda n, g: g[0] * n[2] + g[1] * n[3]) / s
    Vh = -alpha * average(lambda n, g: g[0] * n[0] + g[1] * n[1]) / math.sqrt(q) + theta * th / q
    return {"qh": qh, "mh": mh, "th": th, "Vh": Vh, "n_prox": count[0]}


def _T1(v):
    return torch.tensor([float(v)], dtype=_DT)


def _newton_hats(q, m, theta, V, alpha, omega, sigma, A, nodes, weights):
    # started at x = 0 like the published BFGS (the same local minimiser), not the global prox
    h = channel_hats(_T1(q), _T1(m), _T1(theta), _T1(V), _T1(alpha), _T1(omega), sigma, A, nodes, weights,
                     start="zero")
    return {k: float(h[k][0]) for k in ("qh", "mh", "th", "Vh", "E_env")}


def reference_test_error(q, m, theta, omega, sigma=0.5, A=A_STANDARD) -> float:
    """The published ``mse`` (= 2 eps_g): E Tr(T S T^T) + E Tr(S S S^T) - 2 E Tr(T S S^T), S = sigma^2 I.

    First two averages with the degree-11 rule (the teacher's with independent fields of variance
    rho), the cross term with the degree-11 rule on the student fields and the degree-7 rule on
    the teacher's conditional part, as in the notebook.
    """
    s2 = sigma * sigma
    rho = s2
    x11, w11 = rabinowitz_richter_28()
    x7, w7 = stroud_secrest_12()
    sq = lambda M: sum(v * v for v in M)  # noqa: E731
    T0 = _teacher_matrix(math.sqrt(rho) * x11[:, 0], math.sqrt(rho) * x11[:, 1], omega, A)
    term1 = s2 * float(sq(T0) @ w11)
    S = _softmax2(m + math.sqrt(q) * x11[:, 0], -m + math.sqrt(q) * x11[:, 1])
    term2 = s2 * float(sq(S) @ w11)
    c, s = theta / math.sqrt(q), math.sqrt(max(rho - theta * theta / q, 0.0))
    h1 = c * x11[:, 0, None] + s * x7[None, :, 0]
    h2 = c * x11[:, 1, None] + s * x7[None, :, 1]
    T = _teacher_matrix(h1, h2, omega, A)
    cross = sum(t * si[:, None] for t, si in zip(T, S, strict=True)) @ w7
    term3 = -2 * s2 * float(cross @ w11)
    return term1 + term2 + term3


def reference_solve(alpha, omega, branch, sigma=0.5, lam=0.01, A=A_STANDARD, damping=0.8,
                    tol=1e-4, max_iter=300, prox: str = "newton", fast_prox=None) -> dict:
    """The published iteration, its test error and its free entropy at one (alpha, omega) point.

    Starts at :data:`PUBLISHED_STARTS`; each step computes the conjugates at the current state
    (144-node rule) and the undamped overlaps from the prior equations; it stops when the undamped
    change of (q, m, theta) is below ``tol`` and returns the state *before* that update, with the
    conjugates computed at it. ``n_iter`` is the number of damped updates made (the count the
    notebook prints), ``n_channel = n_iter + 1`` the conjugate evaluations.

    ``prox="bfgs"``: per-node scipy BFGS as published (minutes per point); ``prox="newton"``: the
    batched Newton prox on the same nodes (the same minimisers, seconds). ``fast_prox`` is the old
    boolean spelling of ``prox="newton"``.

    Returns a dict with ``q, m, theta, V`` (signed, as iterated), the conjugates, ``mse`` (the
    published test error, 2 eps_g), ``Phi`` (the published free entropy, -eps_t), ``n_iter``,
    ``n_channel`` and ``converged``.
    """
    if fast_prox is not None:
        prox = "newton" if fast_prox else "bfgs"
    if prox not in ("newton", "bfgs"):
        raise ValueError(f"prox must be 'newton' or 'bfgs'; got {prox!r}")
    q, m, V, theta = PUBLISHED_STARTS[branch]
    nodes, w = reference_nodes()

    def hats_at(q, m, theta, V):
        if prox == "newton":
            return _newton_hats(q, m, theta, V, alpha, omega, sigma, A, nodes, w)
        return reference_channel_hats(q, m, theta, V, alpha, omega, sigma, A)

    converged = False
    it = 0
    for it in range(max_iter):  # noqa: B007
        h = hats_at(q, m, theta, V)
        qn, mn, tn, Vn = prior_overlaps(h["qh"], h["mh"], h["th"], h["Vh"], lam, sigma)
        if max(abs(qn - q), abs(mn - m), abs(tn - theta)) < tol:
            converged = True
            break
        q, m, theta, V = (damping * o + (1 - damping) * n
                          for o, n in ((q, qn), (m, mn), (theta, tn), (V, Vn)))
    # free entropy: the conjugates of the returned state and the envelope averaged with the
    # degree-11 rule on both pairs of variables; the prox at each of its 784 nodes by the batched
    # Newton step in both variants (the same minimiser as BFGS, which would add minutes)
    n11, w11 = _product(rabinowitz_richter_28(), rabinowitz_richter_28())
    env = _newton_hats(q, m, theta, V, alpha, omega, sigma, A, n11, w11)["E_env"]
    hats = {k: torch.tensor(h[k], dtype=_DT) for k in ("qh", "mh", "th", "Vh")}
    hats["E_env"] = torch.tensor(env, dtype=_DT)
    phi = float(free_entropy(*(torch.tensor(v, dtype=_DT) for v in (q, m, theta, V)), hats,
                             alpha, lam, sigma))
    return {"q": q, "m": m, "theta": theta, "V": V, "qh": h["qh"], "mh": h["mh"], "th": h["th"],
            "Vh": h["Vh"], "mse": reference_test_error(q, abs(m), abs(theta), omega, sigma, A),
            "Phi": phi, "n_iter": it, "n_channel": it + 1, "converged": converged}
