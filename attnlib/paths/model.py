"""The path network: attention from the bare input, forward pass, path expansion (Chapter 4).

Conventions: a batch of sequences is ``(batch, n_tok, N0)``; attention tensors are
``(batch, heads, key s, query t)`` normalised over the key axis; paths are flattened with the head of
layer 1 as the slowest index; ``widths = [N_1, ..., N_L, N_a]``.
"""

from __future__ import annotations

import math

import torch

DTYPE = torch.float64


def attention_from_bilinear(x: torch.Tensor, W: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """Softmax attention of fixed bilinear heads, computed from the bare input.

    .. math:: \\Omega_{h,st}(x) = \\operatorname{softmax}_s\\big(\\beta\\, x_s^\\top W_h x_t\\big)

    Parameters
    ----------
    x : (batch, n_tok, N0)
    W : (H, N0, N0)  (key on the left, query on the right)

    Returns
    -------
    (batch, H, n_tok key s, n_tok query t), columns summing to one over ``s``.
    """
    Wx = torch.einsum("hij,btj->bhti", W, x)  # W_h x_t  (two-step contraction: cheap)
    logits = beta * torch.einsum("bsi,bhti->bhst", x, Wx)
    return torch.softmax(logits, dim=-2)


def readout_vector(attn: torch.Tensor, readout: str = "last") -> torch.Tensor:
    """Last-layer attention vector ``omega_{h,s}`` seen by the readout position.

    ``attn`` is ``(batch, H, s, t)``; ``readout`` is ``"last"`` (query = last token), ``"first"``
    or ``"mean"`` (mean pooling over queries). Returns ``(batch, H, s)``.
    """
    if readout == "last":
        return attn[..., -1]
    if readout == "first":
        return attn[..., 0]
    if readout == "mean":
        return attn.mean(dim=-1)
    raise ValueError(f"readout must be one of 'last', 'first', 'mean', got {readout!r}")


def init_weights(
    n0: int,
    heads,
    widths,
    variances=None,
    n_chains: int | None = None,
    generator=None,
    dtype=DTYPE,
    device="cpu",
) -> dict:
    """Draw the trained (Bayesian) weights from their Gaussian prior.

    Returns ``{"V0": (N1, N0), "V": [(H_l, N_{l+1}, N_l)], "a": (N_a,)}``, each with a leading
    ``(n_chains,)`` axis when ``n_chains`` is given.
    """
    L = len(heads)
    if len(widths) != L + 1:
        raise ValueError("widths must be [N_1, ..., N_L, N_a]")
    variances = [1.0] * (L + 2) if variances is None else list(variances)
    lead = () if n_chains is None else (n_chains,)

    def g(*shape, var):
        return math.sqrt(var) * torch.randn(*lead, *shape, generator=generator, dtype=dtype, device=device)

    return {
        "V0": g(widths[0], n0, var=variances[0]),
        "V": [g(heads[l], widths[l + 1], widths[l], var=variances[l + 1]) for l in range(L)],
        "a": g(widths[L], var=variances[L + 1]),
    }


def forward(x: torch.Tensor, attns, weights: dict, readout: str = "last") -> torch.Tensor:
    """Layer-by-layer forward pass (Chapter 4, model section).

    .. math::
        x^{(0)}_t = V^{(0)} x_t/\\sqrt{N_0},\\quad
        x^{(\\ell)}_t = \\frac{1}{\\sqrt{H_\\ell N_\\ell}}\\sum_h V^{(\\ell)}_h
        \\sum_s x^{(\\ell-1)}_s
        \\Omega^{(\\ell)}_{h,st},\\quad f = a\\cdot\\bar x^{(L)}/\\sqrt{N_a}

    x : (batch, n_tok, N0); attns : list of L tensors (batch, H_l, n_tok, n_tok);
    weights : from :func:`init_weights` (no chain axis). Returns (batch,).
    """
    V0, Vs, a = weights["V0"], weights["V"], weights["a"]
    n0 = x.shape[-1]
    h = torch.einsum("ij,btj->bti", V0, x) / math.sqrt(n0)  # (batch, n_tok, N1)
    L = len(Vs)
    for l in range(L):
        H, _, n_in = Vs[l].shape
        if l < L - 1:
            mixed = torch.einsum("bhst,bsi->bhti", attns[l], h)  # (batch, H, t, N_l)
            h = torch.einsum("hoi,bhti->bto", Vs[l], mixed) / math.sqrt(H * n_in)
        else:
            om = readout_vector(attns[l], readout)  # (batch, H, s)
            mixed = torch.einsum("bhs,bsi->bhi", om, h)
            h = torch.einsum("hoi,bhi->bo", Vs[l], mixed) / math.sqrt(H * n_in)
    return h @ a / math.sqrt(a.shape[-1])


def path_features(x: torch.Tensor, attns, readout: str = "last") -> torch.Tensor:
    """Path-attended inputs ``xi_pi(x)`` (Chapter 4, path expansion).

    .. math:: \\xi_\\pi(x) = \\sum_{s_0..s_{L-1}} x_{s_0}\\Omega^{(1)}_{h_1,s_0s_1}\\cdots
              \\omega^{(L)}_{h_L,s_{L-1}}

    Returns ``(batch, n_paths, N0)`` with the head of layer 1 as the slowest path index.
    """
    v = readout_vector(attns[-1], readout)  # (batch, H_L, s)
    for A in reversed(attns[:-1]):
        # combine head h_l (outer) with the partial path (h_{l+1}..h_L) (inner)
        v = torch.einsum("bhst,bpt->bhps", A, v)
        v = v.reshape(v.shape[0], -1, v.shape[-1])
    return torch.einsum("bps,bsi->bpi", v, x)


def effective_path_weights(weights: dict) -> torch.Tensor:
    """Effective path weights ``w_pi = V1_{h1}^T ... VL_{hL}^T a / sqrt(N_a N_L ... N_2)``.

    Accepts weights with or without a leading chain axis; returns ``(..., n_paths, N1)``.
    """
    Vs, a = weights["V"], weights["a"]
    w = a.unsqueeze(-2) / math.sqrt(a.shape[-1])  # (..., 1, N_a)
    for l in reversed(range(len(Vs))):
        V = Vs[l]  # (..., H_l, N_{l+1}, N_l)
        w = torch.einsum("...hoi,...po->...hpi", V, w)  # new head index outermost
        w = w.reshape(*w.shape[:-3], -1, w.shape[-1])
        if l > 0:
            w = w / math.sqrt(V.shape[-1])
    return w


def path_overlap(weights: dict) -> torch.Tensor:
    """Overlap of effective path weights ``U_{pi pi'} = w_pi . w_pi' / N_1`` (..., paths, paths)."""
    w = effective_path_weights(weights)
    return w @ w.transpose(-1, -2) / w.shape[-1]


def path_forward(xi: torch.Tensor, weights: dict) -> torch.Tensor:
    """Network output from the path expansion, ``f = sum_pi w_pi^T V0 xi_pi / sqrt(N1 N0 n_paths)``.

    xi : (batch, n_paths, N0). With a leading chain axis in ``weights`` returns (chains, batch).
    """
    w = effective_path_weights(weights)  # (..., paths, N1)
    V0 = weights["V0"]  # (..., N1, N0)
    n_paths, n1 = w.shape[-2], w.shape[-1]
    n0 = V0.shape[-1]
    r = w @ V0  # (..., paths, N0): read-out direction of each path in input space
    return torch.einsum("...pi,bpi->...b", r, xi) / math.sqrt(n1 * n0 * n_paths)
