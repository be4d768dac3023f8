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

Modules (every public name is re-exported here: ``from attnlib import dotattn``):

* :mod:`.model` -- the positional matrices, the three branches and their starting points;
* :mod:`.quadrature` -- Gauss-Hermite and randomised quasi-Monte Carlo rules, symmetry folding;
* :mod:`.channel` -- the field loss, its proximal map, the conjugate and prior equations, the free
  entropy, the test error and the linear baseline;
* :mod:`.theory` -- the damped fixed-point iteration (:func:`solve_fixed_points`);
* :mod:`.transition` -- lowest fixed point from several starts, alpha_c and alpha_l by bracketing;
* :mod:`.simulation` -- finite-d gradient descent (:func:`train_attention`);
* :mod:`.counting` -- the histogram task (:func:`train_histogram`);
* :mod:`.reference` -- the published solver's scheme, re-implemented for the benchmark.
"""

from __future__ import annotations

from .channel import (
    channel_hats,
    free_entropy,
    linear_baseline_error,
    prior_overlaps,
    prox_global,
    prox_newton,
    test_error_theory,
)
from .counting import HistogramConfig, HistogramTransformer, histogram_data, train_histogram
from .model import A_ALTERNATIVE, A_STANDARD, BRANCH_INITS, BRANCHES, branch_init
from .quadrature import branch_symmetries, fold_nodes, gauss_hermite_4d, sobol_gaussian
from .reference import reference_channel_hats, reference_nodes, reference_solve, stroud_secrest_12
from .simulation import INITS, SimConfig, draw_problem, fit_linear_baseline, train_attention
from .theory import FixedPoints, TheoryConfig, find_crossing, solve_fixed_points
from .transition import critical_alpha, grid_rows, lowest_fixed_points, lowest_on_grid, transition_rows

__all__ = [
    "A_STANDARD",
    "A_ALTERNATIVE",
    "BRANCHES",
    "BRANCH_INITS",
    "branch_init",
    "TheoryConfig",
    "FixedPoints",
    "gauss_hermite_4d",
    "branch_symmetries",
    "fold_nodes",
    "sobol_gaussian",
    "prox_newton",
    "prox_global",
    "channel_hats",
    "prior_overlaps",
    "free_entropy",
    "test_error_theory",
    "linear_baseline_error",
    "solve_fixed_points",
    "find_crossing",
    "lowest_fixed_points",
    "lowest_on_grid",
    "critical_alpha",
    "transition_rows",
    "grid_rows",
    "SimConfig",
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
