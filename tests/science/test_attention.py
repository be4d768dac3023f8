"""Softmax and multi-head attention (chapter 0) against PyTorch and against theory."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlib import attention as at

DT = torch.float64


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


def test_matches_scaled_dot_product_attention(gen):
    q, k = torch.randn(2, 3, 9, 4, generator=gen, dtype=DT), torch.randn(2, 3, 11, 4, generator=gen, dtype=DT)
    v = torch.randn(2, 3, 11, 5, generator=gen, dtype=DT)
    mask = torch.rand(2, 3, 9, 11, generator=gen) > 0.4
    mask[..., 0] = True
    torch.testing.assert_close(at.attention(q, k, v)[0], F.scaled_dot_product_attention(q, k, v),
                               rtol=0, atol=1e-13)
    torch.testing.assert_close(at.attention(q, k, v, mask=mask)[0],
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask), rtol=0, atol=1e-13)
    torch.testing.assert_close(at.attention(q, k, v, scale=0.3)[0],
                               F.scaled_dot_product_attention(q, k, v, scale=0.3), rtol=0, atol=1e-13)


def test_softmax_is_shift_invariant_and_stable(gen):
    s = torch.randn(5, 7, generator=gen, dtype=DT)
    torch.testing.assert_close(at.softmax(s), at.softmax(s + 1e3))
    torch.testing.assert_close(at.softmax(s), torch.softmax(s, -1))
    big = at.softmax(torch.tensor([[800.0, 0.0, -800.0]], dtype=DT))
    assert torch.isfinite(big).all() and big[0, 0] == 1.0


def test_multi_head_equals_loop_over_heads(gen):
    B, T, D, H, dk, dv, Do = 2, 6, 5, 3, 4, 3, 2
    x = torch.randn(B, T, D, generator=gen, dtype=DT)
    wq, wk = torch.randn(H, D, dk, generator=gen, dtype=DT), torch.randn(H, D, dk, generator=gen, dtype=DT)
    wv, wo = torch.randn(H, D, dv, generator=gen, dtype=DT), torch.randn(H, dv, Do, generator=gen, dtype=DT)
    out, a = at.multi_head_attention(x, wq, wk, wv, wo)
    ref = sum(
        torch.softmax(x @ wq[h] @ (x @ wk[h]).transpose(-2, -1) / math.sqrt(dk), -1) @ x @ wv[h] @ wo[h]
        for h in range(H)
    )
    torch.testing.assert_close(out, ref)
    assert a.shape == (B, H, T, T)
    torch.testing.assert_close(a.sum(-1), torch.ones(B, H, T, dtype=DT))


def test_permutation_equivariance(gen):
    x = torch.randn(8, 4, generator=gen, dtype=DT)
    w = [torch.randn(2, 4, 4, generator=gen, dtype=DT) for _ in range(3)]
    perm = torch.randperm(8, generator=gen)
    out, _ = at.multi_head_attention(x, *w)
    out_p, _ = at.multi_head_attention(x[perm], *w)
    torch.testing.assert_close(out_p, out[perm])


def test_relu_attention_divides_by_number_of_keys(gen):
    q, k = torch.randn(3, 4, generator=gen, dtype=DT), torch.randn(6, 4, generator=gen, dtype=DT)
    a = at.attention_weights(q, k, scale=1.0, kind="relu")
    torch.testing.assert_close(a, torch.relu(q @ k.T) / 6)
    with pytest.raises(ValueError, match="kind='tanh'"):
        at.attention_weights(q, k, kind="tanh")


def test_effective_tokens_limits():
    T = 10
    uniform = torch.full((1, T), 1.0 / T, dtype=DT)
    one_hot = torch.zeros(1, T, dtype=DT)
    one_hot[0, 3] = 1.0
    assert at.effective_tokens(uniform).item() == pytest.approx(T)
    assert at.effective_tokens(one_hot).item() == pytest.approx(1.0)
    assert at.effective_tokens_annealed(0.0, T).item() == pytest.approx(T)
    assert at.effective_tokens_annealed(30.0, T).item() == pytest.approx(1.0)


@pytest.mark.parametrize("beta", [0.3, 0.7])
def test_annealed_formula_is_a_ratio_of_gaussian_expectations(beta):
    """Monte Carlo E[Z1^2]/E[Z2] for i.i.d. N(0,1) scores equals 1 + (T-1) exp(-beta^2)."""
    T, n = 16, 400_000
    z = torch.randn(n, T, generator=torch.Generator().manual_seed(1), dtype=DT)
    e = torch.exp(beta * z)
    ratio = (e.sum(-1) ** 2).mean() / (e**2).sum(-1).mean()
    assert ratio.item() == pytest.approx(at.effective_tokens_annealed(beta, T).item(), rel=5e-3)


def test_self_averaging_scale():
    T = 128
    beta = at.self_averaging_scale(T)
    assert math.exp(4 * beta**2) == pytest.approx(T)  # relative variance (e^{4b^2}-1)/T ~ 1


def test_stable_softmax_large_scores_and_shift():
    z = torch.tensor([[1000.0, 999.0, -1000.0], [1e5, 1e5, 0.0]], dtype=DT)
    s = at.softmax(z)
    assert torch.isfinite(s).all()
    assert torch.allclose(s.sum(-1), torch.ones(2, dtype=DT))
    assert torch.allclose(s[1, :2], torch.full((2,), 0.5, dtype=DT))
    assert torch.allclose(at.softmax(z[:1] + 7.5), s[:1], atol=1e-15)
