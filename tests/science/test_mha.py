"""Unit tests of attnlib.mha (chapter 02-provable-mha): closed forms, exact recoveries, invariances."""

import itertools
import math

import numpy as np
import pytest
import torch

import attnlib as al
from attnlib import mha

DT = torch.float64


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def all_inputs(k, d):
    """Every sequence in {-1,+1}^{k x d} (exact expectations by enumeration)."""
    bits = torch.tensor(list(itertools.product([-1.0, 1.0], repeat=k * d)), dtype=DT)
    return bits.reshape(-1, k, d)


def test_forward_matches_explicit_loop_and_head_permutation():
    g = gen(1)
    X = mha.boolean_inputs(7, 4, 5, g)
    theta, w = mha.random_heads(3, 5, 2.0, g)
    F = mha.mha_forward(X, theta, w)
    ref = torch.zeros_like(F)
    for i in range(3):
        for n in range(7):
            S = torch.softmax(X[n] @ theta[i] @ X[n].T, dim=-1)
            ref[n] += S @ X[n] @ w[i]
    assert torch.allclose(F, ref, atol=1e-12)
    perm = [2, 0, 1]
    assert torch.allclose(mha.mha_forward(X, theta[perm], w[perm]), F, atol=1e-12)
    # leading (seed) dimensions broadcast
    Fb = mha.mha_forward(X, torch.stack([theta, theta]), torch.stack([w, 2 * w]))
    assert torch.allclose(Fb[1], 2 * F, atol=1e-12)


def test_first_moment_linearisation_is_second_order_exact_enumeration():
    """E[X^T softmax(X Theta X^T) X] (exact, 2^12 sequences) minus the first-order formula is
    O(||Theta||^2): halving Theta divides the remainder by about 4."""
    k, d = 3, 4
    X = all_inputs(k, d)
    theta = torch.randn(d, d, generator=gen(2), dtype=DT)
    theta = theta / theta.norm()
    rem = []
    for s in (0.2, 0.1, 0.05):
        S = mha.attention_weights(X, (s * theta)[None])[:, 0]
        exact = torch.einsum("nad,nab,nbe->de", X, S, X) / X.shape[0]
        rem.append((exact - mha.first_moment_linear(s * theta, k)).norm().item())
    assert 3.0 < rem[0] / rem[1] < 5.0 and 3.0 < rem[1] / rem[2] < 5.0


def test_moment_identity_monte_carlo():
    """Monte Carlo E[X^T F(X)] agrees with sum_i M(Theta_i) W_i, M by exact enumeration."""
    k, d = 3, 4
    g = gen(3)
    theta, w = mha.random_heads(2, d, 0.8, g)
    Xall = all_inputs(k, d)
    S = mha.attention_weights(Xall, theta)  # (n, m, k, k)
    M = torch.einsum("nad,nmab,nbe->mde", Xall, S, Xall) / Xall.shape[0]
    target = torch.einsum("mde,mef->df", M, w)
    X = mha.boolean_inputs(200_000, k, d, g)
    Y = mha.mha_forward(X, theta, w)
    per = torch.einsum("nad,nae->nde", X, Y)
    est, se = per.mean(0), per.std(0) / math.sqrt(X.shape[0])
    assert torch.allclose(mha.crude_sum_estimate(X, Y), est, atol=1e-12)
    assert ((est - target).abs() <= 5 * se + 1e-4).all()
    # the control-variate estimator of M(Theta) agrees with enumeration too
    mean, se2 = mha.attention_moment(X[:50_000], theta[0])
    assert ((mean - M[0]).abs() <= 6 * se2 + 1e-3).all()


def test_single_head_exact_recovery():
    g = gen(4)
    d, k = 6, 3
    theta, w = mha.random_heads(1, d, 1.5, g)
    X = mha.boolean_inputs(60, k, d, g)
    Y = mha.mha_forward(X, theta, w)
    th, wh = mha.recover_single_head(X, Y)
    et, ew = mha.matched_errors(th, wh, theta, w)
    assert et < 1e-8 and ew < 1e-8
    Xt = mha.boolean_inputs(500, k, d, g)
    assert mha.relative_test_error(Xt, th, wh, theta, w).item() < 1e-16


def test_unmixing_with_known_projections():
    g = gen(5)
    d, k, m = 8, 3, 2
    theta, w = mha.random_heads(m, d, 2.0, g)
    X = mha.boolean_inputs(20, k, d, g)
    X = X[torch.linalg.matrix_rank(X) == k]  # a repeated or dependent token leaves S undetermined
    assert len(X) >= 15
    S = mha.attention_from_outputs(X, mha.mha_forward(X, theta, w), w)
    assert torch.allclose(S, mha.attention_weights(X, theta), atol=1e-9)


def test_lstsq_with_true_theta_returns_true_w():
    g = gen(6)
    d, k, m = 6, 3, 2
    theta, w = mha.random_heads(m, d, 3.0, g)
    X = mha.boolean_inputs(200, k, d, g)
    wh, res = mha.lstsq_projections(X, mha.mha_forward(X, theta, w), theta)
    assert (wh - w).abs().max().item() < 1e-10
    assert res.item() < 1e-20


def test_true_heads_satisfy_every_certified_constraint():
    g = gen(7)
    d, k, m, eta = 8, 3, 2, 0.05
    theta, w = mha.random_heads(m, d, 4.0, g)
    X = mha.boolean_inputs(3000, k, d, g)
    Y = mha.mha_forward(X, theta, w)
    for events in (mha.oracle_events(X, theta, eta), mha.certify_events(X, Y, w.sum(0), 2e-2)[0]):
        assert len(events) >= 5
        A, tau = mha.constraint_matrix(X, events, eta)
        body = mha.Body(A, tau)
        assert body.contains(theta).all()
        # ... hence the whole wedge {l1 T1 + l2 T2 : l >= 0, l1 + l2 >= 1}
        for l1, l2 in [(1.0, 0.0), (0.5, 0.5), (0.2, 3.0), (4.0, 0.0)]:
            assert body.contains(l1 * theta[0] + l2 * theta[1])
    assert not body.contains(0.0 * theta[0])  # the margin excludes the origin


def test_body_min_norm_point_and_extent():
    g = gen(8)
    d, k, m, eta = 5, 3, 2, 0.05
    theta, _ = mha.random_heads(m, d, 4.0, g)
    X = mha.boolean_inputs(400, k, d, g)
    A, tau = mha.constraint_matrix(X, mha.oracle_events(X, theta, eta), eta)
    body = mha.Body(A, tau)
    p = body.min_norm_point()
    assert body.slack(p.reshape(d, d)).min() > -1e-8
    # optimality: no member of the wedge is shorter, and KKT via a reference solver
    assert np.linalg.norm(p) <= min(theta[i].norm().item() for i in range(m)) + 1e-9
    from scipy.optimize import LinearConstraint, minimize

    ref = minimize(lambda x: x @ x, theta[0].numpy().ravel(), jac=lambda x: 2 * x,
                   constraints=[LinearConstraint(A, tau, np.inf)], method="SLSQP",
                   options={"maxiter": 500, "ftol": 1e-12})
    assert abs(np.linalg.norm(p) - np.linalg.norm(ref.x)) < 1e-4
    # the ray extent lands on the boundary
    u = torch.randn(d * d, generator=g, dtype=DT).numpy()
    t = body.extent(theta.mean(0).numpy(), u)
    edge = theta.mean(0).numpy().ravel() + t * u
    assert abs(body.slack(edge.reshape(d, d)).min()) < 1e-9
    v = body.vertex(p, bound=50.0)
    assert body.slack(v.reshape(d, d)).min() > -1e-7


def test_matched_errors_is_permutation_invariant():
    g = gen(9)
    theta, w = mha.random_heads(3, 4, 1.0, g)
    perm = [1, 2, 0]
    assert mha.matched_errors(theta[perm], w[perm], theta, w) == (0.0, 0.0)
    et, _ = mha.matched_errors(theta * 1.1, w, theta, w)
    assert abs(et - 0.1) < 1e-12


@pytest.mark.parametrize("r", [2, 3])
def test_hard_family_slice_formula_and_orthogonality(r):
    d = 7
    theta, w, S = mha.hard_family(d, r)
    X = all_inputs(2, d)  # 2^14 pairs: exact averages
    F = mha.mha_forward(X, theta, w)
    x1, z1 = X[:, 0, 0], X[:, 1, 0]
    t = (X[:, 1, S] - X[:, 0, S]).sum(-1)
    indep, dep = mha.hard_components(X, theta, w)
    assert torch.allclose(indep + dep, F)
    assert dep[x1 == z1].abs().max() < 1e-12  # S-dependent part lives on the slice z1 = -x1
    # on that slice F_11 is proportional to the Krawtchouk target g(t)
    g_tab = mha.krawtchouk_target(r)
    sl = (x1 != z1) & (t != 0)
    g_t = torch.tensor([math.copysign(1.0, v) * g_tab[abs(int(v)) // 2 - 1] for v in t[sl].tolist()],
                       dtype=DT)
    ratio = F[sl, 0, 0] / g_t
    assert torch.allclose(ratio, ratio[0].expand_as(ratio), atol=1e-10)
    assert torch.allclose(F.var(0)[:, 0], torch.ones(2, dtype=DT), atol=1e-3)  # unit variance
    assert abs((indep * dep).sum().item()) / X.shape[0] < 1e-12  # orthogonal parts


def test_adam_batched_over_seeds_equals_separate_runs():
    g = gen(10)
    d, k, m = 4, 3, 1
    theta, w = mha.random_heads(m, d, 1.0, g)
    X = mha.boolean_inputs(64, k, d, g)
    Y = mha.mha_forward(X, theta, w)
    init = (0.1 * torch.randn(2, m, d, d, generator=g, dtype=DT),
            0.1 * torch.randn(2, m, d, d, generator=g, dtype=DT))
    both = mha.train_adam(X, Y, m, seeds=2, steps=5, batch=16, init=init, generator=gen(11))
    one = mha.train_adam(X, Y, m, seeds=1, steps=5, batch=16,
                         init=(init[0][1:], init[1][1:]), generator=gen(11))
    assert torch.allclose(both["theta"][1], one["theta"][0], atol=1e-12)
    assert torch.allclose(both["test_error"][:, 1], one["test_error"][:, 0], atol=1e-12)


def test_config_validation():
    with pytest.raises(al.ParameterError):
        mha.MHAConfig(d=-1)
    with pytest.raises(al.ParameterError):
        mha.MHAConfig(eta=0.7)


def test_pipeline_without_oracle_certifies_soundly_and_reports_its_phases():
    """What the pipeline guarantees by construction: its own estimate of sum_i W_i (exact for one
    head, via the row-sum regression), a tolerance eta + err_hat, constraints that hold at the truth;
    the polish can only lower the training residual of the net's candidate."""
    g = gen(12)
    d, k = 8, 3
    theta, w = mha.random_heads(1, d, 4.0, g)
    X = mha.boolean_inputs(400, k, d, g)
    Y = mha.mha_forward(X, theta, w)
    out = mha.recover_heads(X, Y, 1, grid=5)
    assert (out["w_sum"] - w[0]).abs().max() < 1e-3
    assert out["cert_tol"] == pytest.approx(0.05 + out["sum_error"])
    assert out["sum_error"] < 1e-3
    assert (out["body"].slack(theta) >= -1e-9).all()
    res_net = mha.lstsq_projections(X, Y, out["theta_net"])[1]
    res_fin = mha.lstsq_projections(X, Y, out["theta"])[1]
    assert res_fin <= res_net
    Xt = mha.boolean_inputs(500, k, d, g)
    assert mha.relative_test_error(Xt, out["theta"], out["w"], theta, w).item() < 1e-12
    nop = mha.recover_heads(X, Y, 1, grid=5, polish=False)
    assert torch.equal(nop["theta"], nop["theta_net"]) and nop["polish_starts"] == 0


def test_certification_tolerance_is_derived_and_validated():
    assert mha.certification_tolerance(0.05, 0.01) == pytest.approx(0.06)
    with pytest.raises(al.ParameterError):
        mha.certification_tolerance(0.7, 0.0)
    with pytest.raises(al.ParameterError):
        mha.certification_tolerance(0.05, -1.0)


def test_random_start_search_fits_a_benign_layer():
    g = gen(14)
    theta, w = mha.random_heads(2, 6, 2.0, g)
    X = mha.boolean_inputs(300, 3, 6, g)
    th, wh, res = mha.random_start_search(X, mha.mha_forward(X, theta, w), 2, 2, 2.0,
                                          generator=gen(15))
    assert res < 1e-16 and th.shape == theta.shape


def test_limit_body_contains_every_finite_sample_halfspace():
    """K_infinity is cut by every halfspace a finite sample can produce: each oracle event of a
    sample is among the enumerated triples, so K_n contains K_infinity, and the score-table
    slacks equal the constraint-matrix slacks."""
    g = gen(16)
    d, k, eta = 5, 3, 0.05
    theta, _ = mha.random_heads(2, d, 4.0, g)
    triples = mha.limit_events(theta, eta, k)
    lim = mha.CubeBody(triples, math.log((1 - eta) / eta), d)
    X = mha.boolean_inputs(3000, k, d, g)
    ev = mha.oracle_events(X, theta, eta)
    assert len(ev) > 10
    tokens = mha.cube_tokens(d)
    index = {tuple(t.tolist()): i for i, t in enumerate(tokens)}
    have = {tuple(t) for t in triples.tolist()}
    for n, a, b in ev.tolist():
        for c in range(k):
            if c != b:
                key = (index[tuple(X[n, a].tolist())], index[tuple(X[n, b].tolist())],
                       index[tuple(X[n, c].tolist())])
                assert key in have
    A = np.stack([np.outer(tokens[q], tokens[b] - tokens[c]).ravel()
                  for q, b, c in triples[:50].tolist()])
    probe = torch.randn(d, d, generator=g, dtype=DT)
    assert np.allclose(lim.slack(probe)[:50], A @ probe.numpy().ravel() - lim.tau)
    assert lim.contains(theta[0]) and lim.contains(theta[1])
    # a finite body is at least as thick as the limit in every direction
    Af, tau = mha.constraint_matrix(X, ev, eta)
    finite = mha.Body(Af, tau)
    mid = theta.mean(0).numpy()
    for _ in range(5):
        u = torch.randn(d * d, generator=g, dtype=DT).numpy()
        assert finite.extent(mid, u) >= lim.extent(mid, u) - 1e-9


@pytest.mark.parametrize("r", [1, 2, 3])
def test_hard_family_hidden_share_is_set_exactly(r):
    d = 5
    theta, w, _ = mha.hard_family(d, r, hidden_share=0.25)
    assert theta.shape[0] == r + 1 and theta[-1].abs().max() == 0  # one uniform head
    X = all_inputs(2, d)
    F = mha.mha_forward(X, theta, w)
    _, dep = mha.hard_components(X, theta, w)
    share = (dep**2).sum() / ((F - F.mean(0)) ** 2).sum()
    assert abs(share.item() - 0.25) < 1e-10
    assert torch.allclose(F.var(0, correction=0)[:, 0], torch.ones(2, dtype=DT), atol=1e-10)


def test_adam_plateau_stops_early_on_a_solved_problem():
    """Started at the truth the loss is zero and stays there: the plateau rule must stop at the
    first check (two windows), while without it the run goes to the cap."""
    g = gen(17)
    theta, w = mha.random_heads(1, 3, 1.0, g)
    X = mha.boolean_inputs(64, 2, 3, g)
    Y = mha.mha_forward(X, theta, w)
    kw = dict(seeds=1, steps=2000, batch=16, init=(theta[None], w[None]), log_every=100)
    out = mha.train_adam(X, Y, 1, generator=gen(18), plateau=(200, 0.01), **kw)
    assert out["stopped"] == 400
    assert mha.train_adam(X, Y, 1, generator=gen(18), **kw)["stopped"] == 2000
