"""Learning a multi-head attention layer from Boolean examples (chapter ``02-provable-mha``).

The layer studied by Chen and Li (2024) maps a sequence ``X`` of ``k`` tokens in ``{-1,+1}^d`` to

.. math::  F(X) = \\sum_{i=1}^m \\operatorname{softmax}(X \\Theta_i X^\\top)\\, X W_i ,

with the softmax taken row by row (queries are rows, keys are columns) and no ``1/sqrt(d)``: the
scale lives in the attention matrices ``Theta_i``. This module holds the layer, the data, the
estimators of each phase of the (reconstructed) learning pipeline, the convex body that certified
examples carve out, least squares for the projections, the Adam baseline batched over seeds, and
the book's own hard family. Everything that compares with theory runs in float64.

Shapes: inputs ``X`` are ``(n, k, d)``; a set of heads is ``theta, w`` of shape ``(m, d, d)``
(optionally with leading batch dimensions ``(..., m, d, d)``); outputs are ``(n, k, d)``.
Which parts follow the paper and which are the book's reconstruction is stated in the chapter.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linprog, nnls

from ._validation import check_float, check_int
from .attention import softmax

__all__ = [
    "MHAConfig",
    "Body",
    "attention_weights",
    "mha_forward",
    "boolean_inputs",
    "random_heads",
    "first_moment_linear",
    "attention_moment",
    "crude_sum_estimate",
    "attention_from_outputs",
    "theta_from_attention",
    "inverse_projection_from_rowsums",
    "recover_single_head",
    "certify_events",
    "oracle_events",
    "refine_sum_estimate",
    "token_regression_sum",
    "constraint_matrix",
    "lstsq_projections",
    "enumerate_heads",
    "polish_heads",
    "recover_heads",
    "random_start_search",
    "sum_estimate",
    "certification_tolerance",
    "cube_tokens",
    "limit_events",
    "CubeBody",
    "relative_test_error",
    "matched_errors",
    "train_adam",
    "hard_family",
    "hard_components",
    "krawtchouk_target",
]

DTYPE = torch.float64


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MHAConfig:
    """Sizes of the chapter's experiments (Chapter 2 writes one per profile, its ``PROFILE_SIZES``)."""

    d: int = 8  # token dimension of the recovery experiments
    k: int = 3  # tokens per sequence of the recovery experiments
    theta_norm: float = 4.0  # ||Theta_i||_F of the recovery instances (large-margin regime)
    eta: float = 0.05  # certified events: every head puts mass >= 1 - eta on one token
    n_ablation: int = 2000  # examples per instance of the ablation
    ablation_instances: int = 6  # random instances per setting of the ablation
    ablation_heads: tuple = (1, 2)  # numbers of heads m of the ablation
    sharp_norm: float = 16.0  # ||Theta_i||_F of the sharp regime where local search fails
    sharp_instances: int = 4  # instances of the sharp regime
    sharp_heads: tuple = (2,)  # numbers of heads m of the sharp regime
    polish_examples: int = 500  # examples the local search fits (noise-free: enough to identify)
    restarts: int = 2  # extra polish starts (runners-up of the net; random starts get 1 + restarts)
    body_d: int = 6  # token dimension of the sculpting figure (k = 3, m = 2)
    body_examples: tuple = (250, 1000, 4000, 16000)  # examples of the sculpting figure
    limit_dims: tuple = (4, 5, 6, 7)  # token dimensions of the exact N = infinity bodies
    limit_ks: tuple = (2, 3)  # sequence lengths of the exact N = infinity bodies
    limit_instances: int = 3  # random pairs of heads per point of the limit-thickness figure
    n_test: int = 2000  # fresh examples for test errors
    grid: int = 5  # points per axis of the enumeration net over m x m coefficients
    moment_samples: int = 20_000  # Monte Carlo samples per first-moment point
    regime_samples: int = 1_000  # sequences per point of the regime figure
    regime_k: int = 32  # tokens of the regime figure
    regime_d: int = 24  # token dimension of the regime figure
    adam_steps: int = 1_000  # Adam steps on the nice instance
    adam_max_steps: int = 1_500  # cap of the plateau criterion on the hard family
    adam_seeds: int = 4  # seeds (initialisations) batched together
    adam_train: int = 4_000  # training examples of the baseline
    hard_dims: tuple = (6, 12, 24)  # token dimensions of the hard family
    hard_heads: tuple = (1, 2, 3)  # gates r of the hard family
    hard_share: float = 0.25  # share of the output variance carried by the hidden component

    def __post_init__(self):
        check_int("d", self.d, minimum=2)
        check_int("k", self.k, minimum=2)
        check_float("theta_norm", self.theta_norm, minimum=0.0, strict=True)
        check_float("eta", self.eta, minimum=0.0, maximum=0.5, strict=True)
        for name in ("n_ablation", "ablation_instances", "sharp_instances", "polish_examples",
                     "n_test", "grid", "moment_samples", "regime_samples", "adam_steps",
                     "adam_max_steps", "adam_seeds", "adam_train", "limit_instances"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("restarts", self.restarts, minimum=0)
        check_float("sharp_norm", self.sharp_norm, minimum=0.0, strict=True)
        check_float("hard_share", self.hard_share, minimum=0.0, maximum=1.0, strict=True)
        for m in (*self.ablation_heads, *self.sharp_heads):
            check_int("ablation_heads", m, minimum=1, maximum=3)
        for n in self.body_examples:
            check_int("body_examples", n, minimum=1)
        check_int("body_d", self.body_d, minimum=3)
        for dim in self.limit_dims:
            check_int("limit_dims", dim, minimum=3, maximum=9)
        for k in self.limit_ks:
            check_int("limit_ks", k, minimum=2, maximum=3)
        check_int("regime_k", self.regime_k, minimum=2)
        check_int("regime_d", self.regime_d, minimum=2)
        for dim in self.hard_dims:
            check_int("hard_dims", dim, minimum=3)
        for r in self.hard_heads:
            check_int("hard_heads", r, minimum=1)


def _t(x, device=None) -> torch.Tensor:
    """Convert arrays to float64 tensors (keeps tensors on their device)."""
    if isinstance(x, torch.Tensor):
        return x.to(DTYPE) if device is None else x.to(device=device, dtype=DTYPE)
    return torch.as_tensor(np.asarray(x), dtype=DTYPE, device=device)


# --------------------------------------------------------------------------------------------
# the layer and the data
# --------------------------------------------------------------------------------------------
def attention_weights(X: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Attention matrices ``S_i = softmax(X Theta_i X^T)`` (row-wise).

    Parameters
    ----------
    X : tensor ``(n, k, d)``
    theta : tensor ``(..., m, d, d)``

    Returns
    -------
    tensor ``(..., n, m, k, k)``; entry ``[..., n, i, a, b]`` is the weight query ``a`` of head
    ``i`` gives to key ``b``.
    """
    scores = torch.einsum("nad,...mde,nbe->...nmab", X, theta, X)
    return softmax(scores, dim=-1)


def mha_forward(X, theta, w) -> torch.Tensor:
    """The multi-head attention layer ``F(X) = sum_i softmax(X Theta_i X^T) X W_i``.

    Parameters
    ----------
    X : tensor ``(n, k, d)``
    theta, w : tensors ``(..., m, d, d)`` (same leading dimensions)

    Returns
    -------
    tensor ``(..., n, k, d)``
    """
    X, theta, w = _t(X), _t(theta, X.device), _t(w, X.device)
    S = attention_weights(X, theta)
    return torch.einsum("...nmab,nbd,...mde->...nae", S, X, w)


def boolean_inputs(n: int, k: int, d: int, generator: torch.Generator | None = None,
                   device=None) -> torch.Tensor:
    """``n`` sequences of ``k`` tokens uniform on ``{-1,+1}^d``: a float64 tensor ``(n, k, d)``."""
    device = generator.device if generator is not None and device is None else device
    bits = torch.randint(0, 2, (n, k, d), generator=generator, device=device)
    return bits.to(DTYPE) * 2.0 - 1.0


def random_heads(m: int, d: int, theta_norm: float, generator: torch.Generator | None = None,
                 device=None, w_scale: float | None = None, trace_free: bool = False):
    """A random "nice" instance: Gaussian ``Theta_i`` rescaled to ``||Theta_i||_F = theta_norm``
    and ``W_i`` with i.i.d. ``N(0, w_scale^2)`` entries (default ``w_scale = 1/sqrt(d)``).

    Returns ``theta, w`` of shape ``(m, d, d)`` each.
    """
    device = generator.device if generator is not None and device is None else device
    theta = torch.randn(m, d, d, generator=generator, device=device, dtype=DTYPE)
    if trace_free:
        eye = torch.eye(d, dtype=DTYPE, device=device)
        theta = theta - theta.diagonal(dim1=-2, dim2=-1).mean(-1)[:, None, None] * eye
    theta = theta * (theta_norm / theta.flatten(1).norm(dim=1))[:, None, None]
    w_scale = 1.0 / math.sqrt(d) if w_scale is None else w_scale
    w = w_scale * torch.randn(m, d, d, generator=generator, device=device, dtype=DTYPE)
    return theta, w


# --------------------------------------------------------------------------------------------
# phase 1: the first moment
# --------------------------------------------------------------------------------------------
def first_moment_linear(theta, k: int) -> torch.Tensor:
    """First-order expansion of ``M(Theta) = E[X^T softmax(X Theta X^T) X]`` (chapter 2):

    .. math:: M(\\Theta) = I + (1 - 1/k)\\big[(k-1)\\Theta + \\operatorname{tr}(\\Theta) I
              + (\\Theta + \\Theta^\\top)\\circ(J - I)\\big] + O(\\|\\Theta\\|^2).

    ``theta`` has shape ``(..., d, d)``; returns the same shape.
    """
    theta = _t(theta)
    d = theta.shape[-1]
    eye = torch.eye(d, dtype=DTYPE, device=theta.device)
    tr = theta.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None]
    off = (theta + theta.transpose(-1, -2)) * (1.0 - eye)
    return eye + (1.0 - 1.0 / k) * ((k - 1) * theta + tr * eye + off)


def attention_moment(X: torch.Tensor, theta: torch.Tensor, batches: int = 10):
    """Monte Carlo estimate of ``M(Theta) = E[X^T softmax(X Theta X^T) X]`` with a control variate.

    ``X^T (J/k) X`` has expectation exactly ``I``; subtracting it removes most of the noise.
    Returns ``(mean, stderr)``, each ``(..., d, d)``; the standard error comes from ``batches``
    batch means.
    """
    X = _t(X)
    n, k, _ = X.shape
    S = attention_weights(X, _t(theta, X.device)[..., None, :, :])[..., 0, :, :]  # (..., n, k, k)
    S = S - 1.0 / k
    per = torch.einsum("nad,...nab,nbe->...nde", X, S, X)  # (..., n, d, d)
    eye = torch.eye(X.shape[-1], dtype=DTYPE, device=X.device)
    nb = max(1, min(batches, n))
    chunks = per[..., : (n // nb) * nb, :, :].unflatten(-3, (nb, n // nb)).mean(-3)
    mean = per.mean(-3) + eye
    stderr = chunks.std(-3) / math.sqrt(nb)
    return mean, stderr


def crude_sum_estimate(X, Y) -> torch.Tensor:
    """Phase 1: ``M_hat = (1/N) sum_n X_n^T Y_n``, an estimate of ``sum_i M(Theta_i) W_i``;
    it equals ``sum_i W_i`` only when ``k ||Theta_i|| << 1`` (see :func:`first_moment_linear`)."""
    X, Y = _t(X), _t(Y)
    return torch.einsum("nad,nae->de", X, Y) / X.shape[0]


# --------------------------------------------------------------------------------------------
# exact sub-problems: one head, known projections
# --------------------------------------------------------------------------------------------
def attention_from_outputs(X, Y, w) -> torch.Tensor:
    """Unmix the attention rows of every head when all projections are known (needs ``mk <= d``).

    Row ``a`` of the output is ``y_a = sum_i W_i^T X^T s_a^{(i)}``: ``d`` linear equations in the
    ``mk`` unknown weights. Returns ``S`` of shape ``(n, m, k, k)`` (least-squares solution).
    """
    X, Y = _t(X), _t(Y)
    w = _t(w, X.device)
    n, k, d = X.shape
    m = w.shape[0]
    # D[n] = [W_1^T X^T | ... | W_m^T X^T]  (d, m k)
    D = torch.einsum("mde,nbd->nemb", w, X).reshape(n, d, m * k)
    sol = torch.linalg.lstsq(D, Y.transpose(1, 2)).solution  # (n, m k, k): columns are rows a
    return sol.reshape(n, m, k, k).permute(0, 1, 3, 2)


def theta_from_attention(X, S, min_weight: float = 1e-7) -> torch.Tensor:
    """Second regression of the single-head recovery: log-ratios are linear in ``Theta``.

    ``log s_ab - log s_ac = <Theta, x_a (x_b - x_c)^T>``; every row ``a`` is compared with its
    largest weight ``c``, keeping only weights ``>= min_weight`` (tiny weights have inaccurate
    logarithms). ``S`` has shape ``(n, k, k)``; returns ``Theta`` ``(d, d)``.
    """
    X, S = _t(X), _t(S)
    n, k, d = X.shape
    c = S.argmax(-1)  # (n, k) reference key of every row
    s_ref = S.gather(-1, c[..., None])  # (n, k, 1)
    x_ref = X[torch.arange(n, device=X.device)[:, None], c]  # (n, k, d)
    keep = (S >= min_weight) & (torch.arange(k, device=X.device) != c[..., None])
    lhs = torch.log(S.clamp_min(1e-300)) - torch.log(s_ref)  # (n, a, b)
    feats = torch.einsum("nad,nabe->nabde", X, X[:, None, :, :] - x_ref[:, :, None, :])
    A = feats[keep].reshape(-1, d * d)
    b = lhs[keep]
    return torch.linalg.lstsq(A, b[:, None]).solution.reshape(d, d)


def inverse_projection_from_rowsums(X, Y) -> torch.Tensor:
    """One head: recover ``V = W^{-1}`` from the fact that attention rows sum to one.

    With ``p = X^T (X X^T)^{-1} 1`` (so ``X p = 1``), every row satisfies ``y_a^T V p = 1``: one
    linear equation in the ``d^2`` entries of ``V`` per row, ``N k`` in all. Examples whose
    ``X X^T`` is badly conditioned (repeated tokens) are skipped. Returns ``V`` ``(d, d)``.
    """
    X, Y = _t(X), _t(Y)
    n, k, d = X.shape
    G = X @ X.transpose(1, 2)
    ok = torch.linalg.cond(G) < 1e8
    X, Y, G = X[ok], Y[ok], G[ok]
    ones = torch.ones(X.shape[0], k, 1, dtype=DTYPE, device=X.device)
    p = X.transpose(1, 2) @ torch.linalg.solve(G, ones)  # (n, d, 1)
    A = torch.einsum("nad,ne->nade", Y, p[..., 0]).reshape(-1, d * d)
    b = torch.ones(A.shape[0], dtype=DTYPE, device=X.device)
    return torch.linalg.lstsq(A, b[:, None]).solution.reshape(d, d)


def recover_single_head(X, Y):
    """Exact recovery of one head (book's construction, chapter 2), noise-free data, ``k <= d``.

    1. ``V = W^{-1}`` from the row-sum regression (:func:`inverse_projection_from_rowsums`);
    2. attention rows ``S = Y V X^T (X X^T)^{-1}`` (:func:`attention_from_outputs`);
    3. ``Theta`` from the log-ratio regression (:func:`theta_from_attention`);
    4. ``W`` refitted by least squares given ``Theta`` (:func:`lstsq_projections`).

    Returns ``theta, w`` of shape ``(1, d, d)``.
    """
    X, Y = _t(X), _t(Y)
    ok = torch.linalg.cond(X @ X.transpose(1, 2)) < 1e8  # drop repeated / dependent tokens
    X, Y = X[ok], Y[ok]
    V = inverse_projection_from_rowsums(X, Y)
    W0 = torch.linalg.inv(V)
    S = attention_from_outputs(X, Y, W0[None])[:, 0]
    theta = theta_from_attention(X, S)[None]
    w, _ = lstsq_projections(X, Y, theta)
    return theta, w


# --------------------------------------------------------------------------------------------
# phases 2-3: certified events, refined sum, the sculpted convex body
# --------------------------------------------------------------------------------------------
def _has_duplicates(X) -> torch.Tensor:
    """``(n,)`` mask of sequences in which two tokens coincide (their events carry no margin)."""
    k = X.shape[1]
    same = (X[:, :, None, :] == X[:, None, :, :]).all(-1)
    return (same & ~torch.eye(k, dtype=torch.bool, device=X.device)).any(-1).any(-1)


def certify_events(X, Y, w_sum, tol: float):
    """Certify rows that look like "every head copies token b": ``||W^{-T} y_a - x_b||_inf <= tol``.

    Sequences with a repeated token are skipped (a split between equal keys mimics a copy).
    Returns ``(events, residual)``: ``events`` is an int tensor ``(E, 3)`` of ``(n, a, b)`` and
    ``residual`` the ``(n, k)`` distances to the nearest token (``inf`` where skipped).
    """
    X, Y = _t(X), _t(Y)
    U = torch.linalg.solve(_t(w_sum, X.device).T, Y.transpose(1, 2)).transpose(1, 2)  # Y W^{-1}
    dist = (U[:, :, None, :] - X[:, None, :, :]).abs().amax(-1)  # (n, a, b)
    resid, b = dist.min(-1)
    resid = torch.where(_has_duplicates(X)[:, None], torch.inf, resid)
    na = torch.nonzero(resid <= tol)
    events = torch.cat([na, b[na[:, 0], na[:, 1]][:, None]], dim=1)
    return events, resid


def oracle_events(X, theta, eta: float) -> torch.Tensor:
    """Events computed from the true heads: rows where every head puts mass ``>= 1 - eta`` on the
    same key. Returns ``(E, 3)`` of ``(n, a, b)``. (A device for figures, not a learner.)"""
    S = attention_weights(_t(X), _t(theta, X.device))  # (n, m, k, k)
    smin = S.amin(1)  # (n, k, k)
    top, b = smin.max(-1)
    top = torch.where(_has_duplicates(X)[:, None], -1.0, top)
    na = torch.nonzero(top >= 1.0 - eta)
    return torch.cat([na, b[na[:, 0], na[:, 1]][:, None]], dim=1)


def token_regression_sum(X, Y) -> torch.Tensor:
    """A second first-moment estimate of ``sum_i W_i``: regress every output row on its own token
    and on the other tokens, ``y_a ~ C_self^T x_a + sum_{c != a} C_other^T x_c``, and return
    ``C_self + (k - 1) C_other`` (exact if the attention weights did not depend on ``X``)."""
    X, Y = _t(X), _t(Y)
    n, k, d = X.shape
    own = X.reshape(n * k, d)
    rest = (X.sum(1, keepdim=True) - X).reshape(n * k, d)
    C = torch.linalg.lstsq(torch.cat([own, rest], 1), Y.reshape(n * k, d)).solution
    return C[:d] + (k - 1) * C[d:]


def refine_sum_estimate(X, Y, starts, schedule=(0.1, 0.05, 0.02, 0.01), rounds: int = 10,
                        tol: float = 1e-2):
    """Phase 3 (book's version): refine ``sum_i W_i`` from rows that copy one token.

    A row in which every head attends (almost) only to key ``b`` satisfies ``y_a = W^T x_b`` with
    ``W = sum_i W_i``. From each starting estimate in ``starts`` (e.g. :func:`crude_sum_estimate`
    and :func:`token_regression_sum`), every round assigns each row its best-fitting key, keeps the
    fraction ``keep`` of rows with the smallest residual ``||y_a - W^T x_b||`` and refits ``W`` on
    them by least squares (trimmed least squares); the kept fraction shrinks along ``schedule``.
    Of the refined estimates, the one under which most rows are copies within ``tol`` (see
    :func:`certify_events`) is returned, ``(d, d)``. A heuristic: it can stall far from the truth.
    """
    X, Y = _t(X), _t(Y)
    n, k, d = X.shape
    Yf = Y.reshape(n * k, d)
    best = (-1, None)
    for w0 in starts:
        w = _t(w0, X.device)
        for keep in schedule:
            for _ in range(rounds):
                pred = torch.einsum("nbd,de->nbe", X, w)  # W^T x_b for every key
                dist = ((Y[:, :, None, :] - pred[:, None, :, :]) ** 2).sum(-1)  # (n, a, b)
                resid, b = dist.flatten(0, 1).min(-1)
                sel = resid.argsort()[: max(2 * d, int(keep * resid.numel()))]
                w = torch.linalg.lstsq(X[sel // k, b[sel]], Yf[sel]).solution
        try:
            copies = int((certify_events(X, Y, w, tol)[1] <= tol).sum())
        except RuntimeError:  # singular estimate
            copies = -1
        if copies > best[0]:
            best = (copies, w)
    return best[1] if best[1] is not None else _t(starts[0], X.device)


def sum_estimate(X, Y):
    """Phases 1 and 3 without an oracle: an estimate of ``W = sum_i W_i`` and of its error.

    Starting points of the refinement (:func:`refine_sum_estimate`) are the first moment
    (:func:`crude_sum_estimate`), the token regression (:func:`token_regression_sum`) and the
    inverse of the row-sum regression (:func:`inverse_projection_from_rowsums`, exact for one
    head). The error is estimated by refining the two halves of the data separately:
    ``err_hat = ||W_hat^{-T} (W_A - W_B)^T||_{inf->inf} / 2``, the largest distance by which the
    disagreement of the halves can move ``W^{-T} y`` for a token ``y = W^T x`` of the cube
    (half of it, since each half has twice the variance of the whole). On each half the final
    trimmed refit is repeated once from ``w_hat``, so a stall of the search is not counted.

    Returns ``(w_hat, err_hat)``: a ``(d, d)`` tensor and a float.
    """
    X, Y = _t(X), _t(Y)

    def one(Xs, Ys):
        starts = [crude_sum_estimate(Xs, Ys), token_regression_sum(Xs, Ys)]
        try:
            starts.append(torch.linalg.inv(inverse_projection_from_rowsums(Xs, Ys)))
        except RuntimeError:  # singular: no row-sum start
            pass
        return refine_sum_estimate(Xs, Ys, starts)

    w_hat = one(X, Y)
    # the final trimmed refit, repeated on each half from w_hat: its spread is the estimate's error
    w_a, w_b = (refine_sum_estimate(X[h::2], Y[h::2], [w_hat], schedule=(0.01,), rounds=1)
                for h in (0, 1))
    try:
        gap = torch.linalg.solve(w_hat.T, (w_a - w_b).T)  # W_hat^{-T} (W_A - W_B)^T
        err = 0.5 * float(gap.abs().sum(1).max())
    except RuntimeError:
        err = math.inf
    return w_hat, err


def certification_tolerance(eta: float, sum_error: float) -> float:
    """Tolerance of :func:`certify_events` derived from the margin ``eta`` and the estimated error
    of ``sum_i W_i``: ``tol = eta + sum_error``.

    If every head moves mass ``mu`` from key ``b`` to one other key ``c`` and the heads share one
    projection, ``W^{-T} y_a = x_b + mu (x_c - x_b)`` is at infinity-distance ``2 mu`` from ``x_b``;
    ``tol = eta`` therefore admits rows with ``mu <= eta / 2``, a factor two inside the events
    ``mu <= eta`` whose halfspaces (margin ``log((1-eta)/eta)``) are added to the body. An error
    ``sum_error`` of the estimate moves ``W_hat^{-T} y_a`` by at most ``sum_error``.
    """
    check_float("eta", eta, minimum=0.0, maximum=0.5, strict=True)
    check_float("sum_error", sum_error, minimum=0.0)
    return float(eta + sum_error)


def constraint_matrix(X, events, eta: float):
    """Halfspaces of the sculpted body from certified events.

    An event ``(n, a, b)`` says every head puts mass ``>= 1 - eta`` on key ``b`` in row ``a``, hence
    ``<Theta_i, x_a (x_b - x_c)^T> >= tau = log((1 - eta) / eta)`` for every other key ``c``.
    Returns ``(A, tau)`` with ``A`` a float64 NumPy array ``(E (k-1), d*d)``.
    """
    X = _t(X)
    ev = torch.as_tensor(events, device=X.device).long()
    n, k, d = X.shape
    if ev.numel() == 0:
        return np.zeros((0, d * d)), math.log((1 - eta) / eta)
    xa = X[ev[:, 0], ev[:, 1]]  # (E, d)
    xb = X[ev[:, 0], ev[:, 2]]
    others = torch.arange(k, device=X.device)[None, :].expand(len(ev), k)
    mask = others != ev[:, 2:3]
    xc = X[ev[:, 0:1].expand(-1, k)[mask].reshape(-1, k - 1), others[mask].reshape(-1, k - 1)]
    diff = xb[:, None, :] - xc  # (E, k-1, d)
    A = torch.einsum("ed,ecf->ecdf", xa, diff).reshape(-1, d * d)
    return A.cpu().numpy(), math.log((1 - eta) / eta)


class Body:
    """The convex polyhedron ``K = {Theta : A vec(Theta) >= tau}`` carved out by certified events.

    It contains ``{sum_i lambda_i Theta_i : lambda >= 0, sum lambda >= 1}`` whenever every event is
    genuine (chapter 2). Points are ``(d, d)`` arrays or tensors, flattened row-major.
    """

    def __init__(self, A: np.ndarray, tau: float):
        self.A = np.asarray(A, dtype=np.float64)
        self.tau = float(tau)
        self.dim = self.A.shape[1]

    def slack(self, theta) -> np.ndarray:
        """``A vec(Theta) - tau`` for every constraint (``>= 0`` inside); ``theta`` ``(..., d, d)``."""
        t = np.asarray(theta.cpu() if isinstance(theta, torch.Tensor) else theta, dtype=np.float64)
        return t.reshape(*t.shape[:-2], self.dim) @ self.A.T - self.tau

    def contains(self, theta, tol: float = 1e-9):
        """Membership: ``True`` where every constraint holds up to ``tol``."""
        return (self.slack(theta) >= -tol).all(-1)

    def extent(self, center, direction) -> float:
        """Largest ``t >= 0`` with ``center + t * direction`` in ``K`` (``inf`` if unbounded)."""
        c = np.asarray(center, dtype=np.float64).ravel()
        u = np.asarray(direction, dtype=np.float64).ravel()
        s = self.A @ c - self.tau
        rate = self.A @ u
        neg = rate < 0
        if not neg.any():
            return math.inf
        return float(max(0.0, np.min(s[neg] / -rate[neg])))

    def cross_section(self, center, e1, e2, angles: int = 360, radius: float = 1e3):
        """Boundary of the 2-D section ``{center + u e1 + v e2} cap K`` seen from ``center``.

        ``center`` must lie inside. Returns ``(u, v)`` arrays of the boundary polygon (rays are
        cut at ``radius`` where the section is unbounded).
        """
        e1 = np.asarray(e1, dtype=np.float64).ravel()
        e2 = np.asarray(e2, dtype=np.float64).ravel()
        phi = np.linspace(0, 2 * np.pi, angles, endpoint=False)
        r = np.array([min(radius, self.extent(center, np.cos(p) * e1 + np.sin(p) * e2))
                      for p in phi])
        return r * np.cos(phi), r * np.sin(phi)

    def min_norm_point(self) -> np.ndarray:
        """The point of ``K`` of least Frobenius norm (least-distance programming via NNLS).

        Solves ``min ||theta||^2 s.t. A theta >= tau`` through its dual: with
        ``E = [A^T; tau 1^T]`` and ``u = argmin_{u >= 0} ||E u - e_last||``, the residual
        ``r = E u - e_last`` gives ``theta = -r[:-1] / r[-1]`` (Lawson and Hanson, ch. 23).
        Returns a ``(d*d,)`` array.
        """
        E = np.vstack([self.A.T, self.tau * np.ones((1, self.A.shape[0]))])
        f = np.zeros(self.dim + 1)
        f[-1] = 1.0
        u, _ = nnls(E, f, maxiter=50 * E.shape[1])  # Lawson-Hanson active set
        r = E @ u - f
        if abs(r[-1]) < 1e-12:
            raise ValueError("the body is empty (certified constraints are inconsistent)")
        return -r[:-1] / r[-1]

    def vertex(self, c, bound: float) -> np.ndarray:
        """Minimise the linear functional ``<c, Theta>`` over ``K cap [-bound, bound]^{d x d}``
        with scipy's HiGHS solver. Returns the minimiser ``(d*d,)``."""
        res = linprog(np.asarray(c, dtype=np.float64).ravel(), A_ub=-self.A,
                      b_ub=-self.tau * np.ones(self.A.shape[0]), bounds=(-bound, bound),
                      method="highs")
        if res.status != 0:
            raise ValueError(f"vertex LP failed: {res.message}")
        return res.x


# --------------------------------------------------------------------------------------------
# phase 5: least squares for W, enumeration, polishing
# --------------------------------------------------------------------------------------------
def lstsq_projections(X, Y, theta, ridge: float = 0.0):
    """Least squares for the projections given the attention matrices.

    ``F`` is linear in the ``W_i``: ``Y = sum_i (S_i X) W_i``, so with the design
    ``D = [S_1 X | ... | S_m X]`` (``n k`` rows, ``m d`` columns) every output column is one
    regression. ``theta`` may carry leading candidate dimensions ``(..., m, d, d)``.

    Returns ``(w, rel_residual)``: ``w`` ``(..., m, d, d)`` and the relative training residual
    ``||Y - F||^2 / ||Y||^2`` of shape ``(...)``.
    """
    X, Y = _t(X), _t(Y)
    theta = _t(theta, X.device)
    n, k, d = X.shape
    m = theta.shape[-3]
    S = attention_weights(X, theta)  # (..., n, m, k, k)
    SX = torch.einsum("...nmab,nbd->...namd", S, X)
    D = SX.reshape(*SX.shape[:-4], n * k, m * d)
    Yf = Y.reshape(n * k, d)
    G = D.transpose(-1, -2) @ D
    if ridge > 0:
        G = G + ridge * torch.eye(m * d, dtype=DTYPE, device=X.device)
    rhs = D.transpose(-1, -2) @ Yf
    sol = torch.linalg.solve(G, rhs)  # (..., m d, d)
    resid = ((D @ sol - Yf) ** 2).sum((-1, -2)) / (Yf**2).sum()
    return sol.reshape(*sol.shape[:-2], m, d, d), resid


def enumerate_heads(X, Y, basis, center, width: float, grid: int, zooms: int = 0,
                    chunk: int = 2048, keep: int = 4):
    """Phase 5 net: try ``Theta_i = sum_j C_ij B_j`` for ``C`` on a grid, regress the ``W``'s.

    Parameters
    ----------
    basis : ``(m, d, d)`` spanning the heads; center : ``(m, m)`` coefficients at the middle of the
    net; width : half-width of the net per coefficient; grid : points per coefficient axis.

    Returns ``(theta, w, residual, n_candidates, seconds, runners_up)``: the best candidate, its
    projections and relative residual, the number of candidates tried, the time taken and the
    ``keep`` next-best candidates of the coarse net ``(keep, m, d, d)`` (starting points for local
    search). The net has ``grid ** (m*m)`` points: the step whose cost grows like ``G^{m^2}``.
    """
    X, Y = _t(X), _t(Y)
    basis = _t(basis, X.device)
    center = _t(center, X.device)
    m = basis.shape[0]
    t0 = time.perf_counter()
    best = (math.inf, None, center)
    count = 0
    coarse = []
    for round_ in range(zooms + 1):
        axis = torch.linspace(-width, width, grid, dtype=DTYPE, device=X.device)
        mesh = torch.cartesian_prod(*([axis] * (m * m))).reshape(-1, m, m) + best[2]
        count += mesh.shape[0]
        for start in range(0, mesh.shape[0], chunk):
            C = mesh[start:start + chunk]
            th = torch.einsum("cij,jde->cide", C, basis)
            _, res = lstsq_projections(X, Y, th, ridge=1e-10)
            if round_ == 0:
                coarse.append(res)
            j = int(res.argmin())
            if float(res[j]) < best[0]:
                best = (float(res[j]), th[j], C[j])
        if round_ == 0:
            order = torch.cat(coarse).argsort()[1: keep + 1]
            runners_up = torch.einsum("cij,jde->cide", mesh[order], basis)
        width = width * 2.0 / max(grid - 1, 1)
    seconds = time.perf_counter() - t0
    w, res = lstsq_projections(X, Y, best[1])
    return best[1], w, float(res), count, seconds, runners_up


def polish_heads(X, Y, theta0, iterations: int = 200):
    """Local refinement by variable projection: L-BFGS on the ``Theta_i`` with the ``W_i`` solved
    exactly by least squares at every step. Returns ``theta, w`` ``(m, d, d)``."""
    X, Y = _t(X), _t(Y)
    theta = _t(theta0, X.device).clone().requires_grad_(True)
    opt = torch.optim.LBFGS([theta], lr=1.0, max_iter=iterations, tolerance_grad=1e-14,
                            tolerance_change=1e-20, history_size=50,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        _, res = lstsq_projections(X, Y, theta, ridge=1e-12)
        res.backward()
        return res

    opt.step(closure)
    theta = theta.detach()
    w, _ = lstsq_projections(X, Y, theta)
    return theta, w


def _kmeans_directions(V: np.ndarray, m: int, seed: int = 0) -> np.ndarray:
    """Cluster vectors into ``m`` groups (farthest-point start, a few Lloyd steps); returns the
    ``(m, D)`` cluster means."""
    if m == 1:
        return V.mean(0, keepdims=True)
    centers = [V[0]]
    for _ in range(1, m):
        dist = np.min([((V - c) ** 2).sum(1) for c in centers], axis=0)
        centers.append(V[int(dist.argmax())])
    centers = np.array(centers)
    for _ in range(20):
        lab = np.argmin(((V[:, None, :] - centers[None]) ** 2).sum(-1), axis=1)
        centers = np.array([V[lab == j].mean(0) if (lab == j).any() else centers[j]
                            for j in range(m)])
    return centers


def recover_heads(X, Y, m: int, eta: float = 0.05, grid: int = 7, n_directions: int = 8,
                  polish_iterations: int = 300, seed: int = 0, w_sum=None,
                  cert_tol: float | None = None, zooms: int = 1, net_examples: int = 100,
                  polish_examples: int = 1000, restarts: int = 2, polish: bool = True):
    """The whole (simplified, reconstructed) pipeline of chapter 2 on examples ``(X, Y)``.

    1. crude ``sum W_i`` (first moment); 2. refined ``sum W_i`` from rows that copy one token;
    3. certified events and the body ``K``; its minimum-norm point; 4. vertices of ``K`` by LPs
    with objectives near the minimum-norm point, clustered into ``m`` head estimates spanning the
    heads; 5. a net of ``grid^(m^2)`` coefficient matrices in that span with least squares for the
    ``W_i``, the best one polished by variable projection (and, if that does not fit the data to
    round-off, up to ``restarts`` runners-up of the net as further starting points).

    Steps 1-2 use the data only (:func:`sum_estimate`); ``w_sum`` replaces them by a given sum
    (an oracle control, not used by the learner). The certification tolerance is
    :func:`certification_tolerance` of ``eta`` and the estimated error of the sum unless
    ``cert_tol`` is given. With ``polish=False`` the phases stop at the net (``theta`` is the net's
    best candidate). Returns a dict with the heads (``theta``, ``w``) and diagnostics of every
    phase.
    """
    X, Y = _t(X), _t(Y)
    n, k, d = X.shape
    out = {}
    crude = crude_sum_estimate(X, Y)
    if w_sum is None:
        w_hat, sum_err = sum_estimate(X, Y)
    else:
        w_hat, sum_err = _t(w_sum, X.device), 0.0
    if cert_tol is None:
        cert_tol = certification_tolerance(eta, sum_err)
    out.update(crude_sum=crude, w_sum=w_hat, sum_error=sum_err, cert_tol=cert_tol)
    if cert_tol >= 0.5:  # rows within 1/2 of two tokens: certification carries no information
        raise ValueError(f"certification tolerance {cert_tol:.3g} >= 1/2: the estimate of "
                         "sum_i W_i is too poor to certify events")
    events, _ = certify_events(X, Y, w_hat, tol=cert_tol)
    out["events"] = events
    if len(events) < 2:
        raise ValueError(f"only {len(events)} certified events: too few examples")
    A, tau = constraint_matrix(X, events, eta)
    body = Body(A, tau)
    out["body"] = body
    p0 = body.min_norm_point()
    out["min_norm_point"] = p0
    rng = np.random.default_rng(seed)
    bound = 4.0 * float(np.linalg.norm(p0)) + 1.0
    verts = []
    for _ in range(n_directions if m > 1 else 1):
        g = rng.standard_normal(p0.size)
        g -= (g @ p0) / (p0 @ p0) * p0
        c = p0 / np.linalg.norm(p0) + (0.5 if m > 1 else 0.0) * g / np.linalg.norm(g)
        verts.append(body.vertex(c, bound))
    heads0 = _kmeans_directions(np.array(verts), m)  # (m, d*d)
    q, r = np.linalg.qr(heads0.T)  # orthonormal basis of the span
    basis = q.T.reshape(m, d, d)
    center = (heads0 @ q)  # (m, m) coefficients of the head estimates
    width = 0.5 * float(np.abs(center).max())
    sub = slice(0, min(n, net_examples))  # the net is scored on a subsample
    theta_net, _, res_net, ncand, secs, others = enumerate_heads(
        X[sub], Y[sub], basis, center, width, grid, zooms=zooms, keep=restarts)
    out.update(net_residual=res_net, n_candidates=ncand, enumeration_seconds=secs,
               theta_vertices=torch.as_tensor(heads0.reshape(m, d, d)), theta_net=theta_net)
    fit = slice(0, min(n, polish_examples))
    if not polish:
        out["theta"] = theta_net
        out["w"] = out["w_net"] = lstsq_projections(X[fit], Y[fit], theta_net)[0]
        out["polish_starts"] = 0
        return out
    best = (math.inf, None, None)
    out["polish_starts"] = 0
    for start in [theta_net, *others]:  # local search from the best net points
        theta, w = polish_heads(X[fit], Y[fit], start, iterations=polish_iterations)
        _, res = lstsq_projections(X[fit], Y[fit], theta)
        out["polish_starts"] += 1
        if out["polish_starts"] == 1:  # the polish started from the net's output alone
            out["theta_first_polish"], out["w_first_polish"] = theta, w
        if float(res) < best[0]:
            best = (float(res), theta, w)
        if best[0] < 1e-16:
            break
    out["theta"], out["w"] = best[1], best[2]
    out["w_net"] = lstsq_projections(X[fit], Y[fit], theta_net)[0]
    return out


def random_start_search(X, Y, m: int, starts: int, theta_norm: float,
                        generator: torch.Generator | None = None, iterations: int = 300,
                        examples: int = 1000):
    """Local search alone (the ablation of chapter 2): :func:`polish_heads` from ``starts`` random
    Gaussian starting points with ``||Theta_i||_F = theta_norm``, no body, no net, no estimate of
    ``sum_i W_i``; the start with the smallest training residual is kept.

    Returns ``(theta, w, residual)``.
    """
    X, Y = _t(X), _t(Y)
    n, _, d = X.shape
    fit = slice(0, min(n, examples))
    best = (math.inf, None, None)
    for _ in range(starts):
        th0 = torch.randn(m, d, d, generator=generator, device=X.device, dtype=DTYPE)
        th0 = th0 * (theta_norm / th0.flatten(1).norm(dim=1))[:, None, None]
        theta, w = polish_heads(X[fit], Y[fit], th0, iterations=iterations)
        res = float(lstsq_projections(X[fit], Y[fit], theta)[1])
        if res < best[0]:
            best = (res, theta, w)
        if res < 1e-16:
            break
    return best[1], best[2], best[0]


# --------------------------------------------------------------------------------------------
# the body in the limit of infinitely many examples
# --------------------------------------------------------------------------------------------
def cube_tokens(d: int, device=None) -> torch.Tensor:
    """All ``2^d`` points of ``{-1,+1}^d`` as a float64 tensor ``(2^d, d)``."""
    check_int("d", d, minimum=1, maximum=16)
    idx = torch.arange(2**d, device=device)
    bits = (idx[:, None] >> torch.arange(d - 1, -1, -1, device=device)) & 1
    return bits.to(DTYPE) * 2.0 - 1.0


def limit_events(theta, eta: float, k: int = 3):
    """Every halfspace that oracle-certified events can ever add: the body at ``N = infinity``.

    A sequence's row ``a`` depends on the query token and the set of the other ``k - 1`` tokens
    (sequences with a repeated token are skipped, as in :func:`oracle_events`). Enumerating the
    query ``q`` and all sets of ``k - 1`` other distinct tokens of the cube, a row is an event
    when every head puts mass ``>= 1 - eta`` on one key ``b``; it adds the halfspaces
    ``<Theta, x_q (x_b - x_c)^T> >= tau`` for the other keys ``c``. Since the cube is finite, the
    set of such triples ``(q, b, c)`` is finite and the body converges to the polyhedron they
    define. Cost: ``2^d * C(2^d - 1, k - 1)`` rows.

    Returns an int64 tensor ``(E, 3)`` of distinct token indices ``(q, b, c)`` into
    :func:`cube_tokens`.
    """
    theta = _t(theta)
    d = theta.shape[-1]
    check_int("k", k, minimum=2, maximum=4)
    T = cube_tokens(d, theta.device)
    P = torch.einsum("qd,mde,be->mqb", T, theta, T)  # all scores (m, 2^d, 2^d)
    n = T.shape[0]
    combos = torch.combinations(torch.arange(n, device=theta.device), k - 1)  # (C, k-1)
    active = torch.zeros(n, n, n, dtype=torch.bool, device=theta.device)
    for q in range(n):
        others = combos[(combos != q).all(1)]
        keys = torch.cat([torch.full((len(others), 1), q, device=theta.device), others], 1)
        S = torch.softmax(P[:, q][:, keys], dim=-1).amin(0)  # (C, k): least mass over heads
        top, b = S.max(-1)
        hit = top >= 1.0 - eta
        if not hit.any():
            continue
        kh, bh = keys[hit], b[hit]
        kb = kh.gather(1, bh[:, None])  # winner
        for j in range(k):
            sel = bh != j
            active[q, kb[sel, 0], kh[sel, j]] = True
    return torch.nonzero(active)


class CubeBody:
    """The body of :func:`limit_events` (``N = infinity``): ``K = {Theta : x_q^T Theta (x_b - x_c)
    >= tau}`` over the enumerated triples, evaluated through score tables ``T Theta T^T`` of the
    ``2^d`` tokens instead of a constraint matrix. Offers the same queries as :class:`Body`."""

    def __init__(self, triples, tau: float, d: int):
        self.triples = torch.as_tensor(triples).long().cpu()
        self.tau = float(tau)
        self.d = d
        self.tokens = cube_tokens(d)

    def _lin(self, theta) -> np.ndarray:
        t = _t(np.asarray(theta, dtype=np.float64).reshape(self.d, self.d))
        P = self.tokens @ t @ self.tokens.T
        q, b, c = self.triples.unbind(1)
        return (P[q, b] - P[q, c]).numpy()

    def slack(self, theta) -> np.ndarray:
        """``<Theta, x_q (x_b - x_c)^T> - tau`` for every halfspace (``>= 0`` inside)."""
        return self._lin(theta) - self.tau

    def contains(self, theta, tol: float = 1e-9) -> bool:
        return bool((self.slack(theta) >= -tol).all())

    def extent(self, center, direction) -> float:
        """Largest ``t >= 0`` with ``center + t * direction`` in ``K`` (``inf`` if unbounded)."""
        s, rate = self.slack(center), self._lin(direction)
        neg = rate < 0
        if not neg.any():
            return math.inf
        return float(max(0.0, np.min(s[neg] / -rate[neg])))

    cross_section = Body.cross_section  # the same ray casting, on this body's extent


# --------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------
def relative_test_error(X, theta_hat, w_hat, theta, w) -> torch.Tensor:
    """``E||F_hat(X) - F(X)||^2 / E||F(X) - E F(X)||^2`` on the examples ``X`` (leading batch
    dimensions of the estimated heads give a batch of errors)."""
    X = _t(X)
    F = mha_forward(X, theta, w)
    Fh = mha_forward(X, theta_hat, w_hat)
    num = ((Fh - F) ** 2).sum((-1, -2, -3))
    den = ((F - F.mean(0)) ** 2).sum()
    return num / den


def matched_errors(theta_hat, w_hat, theta, w):
    """Permutation-matched parameter errors
    ``min_pi max_i ||Theta_hat_pi(i) - Theta_i||_F / ||Theta_i||_F`` (and the same for ``W``, with
    the permutation that is best for ``Theta``). Returns ``(err_theta, err_w)`` floats."""
    import itertools

    th, wh, t0, w0 = (_t(a).cpu() for a in (theta_hat, w_hat, theta, w))
    m = t0.shape[0]
    best = (math.inf, math.inf)
    for perm in itertools.permutations(range(m)):
        p = list(perm)
        et = ((th[p] - t0).flatten(1).norm(dim=1) / t0.flatten(1).norm(dim=1)).max().item()
        ew = ((wh[p] - w0).flatten(1).norm(dim=1) / w0.flatten(1).norm(dim=1)).max().item()
        if et < best[0]:
            best = (et, ew)
    return best


# --------------------------------------------------------------------------------------------
# gradient descent baseline
# --------------------------------------------------------------------------------------------
def train_adam(X, Y, m: int, seeds: int, steps: int, lr: float = 3e-3, batch: int = 512,
               init_scale: float = 0.1, init=None, generator: torch.Generator | None = None,
               X_test=None, Y_test=None, log_every: int = 100, plateau: tuple | None = None):
    """Adam on the square loss, ``seeds`` independent models trained side by side.

    The parameters are stacked ``(seeds, m, d, d)``; since Adam acts coordinate-wise and the
    loss is a sum over seeds, this is exactly ``seeds`` separate runs sharing minibatches.
    ``init=(theta, w)`` gives starting points ``(seeds, m, d, d)`` (warm start); otherwise
    ``N(0, init_scale^2)``. Returns a dict with the final ``theta``, ``w`` and the curve of
    relative test errors ``(log points, seeds)`` measured on ``(X_test, Y_test)``.

    ``plateau=(window, rel)`` stops early, at a logged step, once for every seed the smallest
    test error of the last ``window`` steps is not ``rel`` (relatively) below the smallest one
    before them; ``steps`` is then a cap. The dict's ``"stopped"`` is the last step taken.
    """
    X, Y = _t(X), _t(Y)
    n, k, d = X.shape
    dev = X.device
    if init is None:
        theta = init_scale * torch.randn(seeds, m, d, d, generator=generator, device=dev,
                                         dtype=DTYPE)
        w = init_scale * torch.randn(seeds, m, d, d, generator=generator, device=dev,
                                     dtype=DTYPE)
    else:
        theta, w = (_t(a, dev).clone() for a in init)
    theta.requires_grad_(True)
    w.requires_grad_(True)
    opt = torch.optim.Adam([theta, w], lr=lr)
    Xt = X if X_test is None else _t(X_test, dev)
    Yt = Y if Y_test is None else _t(Y_test, dev)
    var = ((Yt - Yt.mean(0)) ** 2).sum()
    curve, at = [], []
    for step in range(steps + 1):
        if step % log_every == 0 or step == steps:
            with torch.no_grad():
                err = ((mha_forward(Xt, theta, w) - Yt) ** 2).sum((-1, -2, -3)) / var
            curve.append(err.cpu())
            at.append(step)
            if plateau is not None and step >= 2 * plateau[0]:
                back = plateau[0] // log_every
                hist = torch.stack(curve)
                recent, before = hist[-back:].amin(0), hist[:-back].amin(0)
                if bool((recent >= (1.0 - plateau[1]) * before).all()):
                    break
        if step == steps:
            break
        idx = torch.randint(0, n, (batch,), generator=generator, device=dev)
        pred = mha_forward(X[idx], theta, w)
        loss = ((pred - Y[idx]) ** 2).mean((-1, -2, -3)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"theta": theta.detach(), "w": w.detach(), "steps": at,
            "test_error": torch.stack(curve), "stopped": at[-1]}


# --------------------------------------------------------------------------------------------
# the hard family (the book's construction)
# --------------------------------------------------------------------------------------------
def krawtchouk_target(r: int) -> np.ndarray:
    """``g(t)`` for ``t = 2, 4, ..., 2r``: the elementary symmetric polynomial of degree ``2r-1``
    in ``2r`` signs, evaluated when ``q = (2r - t)/2`` of them are ``-1``."""
    vals = []
    for t in range(2, 2 * r + 1, 2):
        q = (2 * r - t) // 2
        vals.append(sum((-1) ** j * math.comb(q, j) * math.comb(2 * r - q, 2 * r - 1 - j)
                        for j in range(0, q + 1)))
    return np.array(vals, dtype=np.float64)


def hard_family(d: int, r: int, support=None, betas=None, device=None,
                hidden_share: float | None = None):
    """The book's hard instance: ``k = 2`` tokens, ``m = r`` heads with collinear attention.

    ``Theta_i = beta_i e_1 1_S^T`` and ``W_i = w_i e_1 e_1^T`` with ``S`` a hidden set of ``r``
    coordinates among ``2..d``. On the slice ``z_1 = -x_1`` the first output equals
    ``-sum_i w_i tanh(beta_i t / 2)`` with ``t = sum_{j in S} (z_j - x_j)``; the ``w_i`` solve
    ``-sum_i w_i tanh(beta_i t/2) = g(t)`` (:func:`krawtchouk_target`), a degree-``(2r-1)``
    parity-like function of ``2r`` hidden bits. Outputs are rescaled to unit variance.

    With ``hidden_share`` given, one more head with ``Theta_0 = 0`` (uniform attention, output
    ``w_0 (x_1 + z_1)/2`` in both rows) sets the ``S``-independent part so that the hidden part
    carries exactly that share of the output variance: ``E[g^2] / (c^2 + E[g^2])`` with ``c`` the
    sum of all ``w``. Then ``m = r + 1``.

    Returns ``theta, w`` ``(m, d, d)`` and the support ``S`` (0-based indices).
    """
    if support is None:
        support = list(range(1, r + 1))
    support = list(support)
    betas = np.linspace(0.3, 1.2, r) if betas is None else np.asarray(betas, dtype=np.float64)
    ts = np.arange(2, 2 * r + 1, 2)
    M = -np.tanh(np.outer(ts, betas) / 2.0)
    wv = np.linalg.solve(M, krawtchouk_target(r))
    theta = torch.zeros(r, d, d, dtype=DTYPE, device=device)
    w = torch.zeros(r, d, d, dtype=DTYPE, device=device)
    for i in range(r):
        theta[i, 0, support] = float(betas[i])
        w[i, 0, 0] = float(wv[i])
    # unit output variance: Var F_{a,1} = (sum w)^2/2 + E[g^2]/2 per row (the two parts are orthogonal)
    q = np.arange(0, 2 * r + 1)
    t_all = 2 * r - 2 * q
    probs = np.array([math.comb(2 * r, int(j)) for j in q]) / 4.0**r
    g_all = np.array([np.sign(t) * krawtchouk_target(r)[abs(t) // 2 - 1] if t != 0 else 0.0
                      for t in t_all])
    eg2 = float((probs * g_all**2).sum())
    c = float(wv.sum())
    if hidden_share is not None:
        check_float("hidden_share", hidden_share, minimum=0.0, maximum=1.0, strict=True)
        c = math.copysign(math.sqrt(eg2 * (1.0 - hidden_share) / hidden_share), c if c else 1.0)
        theta = torch.cat([theta, torch.zeros(1, d, d, dtype=DTYPE, device=device)])
        w0 = torch.zeros(1, d, d, dtype=DTYPE, device=device)
        w0[0, 0, 0] = c - float(wv.sum())
        w = torch.cat([w, w0])
    var = 0.5 * c**2 + 0.5 * eg2
    w = w / math.sqrt(var)
    return theta, w, support


def hard_components(X, theta, w):
    """Split the hard family's output into its ``S``-independent and ``S``-dependent parts.

    For ``k = 2`` tokens ``x, z``, ``F_{1,1} = (sum w)(x_1 + z_1)/2 + h`` and
    ``F_{2,1} = (sum w)(x_1 + z_1)/2 - h`` with ``h = g(t)(1 - x_1 z_1)/2`` (all other outputs
    vanish). Returns ``(independent, dependent)``, both ``(n, k, d)``.
    """
    X = _t(X)
    F = mha_forward(X, theta, w)
    wsum = _t(w, X.device)[:, 0, 0].sum()
    indep = torch.zeros_like(F)
    indep[:, :, 0] = (wsum * (X[:, 0, 0] + X[:, 1, 0]) / 2)[:, None]
    return indep, F - indep
