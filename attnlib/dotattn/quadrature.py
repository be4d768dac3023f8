"""Gaussian quadrature for the channel averages of Chapter 3 and its symmetry folding."""

from __future__ import annotations

import numpy as np
import torch

from .._validation import check_choice, check_int
from .model import _DT, A_STANDARD, BRANCHES


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



def sobol_gaussian(log2_n: int, seed: int,
                   device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Randomised quasi-Monte Carlo rule for :math:`\\mathbb E\\,F(\\xi_1,\\xi_2,\\eta_1,\\eta_2)`.

    ``2**log2_n`` scrambled Sobol' points (scramble ``seed``) mapped to N(0, I_4) by the inverse
    normal CDF, equal weights. Two scrambles give two independent unbiased estimates; their
    difference measures the rule's error on integrands that are only piecewise smooth, where a
    product rule converges slowly. Returns ``nodes (2**log2_n, 4)`` and ``weights``.
    """
    check_int("log2_n", log2_n, minimum=1)
    u = torch.quasirandom.SobolEngine(4, scramble=True, seed=int(seed)).draw(2**log2_n, dtype=_DT)
    nodes = torch.special.ndtri(u.clamp(1e-15, 1 - 1e-15)).to(device)
    return nodes, torch.full((nodes.shape[0],), 1.0 / nodes.shape[0], dtype=_DT, device=device)
