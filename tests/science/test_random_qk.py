"""Unit tests for attnlib.random_qk (Chapter 1): closed forms against Monte Carlo and quadrature."""

import math

import numpy as np
import pytest
import torch

from attnlib import random_qk as rq


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- kernels vs Monte Carlo


def test_kappa1_closed_form_matches_monte_carlo_and_taylor():
    g = gen(0)
    z = torch.randn(2, 2_000_000, generator=g, dtype=torch.float64)
    for rho in (-0.7, 0.0, 0.3, 0.9):
        g2 = rho * z[0] + math.sqrt(1 - rho**2) * z[1]
        mc = (torch.relu(z[0]) * torch.relu(g2)).mean().item()
        exact = rq.kappa1(torch.tensor(rho, dtype=torch.float64)).item()
        assert abs(mc - exact) < 4e-3 * max(exact, 0.05) + 5e-4
        series = np.polyval(rq.kappa1_taylor(60)[::-1], rho)
        assert abs(series - exact) < 2e-3
    c = rq.kappa1_taylor(6)
    np.testing.assert_allclose(c[:3], [1 / (2 * math.pi), 0.25, 1 / (4 * math.pi)], rtol=1e-12)
    np.testing.assert_allclose(c[4], 1 / (48 * math.pi), rtol=1e-12)
    np.testing.assert_allclose(c[6], 1 / (160 * math.pi), rtol=1e-12)
    assert c[3] == 0 and c[5] == 0


def test_rfa_kernel_matches_monte_carlo_heads():
    """Finite-head kernel Psi Psi^T -> closed form; the error shrinks like M^{-1/2}."""
    d, N = 6, 4
    x = rq.sample_tokens(6, N, d, generator=gen(1))
    K = rq.rfa_kernel(x, x)
    errs = []
    for M in (2_000, 32_000):
        W = rq.sample_qk(M, d, generator=gen(M))
        Psi = rq.design_matrix(rq.rfa_features(x, W))
        errs.append(((Psi @ Psi.T - K).abs().max() / K.abs().max()).item())
    assert errs[1] < 0.03
    assert errs[1] < errs[0] / 2  # sqrt(16) = 4 expected; 2 leaves room for noise


def test_rfa_kernel_general_radius_matches_monte_carlo():
    """The closed form does not assume unit tokens: check with Gaussian (non-unit) tokens."""
    d, N = 4, 3
    x = torch.randn(5, N + 1, d, generator=gen(2), dtype=torch.float64)
    K = rq.rfa_kernel(x, x, a=0.7, tau=0.3)
    W = rq.sample_qk(40_000, d, tau=0.3, generator=gen(3))
    Psi = rq.design_matrix(rq.rfa_features(x, W, a=0.7))
    assert ((Psi @ Psi.T - K).abs().max() / K.abs().max()).item() < 0.03


def test_rfmlp_kernel_matches_monte_carlo():
    d, N = 5, 3
    x = rq.sample_tokens(6, N, d, generator=gen(4))
    X = rq.concat_tokens(x)
    s2 = N + 2.0
    K = rq.rfmlp_kernel(X, X, scale2=s2)
    w = rq.sample_rfmlp_weights(100_000, X.shape[1], scale2=s2, generator=gen(5))
    F = rq.rfmlp_features(X, w)
    assert ((F @ F.T / w.shape[0] - K).abs().max()).item() < 0.01
    # unit-variance pre-activation: K(x, x) = kappa1(1) = 1/2
    np.testing.assert_allclose(torch.diag(K).numpy(), 0.5, rtol=1e-12)


def test_brfa_kernel_matches_monte_carlo_heads():
    d, N = 5, 3
    x = rq.sample_tokens(5, N, d, generator=gen(6))
    K = rq.brfa_kernel(x, x, bias=1.0)
    W = rq.sample_qk(40_000, d, bias=1.0, generator=gen(7))
    Psi = rq.design_matrix(rq.rfa_features(x, W))
    assert ((Psi @ Psi.T - K).abs().max() / K.abs().max()).item() < 0.03
    # zero mean: BRFA quadrature must reduce to the arc-cosine closed form
    np.testing.assert_allclose(rq.brfa_kernel(x, x, bias=0.0).numpy(), rq.rfa_kernel(x, x).numpy(),
                               rtol=1e-7, atol=1e-9)


# ---------------------------------------------------------------- quadrature


def test_relu_moment_known_values_and_monte_carlo():
    a = torch.tensor([0.3, 1.2, 0.0, -1.0, 2.0])
    b = torch.tensor([-0.5, 0.7, 0.0, 0.4, -2.5])
    r = torch.tensor([0.4, -0.8, 0.95, 0.999999, 1.0])
    m = rq.relu_moment(a, b, r)
    # zero shifts: the arc-cosine function
    assert abs(m[2].item() - rq.kappa1(torch.tensor(0.95, dtype=torch.float64)).item()) < 1e-8
    # Monte Carlo reference for all five (with common random numbers)
    z = torch.randn(2, 4_000_000, generator=gen(8), dtype=torch.float64)
    for j in range(5):
        rho = r[j].item()
        g2 = rho * z[0] + math.sqrt(max(1 - rho**2, 0.0)) * z[1]
        mc = (torch.relu(a[j] + z[0]) * torch.relu(b[j] + g2)).mean().item()
        assert abs(m[j].item() - mc) < 3e-3, (j, m[j].item(), mc)
    # exact limit rho = 1 with alpha = beta = t: E[relu(t + g)^2] = (1 + t^2) Phi(t) + t phi(t)
    t = 0.37
    phi_t = math.exp(-t * t / 2) / math.sqrt(2 * math.pi)
    exact = (1 + t * t) * 0.5 * math.erfc(-t / math.sqrt(2)) + t * phi_t
    assert abs(rq.relu_moment(t, t, 1.0).item() - exact) < 1e-8
    # independence rho = 0: product of one-dimensional means psi_1(alpha) psi_1(beta)
    one = torch.tensor(1.0, dtype=torch.float64)
    a0, b0 = torch.tensor(0.3, dtype=torch.float64), torch.tensor(-0.5, dtype=torch.float64)
    prod = rq._psi(a0, one) * rq._psi(b0, one)
    assert abs(rq.relu_moment(0.3, -0.5, 0.0).item() - prod.item()) < 1e-9


def test_relu_moment_beats_plain_gauss_hermite():
    """The kink-aware rule is exact to 1e-7; a plain 60-node Gauss-Hermite rule is off by ~1e-3."""
    ref = rq.relu_moment(1.2, 0.7, -0.8, nodes=400).item()
    assert abs(rq.relu_moment(1.2, 0.7, -0.8).item() - ref) < 1e-7
    z, w = np.polynomial.hermite_e.hermegauss(60)
    w = w / w.sum()
    rho = -0.8
    s = math.sqrt(1 - rho**2)
    psi = rq._psi(torch.tensor(0.7 + rho * z), torch.tensor(s)).numpy()
    gh = float(np.sum(w * np.maximum(1.2 + z, 0) * psi))
    assert abs(gh - ref) > 1e-4


# ---------------------------------------------------------------- invariances


def test_permutation_invariance_in_keys():
    d, N = 6, 5
    x = rq.sample_tokens(7, N, d, generator=gen(9))
    perm = torch.randperm(N, generator=gen(10)) + 1
    xp = torch.cat([x[:, :1], x[:, perm]], dim=1)
    W = rq.sample_qk(50, d, bias=0.7, generator=gen(11))
    torch.testing.assert_close(rq.rfa_features(x, W), rq.rfa_features(xp, W), rtol=0, atol=1e-14)
    torch.testing.assert_close(rq.rfa_kernel(x, x), rq.rfa_kernel(xp, x), rtol=0, atol=1e-14)
    # the RFMLP sees positions: its features change under the same permutation
    X, Xp = rq.concat_tokens(x), rq.concat_tokens(xp)
    w = rq.sample_rfmlp_weights(50, X.shape[1], scale2=N + 2.0, generator=gen(12))
    assert (rq.rfmlp_features(X, w) - rq.rfmlp_features(Xp, w)).abs().max() > 1e-3
    # the layer output is invariant too, and differs when the query is swapped with a key
    V = torch.randn(50, d + 1, generator=gen(13), dtype=torch.float64)
    out, out_p = rq.rfa_forward(x, W, V), rq.rfa_forward(xp, W, V)
    torch.testing.assert_close(out, out_p, rtol=0, atol=1e-13)
    xs = x.clone()
    xs[:, [0, 1]] = x[:, [1, 0]]
    assert (rq.rfa_forward(x, W, V) - rq.rfa_forward(xs, W, V)).abs().max() > 1e-3


def test_rotation_invariance_of_rfa_kernel():
    d, N = 5, 3
    x = rq.sample_tokens(4, N, d, generator=gen(14))
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen(15), dtype=torch.float64))
    K_rot = rq.rfa_kernel(x @ Q.T, x @ Q.T)
    torch.testing.assert_close(K_rot, rq.rfa_kernel(x, x), rtol=1e-12, atol=1e-13)


# ---------------------------------------------------------------- harmonics and targets


def test_harmonic_dimensions():
    assert [rq.harmonic_dim(8, k) for k in range(4)] == [1, 8, 35, 112]
    assert rq.harmonic_dim(6, 2) == 20
    for d in (3, 5, 9):
        assert rq.harmonic_dim(d, 1) == d
        assert rq.harmonic_dim(d, 2) == (d + 2) * (d - 1) // 2
    assert [rq.harmonic_dim(3, k) for k in range(5)] == [1, 3, 5, 7, 9]  # 2k + 1 on S^2
    # homogeneous polynomials of degree k = harmonics of degree k, k-2, k-4, ...
    for d, k in ((4, 5), (7, 4)):
        parts = sum(rq.harmonic_dim(d, k - 2 * j) for j in range(k // 2 + 1))
        assert math.comb(k + d - 1, k) == parts


def test_gegenbauer_normalisation_and_orthogonality():
    d = 7
    for k in range(6):
        assert abs(rq.gegenbauer(k, torch.tensor(1.0, dtype=torch.float64), d).item() - 1) < 1e-12
    t = torch.linspace(-1, 1, 5, dtype=torch.float64)
    torch.testing.assert_close(rq.gegenbauer(2, t, d), (d * t**2 - 1) / (d - 1))
    # E[Q_k Q_l(<x, y>)] = delta_kl / dim_{d,k}; exact 1-D quadrature in t
    z, w = np.polynomial.legendre.leggauss(200)
    dens = (1 - z**2) ** ((d - 3) / 2)
    w = w * dens / np.sum(w * dens)
    zt = torch.tensor(z)
    for k in range(5):
        for ll in range(5):
            v = float(np.sum(w * (rq.gegenbauer(k, zt, d) * rq.gegenbauer(ll, zt, d)).numpy()))
            expect = 1 / rq.harmonic_dim(d, k) if k == ll else 0.0
            assert abs(v - expect) < 1e-10
    # Monte Carlo on the sphere: the pair term of the target has unit variance
    x = rq.sample_tokens(200_000, 1, d, generator=gen(16))
    for k in (1, 2, 3):
        f = rq.gegenbauer_target(x, k)
        assert abs(f.var().item() - 1) < 0.03
        assert abs(f.mean().item()) < 0.01


def test_bilinear_target_unit_variance_and_keys_average():
    d, N = 6, 4
    S = rq.random_bilinear(d, generator=gen(17))
    x = rq.sample_tokens(100_000, N, d, generator=gen(18))
    # pair terms are uncorrelated across keys: the average has variance 1/N
    assert abs(rq.bilinear_target(x, S).var().item() * N - 1) < 0.04


def test_max_over_keys_floor_matches_monte_carlo_projection():
    d, N = 6, 4
    floor = rq.max_over_keys_floor(d, N)
    # Monte Carlo of the first-order (ANOVA) projection with h(t) estimated on bins of t_1
    x = rq.sample_tokens(400_000, N, d, generator=gen(19))
    t = torch.einsum("nd,nid->ni", x[:, 0], x[:, 1:])
    f = t.amax(dim=1)
    bins = torch.bucketize(t, torch.linspace(-1, 1, 401, dtype=torch.float64))
    sums = torch.zeros(402, dtype=torch.float64).index_add_(0, bins[:, 0], f)
    cnts = torch.zeros(402, dtype=torch.float64).index_add_(0, bins[:, 0], torch.ones_like(f))
    h = sums / cnts.clamp_min(1)
    proj = f.mean() + (h[bins] - f.mean()).sum(dim=1)
    mc = ((f - proj) ** 2).mean() / f.var()
    assert 0.05 < floor < 0.95
    assert abs(mc.item() - floor) < 0.02


# ---------------------------------------------------------------- ridge


def test_ridge_path_matches_direct_solve_kernel_and_primal():
    g = gen(20)
    d, N, n, m = 5, 3, 60, 25
    x = rq.sample_tokens(n + m, N, d, generator=g)
    W = rq.sample_qk(4, d, generator=g)  # P = 24 < n: primal branch
    Psi = rq.design_matrix(rq.rfa_features(x, W))
    y = torch.randn(n, 2, generator=g, dtype=torch.float64)
    lambdas = [1e-6, 1e-3, 1e-1]
    K = Psi @ Psi.T
    path_k = rq.kernel_ridge_path(K[:n, :n], y, K[n:, :n], lambdas)
    path_p = rq.feature_ridge_path(Psi[:n], y, Psi[n:], lambdas)
    for j, lam in enumerate(lambdas):
        ref = rq.ridge_direct(K[:n, :n], y, K[n:, :n], lam)
        torch.testing.assert_close(path_k[j], ref, rtol=1e-7, atol=1e-9)
        torch.testing.assert_close(path_p[j], ref, rtol=1e-7, atol=1e-9)
    # kernel branch of feature_ridge_path (P >= n)
    Wb = rq.sample_qk(20, d, generator=g)
    Psib = rq.design_matrix(rq.rfa_features(x, Wb))
    Kb = Psib @ Psib.T
    ref = rq.ridge_direct(Kb[:n, :n], y, Kb[n:, :n], 1e-2)
    path = rq.feature_ridge_path(Psib[:n], y, Psib[n:], [1e-2])[0]
    torch.testing.assert_close(path, ref, rtol=1e-7, atol=1e-9)


def test_validated_risk_picks_lambda_on_validation_only():
    L, nv, nt = 3, 4, 4
    y_val = torch.zeros(nv, 1, dtype=torch.float64)
    y_test = torch.zeros(nt, 1, dtype=torch.float64)
    preds = torch.ones(L, nv + nt, 1, dtype=torch.float64)
    preds[1, :nv] = 0.0  # best on validation
    preds[2, nv:] = 0.0  # best on test: must NOT be chosen
    risk, best = rq.validated_risk(preds, y_val, y_test, torch.ones(1, dtype=torch.float64), nv)
    assert best.item() == 1 and risk.item() == pytest.approx(1.0)


def test_rfa_learns_pairwise_target_and_not_max_over_keys():
    """Small end-to-end check: RFA kernel ridge fits a bilinear pair target, not max over keys."""
    g = gen(21)
    d, N, n, nv, nt = 5, 4, 300, 150, 150
    x = rq.sample_tokens(n + nv + nt, N, d, generator=g)
    S = rq.random_bilinear(d, generator=g)
    y = torch.stack([rq.bilinear_target(x, S), rq.max_over_keys_target(x)], dim=1)
    K = rq.rfa_kernel(x, x[:n])
    preds = rq.kernel_ridge_path(K[:n], y[:n], K[n:], 10.0 ** np.arange(-8, 0))
    var = torch.tensor([1 / N, y[:, 1].var().item()], dtype=torch.float64)
    risk, _ = rq.validated_risk(preds, y[n:n + nv], y[n + nv:], var, nv)
    assert risk[0] < 0.05
    assert risk[1] > 0.8 * rq.max_over_keys_floor(d, N)


def test_config_validation():
    with pytest.raises(ValueError, match="seeds"):
        rq.RandomQKConfig(seeds=0)
    with pytest.raises(ValueError, match="n_list"):
        rq.RandomQKConfig(n_list=(10, -1))


def test_symmetric_kernel_path_equals_general_path():
    x = rq.sample_tokens(37, 3, 5, generator=gen(22))
    torch.testing.assert_close(rq.rfa_kernel(x), rq.rfa_kernel(x, x), rtol=1e-13, atol=1e-15)


def test_pair_spectrum_reconstructs_kernel_and_trace():
    """Addition theorem: k(u, w) = sum lambda_{l,l'} dim_l dim_l' Q_l(u) Q_l'(w); traces agree."""
    d, lmax = 6, 14
    lam = rq.rfa_pair_spectrum(d, lmax)
    dims = np.array([rq.harmonic_dim(d, q) for q in range(lmax + 1)], dtype=float)
    u = torch.tensor([0.3, -0.5, 0.1], dtype=torch.float64)
    w = torch.tensor([-0.2, 0.4, 0.7], dtype=torch.float64)
    Qu = np.stack([rq.gegenbauer(q, u, d).numpy() for q in range(lmax + 1)])
    Qw = np.stack([rq.gegenbauer(q, w, d).numpy() for q in range(lmax + 1)])
    recon = np.einsum("lm,l,m,li,mi->i", lam, dims, dims, Qu, Qw)
    exact = ((1 + w) * rq.kappa1((1 + u) * (1 + w) / 4)).numpy()
    np.testing.assert_allclose(recon, exact, atol=2e-3)
    assert np.all(lam > -1e-12)  # a positive-definite kernel has non-negative eigenvalues
    eig, mult, trace = rq.set_kernel_spectrum(d, 3, lmax)
    assert abs(float(np.sum(eig * mult)) - trace) < 2e-3 * trace


def test_eigenlearning_limits():
    eig, mult = np.array([1.0, 0.01]), np.array([1.0, 50.0])
    tv = np.array([0.0, 1.0])
    # no data: nothing learned; many data: everything learned
    assert rq.eigenlearning_risk(eig, mult, tv, 1e-6, 1e-9) == pytest.approx(1.0, rel=1e-3)
    assert rq.eigenlearning_risk(eig, mult, tv, 1e6, 1e-9) < 1e-3
    # a finite-rank kernel with n > rank interpolates exactly (ridgeless)
    assert rq.eigenlearning_risk(eig, mult, tv, 60, 1e-12) < 1e-6


def test_point_functions_run_at_tiny_size_and_match_eigenlearning():
    """Every sweep-point function runs; the RFA learning curve follows the spectral theory."""
    lam = list(rq.RandomQKConfig().lambdas)
    d, N, n_list = 5, 3, [40, 80, 160, 320]
    rows = rq.kernel_curves_point(d=d, N=N, n_list=n_list, n_val=150, n_test=300, seed=3,
                                  lambdas=lam)
    eig, mult, tr = rq.set_kernel_spectrum(d, N, 8)
    tv = np.zeros_like(eig)
    tv[1, 1] = 1.0
    for r in rows:
        if r["model"] == "RFA" and r["target"] == "bilinear":
            th = min(rq.eigenlearning_risk(eig, mult, tv, r["n"], lm, tr) for lm in lam)
            assert 1 / 3 < r["risk"] / th < 3, (r, th)
    hs = rq.heads_sweep_point(d=d, N=N, n_list=[60], n_val=30, n_test=30, seed=0, lambdas=lam,
                              heads_list=[4, 8])
    assert [r["heads"] for r in hs] == [4, 8]
    hc = rq.heads_curves_point(d=d, N=N, n_list=[30, 60], n_val=30, n_test=30, seed=0,
                               lambdas=lam, heads=8, biases=[0.0, 1.0], targets=("geg2",))
    assert len(hc) == 4 and all(np.isfinite(r["risk"]) for r in hc)
    mc = rq.kernel_mc_point(d=d, N=N, sequences=3, heads=[10, 100], repeats=3, seed=0)
    assert mc[0]["rms_rel_err"] > mc[1]["rms_rel_err"]


# ---------------------------------------------------------------- thresholds, floor, heads, theory


def test_cumulative_rank_counts_eigenvalues_above_and_own_block():
    eig = np.array([[0.5, 0.02], [0.03, 0.001]])
    mult = np.array([[1, 4], [4, 16]])
    cr = rq.cumulative_rank(eig, mult)
    assert cr.tolist() == [[1, 9], [5, 25]]
    # the degree-(2,2) block at d = 4, N = 4: 81 copies, 131 eigenvalues above it
    eig, mult, _ = rq.set_kernel_spectrum(4, 4, 8)
    assert rq.cumulative_rank(eig, mult)[2, 2] == 212


def test_max_over_keys_block_variances_sum_to_learnable_part_and_match_monte_carlo():
    d, N = 3, 2
    v, floor, var_max = rq.max_over_keys_block_variances(d, N, 14)
    assert floor == pytest.approx(rq.max_over_keys_floor(d, N), abs=1e-9)
    assert v[0] == 0 and v.sum() == pytest.approx(1 - floor, abs=2e-4)
    # Monte Carlo: covariance of f_max with the degree-1 pair-term sum sqrt(dim) Q_1(t_i)
    x = rq.sample_tokens(400_000, N, d, generator=gen(40))
    f = rq.max_over_keys_target(x)
    g1 = rq.gegenbauer_target(x, 1) * N  # sum_i sqrt(d) t_i, variance N
    corr2 = (torch.cov(torch.stack([f, g1]))[0, 1] ** 2 / (f.var() * g1.var())).item()
    assert corr2 == pytest.approx(v[1], abs=0.01)
    assert f.var().item() == pytest.approx(d * var_max, rel=0.01)


def test_key_key_target_variance_and_centering():
    x = rq.sample_tokens(200_000, 4, 6, generator=gen(41))
    y = rq.key_key_target(x)
    assert abs(y.mean().item()) < 0.01
    assert y.var().item() == pytest.approx(2 * 3 / 4, rel=0.02)
    brute = math.sqrt(6) * sum((x[:, a] * x[:, b]).sum(-1) for a in range(1, 5)
                               for b in range(1, 5) if a != b) / 4
    torch.testing.assert_close(y, brute)


def test_center_kernel_is_ridge_with_free_intercept():
    g = gen(42)
    n, m, P = 30, 12, 8
    F = torch.randn(n + m, P, generator=g, dtype=torch.float64) + 3.0  # features with a mean
    y = torch.randn(n, generator=g, dtype=torch.float64) + 5.0
    lam = 1e-2
    K = F @ F[:n].T
    Kc, Kec = rq.center_kernel(K[:n], K[n:])
    pred = rq.kernel_ridge_path(Kc, y - y.mean(), Kec, [lam])[0, :, 0] + y.mean()
    # explicit: min_{u,b} 1/n ||F u + b - y||^2 + lam ||u||^2, with b free
    mu = F[:n].mean(0)
    Fc = F[:n] - mu
    u = torch.linalg.solve(Fc.T @ Fc + lam * n * torch.eye(P, dtype=torch.float64),
                           Fc.T @ (y - y.mean()))
    ref = (F[n:] - mu) @ u + y.mean()
    torch.testing.assert_close(pred, ref, rtol=1e-8, atol=1e-10)


def test_ridgeless_path_is_minimum_norm_interpolant():
    g = gen(43)
    n, m, P = 20, 7, 50  # more features than samples: interpolation
    F = torch.randn(n + m, P, generator=g, dtype=torch.float64)
    y = torch.randn(n, generator=g, dtype=torch.float64)
    K = F @ F[:n].T
    pred = rq.kernel_ridge_path(K[:n], y, K[n:], [0.0])[0, :, 0]
    ref = F[n:] @ (torch.linalg.pinv(F[:n]) @ y)
    torch.testing.assert_close(pred, ref, rtol=1e-7, atol=1e-9)
    # and it is the limit of small ridges
    small = rq.kernel_ridge_path(K[:n], y, K[n:], [1e-10])[0, :, 0]
    torch.testing.assert_close(small, ref, rtol=1e-5, atol=1e-6)


def test_eigenlearning_min_and_samples_to_risk_agree_with_scalar_versions():
    eig, mult, tr = rq.set_kernel_spectrum(5, 4, 6)
    tv = np.zeros_like(eig)
    tv[1, 1] = 1.0
    lam = list(rq.RandomQKConfig().lambdas)
    for n in (20, 60, 200):
        ref = min(rq.eigenlearning_risk(eig, mult, tv, n, lm, tr) for lm in lam)
        assert rq.eigenlearning_risk_min(eig, mult, tv, n, lam, tr) == pytest.approx(ref, rel=1e-6)
    n_half = rq.eigenlearning_samples_to_risk(eig, mult, tv, 0.5, lam, tr)
    assert rq.eigenlearning_risk_min(eig, mult, tv, n_half, lam, tr) == pytest.approx(0.5, rel=1e-3)
    assert rq.level_crossing_n([10, 20, 40], [0.9, 0.6, 0.3], 0.5) == pytest.approx(
        20 * 2 ** (math.log(0.6 / 0.5) / math.log(2.0)), rel=1e-9)
    assert math.isnan(rq.level_crossing_n([10, 20], [0.9, 0.8], 0.5))


def test_nested_heads_sweep_equals_independent_accumulation():
    """The nested head sets give the same kernel as one draw of the largest M, truncated."""
    lam = [0.0, 1e-6, 1e-3]
    kw = dict(d=4, N=3, n_list=[40], n_val=20, n_test=20, seed=5, lambdas=lam)
    rows_a = rq.heads_sweep_point(heads_list=[3, 7, 12], chunk=5, **kw)
    rows_b = rq.heads_sweep_point(heads_list=[3, 7, 12], chunk=2, **kw)
    assert [r["heads"] for r in rows_a] == [3, 7, 12]
    for a, b in zip(rows_a, rows_b, strict=True):
        assert a["risk"] == pytest.approx(b["risk"], rel=1e-9)


def test_finite_head_spectrum_on_a_target_in_the_feature_span():
    """A target that is a linear function of the features is fully inside the spectrum, and the
    eigenvalues carry the trace of the feature covariance."""
    d, N, M = 4, 3, 3
    W = rq.sample_qk(M, d, generator=gen(44))
    eig, v, outside, var = rq.finite_head_spectrum(W, d, N, ["geg1", "geg3"], n_cov=20_000,
                                                   n_proj=40_000, generator=gen(45))
    assert eig.shape == (M * (d + 1),) and np.all(np.diff(eig) <= 1e-15)
    assert var.tolist() == pytest.approx([1 / N, 1 / N])
    # the explained fractions lie in [0, 1] up to sampling error, and the outside part
    # completes them to the variance
    frac = v.sum(1) / var
    assert np.all(frac > -0.02) and np.all(frac < 1.05)
    np.testing.assert_allclose(v.sum(1) + outside, np.maximum(var, v.sum(1)), rtol=1e-12)
    # with 3 heads (15 features) a degree-1 target is partly, a degree-3 target hardly, reached
    assert frac[0] > frac[1]
