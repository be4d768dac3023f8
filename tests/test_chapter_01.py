"""Assertions on chapter 1's executed summary (quick profile): the effects the chapter claims."""

from __future__ import annotations

import json

import pytest

from .conftest import EXECUTED, _need

pytestmark = pytest.mark.book


@pytest.fixture(scope="module")
def s() -> dict:
    return json.loads(_need(EXECUTED / "01-random-features.summary.json").read_text())


def test_kernel_monte_carlo_rate(s):
    """Finite-head kernel -> closed form at the central-limit rate M^{-1/2}.

    Tolerances from the estimator's variance. At each M the chapter averages R squared relative
    errors e_r, each a weighted sum of squared near-Gaussian entries with mean v1/M; the spread of
    such a sum is largest when one direction dominates, then mean(e)/E[e] ~ chi2_R / R. So the
    ratio rms/theory lies in [sqrt(q_lo/R), sqrt(q_hi/R)] with q the chi2_R quantiles at a
    family-wise level 1e-3 over the len(mc_heads) points. The log of each rms has standard
    deviation at most 1/sqrt(2R), which gives the least-squares slope's spread (4 sigma allowed).
    """
    import math

    import numpy as np
    from scipy.stats import chi2

    from attnlib import random_qk as rq

    cfg = rq.PROFILES[s["profile"]]
    R, heads = cfg.mc_repeats, np.log(np.asarray(cfg.mc_heads, dtype=float))
    alpha = 1e-3 / len(heads)
    tol = max(math.sqrt(chi2.ppf(1 - alpha / 2, R) / R) - 1, 1 - math.sqrt(chi2.ppf(alpha / 2, R) / R))
    slope_sd = math.sqrt(1 / (2 * R)) / math.sqrt(((heads - heads.mean()) ** 2).sum())
    assert abs(s["kernel_mc_loglog_slope"] + 0.5) < 4 * slope_sd  # quick: +-0.10
    assert s["kernel_mc_max_rel_dev_from_clt"] < tol  # quick (R = 20, 7 points): 0.63


def test_permutation_invariance_and_out_of_class_target(s):
    assert s["perm_max_abs_diff_rfa"] < 1e-12
    # the max over keys cannot be learned below its (computed) floor, and is far from learned
    assert 0.1 < s["max_over_keys_floor"] < 0.6
    assert s["max_over_keys_rel_risk"] > s["max_over_keys_floor"]
    assert s["max_over_keys_rel_risk"] > 0.4


def test_rfa_beats_rfmlp_and_ignores_N(s):
    assert s["rfmlp_over_rfa_at_max_n"] > 20
    assert s["rfa_spread_over_N"] < 3
    # RFA's risk halves within a small multiple of the (1,1) block dimension, for every N
    for ratio in s["rfa_half_risk_n_over_block_dim"].values():
        assert 0.5 < ratio < 8


def test_heads_error_falls_like_one_over_M(s):
    assert -1.6 < s["heads_loglog_slope"] < -0.6


def test_brfa_trade_off(s):
    assert s["brfa_over_rfa_deg1"] > 2  # the mean hurts the degree-1 target
    assert s["brfa_over_rfa_deg2"] < 0.8  # and helps the degree-2 target
    # at small d, RFA overtakes BRFA on the degree-2 target once n passes its block
    assert s["brfa_over_rfa_small_d_at_max_n"] > 1
    assert s["brfa_rfa_crossing_over_block"] > 0
