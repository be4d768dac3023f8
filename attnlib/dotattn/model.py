"""Constants of the model of Chapter 3: the positional matrices, the branches, their starts."""

from __future__ import annotations

import torch

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

SIGMA_INITS = 0.5
"""The token standard deviation at which :data:`BRANCH_INITS` were set (the paper's sigma)."""


def branch_init(branch: str, sigma: float = SIGMA_INITS) -> tuple:
    """The published start of ``branch`` rescaled to token standard deviation ``sigma``.

    q, theta and V carry a factor sigma^2 (q = sigma^2 |Q|^2/d, theta = sigma^2 Q*.Q/d,
    V ~ sigma^2/lambda) while m = 1.Q/d does not: the start is the same weight vector Q seen at
    another sigma. At ``sigma = 0.5`` it is :data:`BRANCH_INITS` itself.
    """
    q, m, V, theta = BRANCH_INITS[branch]
    k = (sigma / SIGMA_INITS) ** 2
    return (q * k, m, V * k, theta * k) if k != 1.0 else (q, m, V, theta)


_DT = torch.float64
