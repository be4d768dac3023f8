"""Path-path kernels, the renormalised kernel and the predictor built from it (Chapter 4).

.. math:: K(x, x') = \\sum_{\\pi\\pi'} U_{\\pi\\pi'} C_{\\pi\\pi'}(x, x'),\\qquad
          C_{\\pi\\pi'}(x, x') = \\sigma_0^2\\, \\xi_\\pi(x)\\cdot\\xi_{\\pi'}(x') / (N_0 \\mathcal H)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .model import DTYPE


def scaled_features(xi: torch.Tensor, sigma0_sq: float = 1.0) -> torch.Tensor:
    """Scaled features ``xi~ = sigma0 xi / sqrt(N0 n_paths)``.

    Then ``C_{pi pi'}(x,x') = xi~_pi(x) . xi~_pi'(x')``; shape unchanged (batch, paths, N0).
    """
    return math.sqrt(sigma0_sq) * xi / math.sqrt(xi.shape[-1] * xi.shape[-2])


def path_kernels(xt_a: torch.Tensor, xt_b: torch.Tensor) -> torch.Tensor:
    """Path-path kernels ``C_{pi pi'}(x^mu, x^nu)`` from scaled features: (paths, paths, Pa, Pb)."""
    return torch.einsum("mpi,nqi->pqmn", xt_a, xt_b)


def renormalised_kernel(U: torch.Tensor, xt_a: torch.Tensor, xt_b: torch.Tensor) -> torch.Tensor:
    """``K = sum_{pi pi'} U_{pi pi'} C_{pi pi'}`` without forming C: (Pa, Pb)."""
    Ub = torch.einsum("pq,nqi->npi", U, xt_b)
    return xt_a.reshape(xt_a.shape[0], -1) @ Ub.reshape(Ub.shape[0], -1).T


def kernel_diagonal(U: torch.Tensor, xt: torch.Tensor) -> torch.Tensor:
    """``K(x, x)`` for each row of ``xt`` (P,)."""
    return torch.einsum("mpi,pq,mqi->m", xt, U, xt)


def predict(U: torch.Tensor, xt_train: torch.Tensor, Y: torch.Tensor, xt_test: torch.Tensor, T: float):
    """Predictor statistics of GP regression with the renormalised kernel.

    .. math:: \\langle f_*\\rangle = k_*^\\top (K+T)^{-1} Y,\\qquad
              \\langle\\delta f_*^2\\rangle = K_{**} - k_*^\\top (K+T)^{-1} k_*

    Returns ``(mean, variance)``, each (P_test,).
    """
    U = U.to(xt_train.device, DTYPE)
    K = renormalised_kernel(U, xt_train, xt_train)
    k = renormalised_kernel(U, xt_test, xt_train)  # (P_test, P)
    Lc = torch.linalg.cholesky(K + T * torch.eye(K.shape[0], dtype=DTYPE, device=K.device))
    mean = k @ torch.cholesky_solve(Y.to(DTYPE)[:, None], Lc)[:, 0]
    v = torch.linalg.solve_triangular(Lc, k.T, upper=False)
    var = kernel_diagonal(U, xt_test) - (v * v).sum(0)
    return mean, var


def accuracy(mean: torch.Tensor, y: torch.Tensor) -> float:
    """Sign accuracy of the mean predictor, in percent."""
    return 100.0 * float((torch.sign(mean) == torch.sign(y.to(mean.dtype))).double().mean())


def kernel_alignment(K: torch.Tensor, Y: torch.Tensor, n_pcs: int = 30) -> np.ndarray:
    """Kernel-task alignment per principal component (Chapter 4, kernel-task alignment).

    With the eigen-decomposition ``K phi_k = lambda_k phi_k`` (``lambda_1 >= lambda_2 >= ...``,
    unit ``phi_k``) of a training kernel, returns the cosines

    .. math:: a_k = |\\phi_k\\cdot Y| / \\|Y\\|,\\qquad k = 1, \\dots, n_{\\rm pcs},

    as an array ``(n_pcs,)``. Over all ``P`` components ``sum_k a_k^2 = 1``; a kernel aligned with
    the task puts that mass on its leading components. ``K`` (P, P) symmetric, ``Y`` (P,).
    Typical use: ``K = renormalised_kernel(U, xt, xt)`` for the theory's ``U`` against the GP's
    ``U = 1``. See :func:`top_pc_label_fraction` and :func:`kernel_target_alignment` for scalars.
    """
    _check_kernel_and_labels(K, Y)
    evals, evecs = torch.linalg.eigh(K)
    order = torch.argsort(evals, descending=True)[:n_pcs]
    Yn = Y.to(K.dtype) / torch.linalg.norm(Y.to(K.dtype))
    return (evecs[:, order].T @ Yn).abs().cpu().numpy()


def top_pc_label_fraction(K: torch.Tensor, Y: torch.Tensor, k: int = 5) -> float:
    """Fraction of ``|Y|^2`` captured by the top ``k`` principal components of ``K``.

    .. math:: F_k = \\sum_{j\\le k} (\\phi_j\\cdot Y)^2 / \\|Y\\|^2 \\in [0, 1]

    (the squared cosines of :func:`kernel_alignment`, summed). Scale-invariant in ``K``.
    """
    return float((kernel_alignment(K, Y, k) ** 2).sum())


def kernel_target_alignment(K: torch.Tensor, Y: torch.Tensor) -> float:
    """Kernel-target alignment of Cristianini et al. (2002): cosine between ``K`` and ``Y Y^T``.

    .. math:: A(K, Y) = \\frac{Y^\\top K Y}{\\|K\\|_F\\, \\|Y\\|^2} \\in [-1, 1]

    Equal to 1 exactly when ``K`` is a positive multiple of ``Y Y^T``; scale-invariant in ``K``.
    """
    _check_kernel_and_labels(K, Y)
    Yd = Y.to(K.dtype)
    return float(Yd @ K @ Yd / (torch.linalg.norm(K) * (Yd @ Yd)))


def _check_kernel_and_labels(K: torch.Tensor, Y: torch.Tensor) -> None:
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise ValueError(f"K must be a square (P, P) kernel matrix, got shape {tuple(K.shape)}")
    if Y.ndim != 1 or Y.shape[0] != K.shape[0]:
        raise ValueError(f"Y must have shape ({K.shape[0]},), got {tuple(Y.shape)}")


def head_scores(U: torch.Tensor, heads) -> np.ndarray:
    """Head scores from ``U``: sum of ``|U|`` over rows or columns of paths through the head.

    Returns an array (L, H_l max) normalised by its maximum (NaN-free for equal head counts).
    """
    L = len(heads)
    Ua = U.abs().cpu().numpy()
    grid = np.stack(np.meshgrid(*[np.arange(h) for h in heads], indexing="ij"), -1).reshape(-1, L)
    out = np.zeros((L, max(heads)))
    for l in range(L):
        for h in range(heads[l]):
            on = grid[:, l] == h
            mask = on[:, None] | on[None, :]
            out[l, h] = Ua[mask].sum()
    return out / out.max()
