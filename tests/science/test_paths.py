"""Unit tests for attnlib.paths (Chapter 4): path expansion, kernels, the action and its solver,
the GP limit, and the theory against posterior sampling."""

import numpy as np
import pytest
import torch

import attnlib as al
from attnlib import paths as ap

F64 = torch.float64


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # tiny tensors on a shared 2-core machine: a second intra-op thread only adds contention
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def random_net(heads, widths, n0=7, n_tok=6, batch=5, seed=0):
    g = gen(seed)
    x = torch.randn(batch, n_tok, n0, generator=g, dtype=F64)
    Ws = [torch.randn(h, n0, n0, generator=g, dtype=F64) / 3 for h in heads]
    attns = [ap.attention_from_bilinear(x, W) for W in Ws]
    w = ap.init_weights(n0, heads, widths, generator=g)
    return x, attns, w


def _four_path_features(cfg, xtr, xte, seeds):
    """Path features of the 4-path network (layer 1: good + random head; layer 2: uniform + random)."""
    layers = [
        torch.stack([ap.markov_heads(cfg, "same"), ap.markov_heads(cfg, "random", gen(seeds[0]))]),
        torch.stack([ap.markov_heads(cfg, "uniform"), ap.markov_heads(cfg, "random", gen(seeds[1]))]),
    ]
    return (ap.path_features(xtr, ap.markov_attention(xtr, layers, cfg.beta)),
            ap.path_features(xte, ap.markov_attention(xte, layers, cfg.beta)))


@pytest.fixture(scope="module")
def small_task():
    """A small hidden-Markov-chain task with the 4-path network."""
    cfg = ap.MarkovTaskConfig(D=30, n_vis=10, P=40, n_test=300)
    xtr, ytr, _ = ap.make_markov_data(cfg, cfg.P, gen(27))
    xte, yte, _ = ap.make_markov_data(cfg, cfg.n_test, gen(59))
    xi_tr, xi_te = _four_path_features(cfg, xtr, xte, seeds=(147, 247))
    return dict(
        cfg=cfg,
        xi_tr=xi_tr,
        y_tr=ytr,
        xi_te=xi_te,
        y_te=yte,
        xt_tr=ap.scaled_features(xi_tr),
        xt_te=ap.scaled_features(xi_te),
    )


# ---------------------------------------------------------------- model and path expansion


@pytest.mark.parametrize("heads,widths", [([3], [4, 5]), ([2, 3], [4, 5, 6]), ([2, 3, 2], [4, 5, 6, 3])])
@pytest.mark.parametrize("readout", ["last", "mean", "first"])
def test_path_expansion_equals_forward_pass(heads, widths, readout):
    x, attns, w = random_net(heads, widths)
    f_layers = ap.forward(x, attns, w, readout)
    f_paths = ap.path_forward(ap.path_features(x, attns, readout), w)
    assert f_paths.shape == (x.shape[0],)
    torch.testing.assert_close(f_paths, f_layers, rtol=1e-12, atol=1e-12)


def test_path_order_has_first_layer_head_slowest():
    """Path (h1, h2) of a 2-layer net equals the explicit product for that pair of heads."""
    heads = [2, 3]
    x, attns, _ = random_net(heads, [4, 4, 4])
    xi = ap.path_features(x, attns, "last")
    for h1 in range(2):
        for h2 in range(3):
            expect = torch.einsum("bsi,bst,bt->bi", x, attns[0][:, h1], attns[1][:, h2, :, -1])
            torch.testing.assert_close(xi[:, 3 * h1 + h2], expect)


def test_attention_is_softmax_over_keys():
    g = gen(3)
    x = torch.randn(2, 5, 4, generator=g, dtype=F64)
    W = torch.randn(3, 4, 4, generator=g, dtype=F64)
    A = ap.attention_from_bilinear(x, W, beta=2.0)
    torch.testing.assert_close(A.sum(-2), torch.ones(2, 3, 5, dtype=F64))
    b, h, t = 1, 2, 4
    logits = torch.stack([2.0 * x[b, k] @ W[h] @ x[b, t] for k in range(5)])
    torch.testing.assert_close(A[b, h, :, t], torch.softmax(logits, 0))
    # shift invariance of the softmax: adding a constant to every key logit changes nothing
    torch.testing.assert_close(ap.attention_from_bilinear(x, W, 2.0), A)


def test_prior_mean_of_path_overlap_is_gp_value():
    """Monte Carlo over the prior: E[w_pi . w_pi' / N1] = sa^2 s1^2 s2^2 delta_{pi pi'}."""
    heads, widths, var = [2, 2], [6, 5, 4], [1.0, 0.5, 2.0, 1.5]
    w = ap.init_weights(3, heads, widths, var, n_chains=40_000, generator=gen(4))
    U = ap.path_overlap(w).mean(0)
    expect = ap.gp_order_parameters(heads, var)[0]
    assert float((U - expect).abs().max()) < 0.06 * float(expect[0, 0])


def test_kernel_of_sampled_weights_is_gp_kernel_in_expectation():
    """Averaging f f' over all weights (V0 included) gives K_GP = sum_pi C_pi,pi (times sigmas)."""
    heads, widths = [2, 2], [3, 3, 3]
    x, attns, _ = random_net(heads, widths, batch=3)
    xi = ap.path_features(x, attns)
    w = ap.init_weights(x.shape[-1], heads, widths, n_chains=200_000, generator=gen(5))
    f = ap.path_forward(xi, w)  # (chains, batch)
    K_mc = f.T @ f / f.shape[0]
    xt = ap.scaled_features(xi)
    K = ap.renormalised_kernel(torch.eye(4, dtype=F64), xt, xt)
    assert float((K_mc - K).abs().max()) < 0.05 * float(K.diagonal().max())


def test_kernel_routes_agree():
    g = gen(6)
    xt_a = torch.randn(5, 4, 3, generator=g, dtype=F64)
    xt_b = torch.randn(7, 4, 3, generator=g, dtype=F64)
    A = torch.randn(4, 4, generator=g, dtype=F64)
    U = A @ A.T
    C = ap.path_kernels(xt_a, xt_b)
    torch.testing.assert_close(ap.renormalised_kernel(U, xt_a, xt_b), torch.einsum("pq,pqmn->mn", U, C))
    torch.testing.assert_close(ap.kernel_diagonal(U, xt_a), ap.renormalised_kernel(U, xt_a, xt_a).diagonal())
    # the action's precomputed pair kernels give the same K_U, action and gradient as the features
    Y = torch.sign(torch.randn(5, generator=g, dtype=F64))
    pre = ap.PathAction(xt_a, Y, [2, 2], [3, 4, 5], 0.1)
    raw = ap.PathAction(xt_a, Y, [2, 2], [3, 4, 5], 0.1, precompute_max=0)
    assert pre.C is not None and raw.C is None
    torch.testing.assert_close(pre.kernel(U), ap.renormalised_kernel(U, xt_a, xt_a))
    Us = [U, random_pd(2, 7)]
    torch.testing.assert_close(pre.value(Us), raw.value(Us))
    for g_pre, g_raw in zip(pre.gradient(Us), raw.gradient(Us), strict=True):
        torch.testing.assert_close(g_pre, g_raw)


# ---------------------------------------------------------------- the action and its solver


def random_pd(m, seed):
    A = torch.randn(m, m, generator=gen(seed), dtype=F64)
    return A @ A.T / m + 0.5 * torch.eye(m, dtype=F64)


@pytest.mark.parametrize("heads", [[3], [2, 2], [2, 2, 2]])
def test_explicit_gradient_equals_autograd(heads, small_task):
    """The saddle-point equations (explicit gradient) are the derivative of the action."""
    L = len(heads)
    n_paths = int(np.prod(heads))
    xt = torch.randn(20, n_paths, 6, generator=gen(7), dtype=F64) / 3
    Y = torch.sign(torch.randn(20, generator=gen(8), dtype=F64))
    act = ap.PathAction(
        xt, Y, heads, [5, 7, 6, 4][: L + 1], T=0.1, variances=[1.0, 0.7, 1.3, 0.9, 1.1][: L + 2]
    )
    Us = [random_pd(int(np.prod(heads[l:])), 10 + l).requires_grad_(True) for l in range(L)]
    S = act.value(Us) * act.N
    auto = torch.autograd.grad(S, Us)
    for a, e in zip(auto, act.gradient([U.detach() for U in Us]), strict=True):
        torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-9)


def test_ua_closed_form_is_stationary():
    heads, widths, var = [2, 3], [5, 7, 9], [1.0, 0.8, 1.2, 1.5]
    xt = torch.randn(10, 6, 4, generator=gen(9), dtype=F64)
    act = ap.PathAction(xt, torch.ones(10, dtype=F64), heads, widths, 0.1, var)
    Us = [random_pd(6, 1), random_pd(3, 2)]
    ua = act.u_a(Us[1]).detach().requires_grad_(True)
    (g,) = torch.autograd.grad(act.entropy(Us, ua), ua)
    assert abs(float(g)) < 1e-10
    # and at the GP point u_a = sa^2
    gp = ap.gp_order_parameters(heads, var)
    assert abs(float(act.u_a(gp[1])) - var[-1]) < 1e-12


def test_solver_reaches_saddle_point_and_lowers_action(small_task):
    t = small_task
    act = ap.PathAction(t["xt_tr"], t["y_tr"], [2, 2], [8, 8, 8], T=0.01)
    sol = act.solve()
    assert sol.residual_max < 1e-8
    gp_value = float(act.value(ap.gp_order_parameters([2, 2])))
    assert sol.action < gp_value
    # every order parameter is symmetric positive definite
    for U in sol.Us:
        torch.testing.assert_close(U, U.T)
        assert float(torch.linalg.eigvalsh(U).min()) > 0
    # the Adam-on-raw-matrices reference reaches the same minimum at the same tolerance
    r = ap.compare_solvers(act, tol=1e-5, max_steps=20_000)
    assert r["adam_converged"] and r["lbfgs_grad_max"] < 1e-5
    assert r["U_diff"] < 1e-2 * float(sol.U.abs().max())


def test_gp_limit_as_width_grows(small_task):
    """N -> infinity: U -> GP value with a 1/N approach, and the predictor -> the GP predictor."""
    t = small_task
    gp = ap.gp_order_parameters([2, 2])
    m_gp, v_gp = ap.predict(gp[0], t["xt_tr"], t["y_tr"], t["xt_te"], 0.01)
    devs = []
    for N in (1e3, 1e4, 1e5):
        sol = ap.PathAction(t["xt_tr"], t["y_tr"], [2, 2], [N, N, N], T=0.01).solve()
        devs.append(float((sol.U - gp[0]).abs().max()))
    # deviation shrinks like 1/N (ratio ~10 per decade)
    assert 7 < devs[0] / devs[1] < 13 and 7 < devs[1] / devs[2] < 13
    assert devs[2] < 1e-2
    m, v = ap.predict(sol.U, t["xt_tr"], t["y_tr"], t["xt_te"], 0.01)
    assert float((m - m_gp).abs().max()) < 1e-2 * float(m_gp.abs().max())


def test_single_path_width_only_rescales_the_ridge():
    """One head per layer: K_U = u C, so the mean predictor is GP regression with ridge T/u."""
    g = gen(11)
    xt_tr = torch.randn(15, 1, 5, generator=g, dtype=F64)
    xt_te = torch.randn(9, 1, 5, generator=g, dtype=F64)
    Y = torch.sign(torch.randn(15, generator=g, dtype=F64))
    sol = ap.PathAction(xt_tr, Y, [1, 1], [4, 4, 4], T=0.2).solve()
    u = float(sol.U)
    m, _ = ap.predict(sol.U, xt_tr, Y, xt_te, 0.2)
    m1, _ = ap.predict(torch.ones(1, 1, dtype=F64), xt_tr, Y, xt_te, 0.2 / u)
    torch.testing.assert_close(m, m1)


def test_predictor_variance_matches_direct_formula(small_task):
    t = small_task
    U = random_pd(4, 3)
    m, v = ap.predict(U, t["xt_tr"], t["y_tr"], t["xt_te"][:20], 0.05)
    K = ap.renormalised_kernel(U, t["xt_tr"], t["xt_tr"]) + 0.05 * torch.eye(t["cfg"].P, dtype=F64)
    k = ap.renormalised_kernel(U, t["xt_te"][:20], t["xt_tr"])
    Kss = ap.renormalised_kernel(U, t["xt_te"][:20], t["xt_te"][:20]).diagonal()
    torch.testing.assert_close(m, k @ torch.linalg.solve(K, t["y_tr"]))
    torch.testing.assert_close(v, Kss - (k * torch.linalg.solve(K, k.T).T).sum(1))
    assert float(v.min()) > 0


def test_head_scores_and_alignment():
    U = torch.diag(torch.tensor([4.0, 1.0, 1.0, 0.0], dtype=F64))
    s = ap.head_scores(U, [2, 2])
    # paths (h1,h2): (0,0)=4, (0,1)=1, (1,0)=1, (1,1)=0
    np.testing.assert_allclose(s, [[1.0, 0.2], [1.0, 0.2]])
    Y = torch.tensor([1.0, -1.0, 1.0], dtype=F64)
    K = torch.outer(Y, Y) + 0.1 * torch.eye(3, dtype=F64)
    ov = ap.kernel_alignment(K, Y, 3)
    assert ov[0] == pytest.approx(1.0) and ov[1:].max() < 1e-8


def test_alignment_scalars():
    g = gen(3)
    X = torch.randn(12, 5, generator=g, dtype=F64)
    K = X @ X.T + 0.01 * torch.eye(12, dtype=F64)
    Y = torch.sign(torch.randn(12, generator=g, dtype=F64))
    # squared cosines over all components sum to one (orthonormal eigenbasis)
    assert float((ap.kernel_alignment(K, Y, 12) ** 2).sum()) == pytest.approx(1.0)
    f = [ap.top_pc_label_fraction(K, Y, k) for k in (1, 3, 12)]
    assert 0 <= f[0] <= f[1] <= f[2] == pytest.approx(1.0)
    # both scalars are scale-invariant; the target alignment is 1 exactly for K = c Y Y^T
    assert ap.top_pc_label_fraction(7 * K, Y, 3) == pytest.approx(f[1])
    assert ap.kernel_target_alignment(7 * K, Y) == pytest.approx(ap.kernel_target_alignment(K, Y))
    assert ap.kernel_target_alignment(3 * torch.outer(Y, Y), Y) == pytest.approx(1.0)
    assert abs(ap.kernel_target_alignment(K, Y)) < 1.0
    with pytest.raises(ValueError):
        ap.kernel_alignment(K[:, :5], Y)
    with pytest.raises(ValueError):
        ap.kernel_target_alignment(K, Y[:5])


# ---------------------------------------------------------------- tasks


def test_markov_problem_paths():
    cfg = ap.MarkovTaskConfig(D=12, n_vis=5, P=10, n_test=6)
    four = ap.markov_problem(cfg, 1, "four")
    two = ap.markov_problem(cfg, 1, "two")
    assert four["xi_tr"].shape == (10, 4, cfg.n0) and four["heads"] == [2, 2]
    assert two["xi_te"].shape == (6, 2, cfg.n0) and two["heads"] == [2, 1]
    # same draw, same data: path g (same-token then uniform) is shared by both networks
    torch.testing.assert_close(four["xi_tr"][:, 0], two["xi_tr"][:, 0])
    with pytest.raises(ValueError):
        ap.markov_problem(cfg, 0, "three")


def test_markov_task_structure():
    cfg = ap.MarkovTaskConfig(D=20, n_vis=12, sigma_perp=0.0, sigma_par=0.0)
    x, y, s = ap.make_markov_data(cfg, 400, gen(12))
    assert x.shape == (400, 13, cfg.n0) and (y > 0).sum() == 200
    assert torch.all(x[:, 0, : cfg.D] == 0)  # BOS
    stay = (s[:, 1:] == s[:, :-1]).double().mean(1)
    assert abs(float(stay[y > 0].mean()) - 0.7) < 0.03 and abs(float(stay[y < 0].mean()) - 0.3) < 0.03
    A = ap.attention_from_bilinear(x, ap.markov_heads(cfg, "same")[None], cfg.beta)[:, 0]
    same = s[:, 1:] == s[:, :-1]  # token t (t >= 2) vs token t-1, visible positions start at 1
    prev = torch.stack([A[:, t - 1, t] for t in range(2, 13)], 1)
    bos = torch.stack([A[:, 0, t] for t in range(2, 13)], 1)
    assert float(prev[same].min()) > 0.9 and float(bos[~same].min()) > 0.9
    # the authors' convention for the first two queries: BOS (query 0) attends uniformly, and
    # query 1 (no visible predecessor) scores only BOS positionally, with strength 1.5
    torch.testing.assert_close(A[:, :, 0], torch.full_like(A[:, :, 0], 1 / 13))
    W = ap.markov_heads(cfg, "same")
    assert float(W[cfg.D, cfg.D]) == 0.0 and float(W[cfg.D, cfg.D + 1]) == 1.5
    assert float(W[cfg.D + 1 :, cfg.D + 1].abs().max()) == 0.0
    U = ap.attention_from_bilinear(x, ap.markov_heads(cfg, "uniform")[None], cfg.beta)
    torch.testing.assert_close(U, torch.full_like(U, 1 / 13))


def test_bad_configs_raise():
    with pytest.raises((al.ParameterError, ValueError)):
        ap.MarkovTaskConfig(P=-3)
    with pytest.raises((al.ParameterError, ValueError)):
        ap.MarkovTaskConfig(p_stay=1.5)
    with pytest.raises(ValueError):
        ap.readout_vector(torch.zeros(1, 1, 2, 2), "middle")


# ---------------------------------------------------------------- theory vs posterior sampling


def test_theory_matches_collapsed_hmc_at_small_width(small_task):
    """Exact posterior (V0 integrated out, HMC over the rest) vs the saddle-point theory, N = 8."""
    t = small_task
    N, T = 8, 0.01
    sol = ap.PathAction(t["xt_tr"], t["y_tr"], [2, 2], [N, N, N], T).solve()
    m_th, _ = ap.predict(sol.U, t["xt_tr"], t["y_tr"], t["xt_te"], T)
    post = ap.PathPosterior(t["xi_tr"], t["y_tr"], [2, 2], [N, N, N], T, collapsed=True)
    g = gen(14)
    res = ap.hmc(
        post.log_prob,
        post.init(2, g),
        n_warmup=60,
        n_samples=40,
        n_leapfrog=15,
        generator=g,
        stat_fn=post.statistics,
    )
    assert res.divergences == 0 and res.accept_rate > 0.5
    m_s = post.predictions(res.samples[::4], t["xi_te"]).mean(0)
    corr = float(np.corrcoef(m_s.numpy(), m_th.numpy())[0, 1])
    assert corr > 0.95
    assert abs(ap.accuracy(m_s, t["y_te"]) - ap.accuracy(m_th, t["y_te"])) < 6.0
    U_s = post.overlaps(res.samples)
    # the dominant structure agrees: diagonal within 30 %
    d_th, d_s = sol.U.diagonal(), U_s.diagonal()
    assert float(((d_s - d_th).abs() / d_th).max()) < 0.3


@pytest.mark.slow
def test_full_weight_hmc_agrees_with_collapsed():
    """Sampling every weight (V0 included) gives the same predictor as the collapsed sampler."""
    cfg = ap.MarkovTaskConfig(D=10, n_vis=6, P=20, n_test=100)
    xtr, ytr, _ = ap.make_markov_data(cfg, cfg.P, gen(1))
    xte, _, _ = ap.make_markov_data(cfg, cfg.n_test, gen(2))
    xi_tr, xi_te = _four_path_features(cfg, xtr, xte, seeds=(3, 4))
    means = []
    for collapsed in (True, False):
        post = ap.PathPosterior(xi_tr, ytr, [2, 2], [5, 5, 5], 0.1, collapsed=collapsed)
        g = gen(5)
        res = ap.hmc(post.log_prob, post.init(4, g), 300, 300, 25, generator=g, stat_fn=post.statistics)
        means.append(post.predictions(res.samples[::5], xi_te).mean(0))
    assert float(np.corrcoef(means[0].numpy(), means[1].numpy())[0, 1]) > 0.95


def test_predictive_moments_total_variance(small_task):
    t = small_task
    post = ap.PathPosterior(t["xi_tr"], t["y_tr"], [2, 2], [6, 6, 6], 0.05, collapsed=True)
    z = post.init(3, gen(20))[None]  # three "samples" (1, chains, dim)
    m, v = post.predictive_moments(z, t["xi_te"][:10])
    per = [
        ap.predict(U, post.xt, t["y_tr"], ap.scaled_features(t["xi_te"][:10]), 0.05)
        for U in post.sample_overlaps(z)
    ]
    means = torch.stack([a for a, _ in per])
    torch.testing.assert_close(m, means.mean(0))
    torch.testing.assert_close(v, torch.stack([b for _, b in per]).mean(0) + means.var(0))
