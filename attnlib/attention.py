"""Softmax attention and multi-head attention: the notation of the whole book (chapter 0).

Shapes follow ``(batch, tokens, dim)``; any number of leading batch dimensions is allowed.
Chapter ``00-attention`` derives everything here; the four models of the book are special cases.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "softmax",
    "attention_weights",
    "attention",
    "multi_head_attention",
    "effective_tokens",
    "effective_tokens_annealed",
    "self_averaging_scale",
]


def softmax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    r"""Numerically stable softmax, :math:`\mathrm{softmax}(s)_j = e^{s_j - \max s}/\sum_l e^{s_l - \max s}`.

    Subtracting the maximum leaves the result unchanged (shift invariance) and avoids overflow.
    Entries equal to ``-inf`` get weight zero.
    """
    shift = scores.amax(dim=dim, keepdim=True).clamp_min(torch.finfo(scores.dtype).min)
    e = torch.exp(scores - shift)
    return e / e.sum(dim=dim, keepdim=True)


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    kind: str = "softmax",
) -> torch.Tensor:
    r"""Attention matrix :math:`A = \phi(\beta\, Q K^\top)`.

    Parameters
    ----------
    q : Tensor, shape ``(..., T_q, d)``
        Queries.
    k : Tensor, shape ``(..., T_k, d)``
        Keys.
    scale : float, optional
        Score scale :math:`\beta`; default :math:`1/\sqrt{d}`.
    mask : bool Tensor, broadcastable to ``(..., T_q, T_k)``, optional
        ``True`` where a query may attend to a key (the convention of
        :func:`torch.nn.functional.scaled_dot_product_attention`).
    kind : {"softmax", "relu"}
        ``"softmax"``: rows of :math:`A` are softmax distributions (chapters 0, 2, 3, 4).
        ``"relu"``: :math:`A_{ij} = \max(s_{ij}, 0)/T_k`, the ReLU attention divided by the
        number of keys used by random-feature attention (chapter 1).

    Returns
    -------
    Tensor, shape ``(..., T_q, T_k)``
    """
    d = q.shape[-1]
    beta = 1.0 / math.sqrt(d) if scale is None else scale
    scores = beta * (q @ k.transpose(-2, -1))
    if kind == "softmax":
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return softmax(scores, dim=-1)
    if kind == "relu":
        a = torch.relu(scores) / k.shape[-2]
        return a if mask is None else a * mask
    raise ValueError(f"kind={kind!r} is not allowed; choose one of: 'softmax', 'relu'")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    kind: str = "softmax",
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Single-head attention :math:`\mathrm{Attn}(Q, K, V) = A V` with :math:`A` from
    :func:`attention_weights`.

    Shapes: ``q (..., T_q, d)``, ``k (..., T_k, d)``, ``v (..., T_k, d_v)``; returns the output
    ``(..., T_q, d_v)`` and the weights ``(..., T_q, T_k)``. With ``kind="softmax"`` this equals
    ``torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)``.
    """
    a = attention_weights(q, k, scale=scale, mask=mask, kind=kind)
    return a @ v, a


def multi_head_attention(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    w_o: torch.Tensor | None = None,
    scale: float | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Multi-head self-attention, the sum over heads of single-head attention:

    .. math:: F(X) = \sum_h \mathrm{softmax}(\beta X W^Q_h W^{K\top}_h X^\top)\, X W^V_h W^O_h .

    Parameters
    ----------
    x : Tensor, shape ``(..., T, D)``
        Token embeddings.
    w_q, w_k : Tensor, shape ``(H, D, d_k)``
        Per-head query and key projections.
    w_v : Tensor, shape ``(H, D, d_v)``
        Per-head value projections.
    w_o : Tensor, shape ``(H, d_v, D_out)``, optional
        Per-head output projections (the concatenate-then-project of the usual layer, written as a
        sum over heads). Without it the heads' outputs are summed directly (``d_v = D_out``).
    scale : float, optional
        Score scale :math:`\beta`, default :math:`1/\sqrt{d_k}`.
    mask : bool Tensor broadcastable to ``(..., H, T, T)``, optional

    Returns
    -------
    out : Tensor, shape ``(..., T, D_out)``
    weights : Tensor, shape ``(..., H, T, T)``
    """
    xh = x.unsqueeze(-3)  # (..., 1, T, D): broadcast over heads
    q = xh @ w_q  # (..., H, T, d_k)
    k = xh @ w_k  # (..., H, T, d_k)
    v = xh @ w_v  # (..., H, T, d_v)
    heads, a = attention(q, k, v, scale=scale, mask=mask)  # (..., H, T, d_v), (..., H, T, T)
    if w_o is not None:
        heads = heads @ w_o  # (..., H, T, D_out)
    return heads.sum(dim=-3), a


def effective_tokens(weights: torch.Tensor) -> torch.Tensor:
    r"""Effective number of attended tokens :math:`N_\mathrm{eff} = 1 / \sum_j A_{ij}^2`.

    The inverse participation ratio of each row: ``T`` for uniform attention, 1 for attention on
    a single token. Input ``(..., T_q, T_k)``, output ``(..., T_q)``.
    """
    return 1.0 / (weights**2).sum(dim=-1)


def effective_tokens_annealed(beta: torch.Tensor | float, n_tokens: int) -> torch.Tensor:
    r"""Annealed prediction :math:`1 + (T-1)\,e^{-\beta^2}` for i.i.d. standard Gaussian scores.

    With scores :math:`\beta z_j`, :math:`z_j \sim \mathcal N(0,1)`, the ratio of expectations
    :math:`\mathbb E[(\sum_j e^{\beta z_j})^2] / \mathbb E[\sum_j e^{2\beta z_j}]` equals
    :math:`1 + (T-1)e^{-\beta^2}`. It is exact at :math:`\beta = 0` and as :math:`\beta\to\infty`,
    and matches the typical value while both sums self-average, i.e. well below
    :func:`self_averaging_scale`. Derived in chapter 0.
    """
    beta = torch.as_tensor(beta, dtype=torch.float64)
    return 1.0 + (n_tokens - 1) * torch.exp(-(beta**2))


def self_averaging_scale(n_tokens: int) -> float:
    r""":math:`\beta_* = \tfrac12\sqrt{\ln T}`, where the relative variance
    :math:`(e^{4\beta^2}-1)/T` of :math:`Z_2 = \sum_j e^{2\beta z_j}` reaches one.

    Above it :math:`Z_2` is dominated by its few largest terms and the annealed prediction of
    :func:`effective_tokens_annealed` no longer describes a typical head (chapter 0).
    """
    return math.sqrt(math.log(n_tokens)) / 2.0
