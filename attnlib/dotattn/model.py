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

_DT = torch.float64
