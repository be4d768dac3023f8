"""Assertions on chapter 2's executed summary (quick profile): the effects the chapter claims."""

from __future__ import annotations

import json
import math

import pytest

from .conftest import EXECUTED, _need

pytestmark = pytest.mark.book

KEYS = [
    "recovery_rel_test_error_m1",
    "recovery_rel_test_error_m2",
    "truth_inside_body_fraction",
    "moment_identity_max_rel_error",
    "adam_nice_success_rate",
    "adam_hard_explained_variance",
]


@pytest.fixture(scope="module")
def s() -> dict:
    return json.loads(_need(EXECUTED / "02-provable-mha.summary.json").read_text())


def test_every_key_present_and_finite(s):
    for key in KEYS:
        assert key in s and math.isfinite(s[key]), key


def test_first_moment_identity_holds_in_the_linear_regime(s):
    # the first-order formula explains the bias of the crude estimate to a few per cent
    assert 0 <= s["moment_identity_max_rel_error"] < 0.1


def test_pipeline_recovers_the_layer(s):
    assert s["recovery_rel_test_error_m1"] < 1e-10  # one head: exact up to round-off
    assert s["recovery_rel_test_error_m2"] < 1e-2  # two heads: median over instances


def test_certified_constraints_contain_the_truth(s):
    assert 0.99 <= s["truth_inside_body_fraction"] <= 1.0


def test_adam_succeeds_on_nice_and_fails_on_hard(s):
    assert s["adam_nice_success_rate"] >= 0.75
    assert s["adam_hard_explained_variance"] < 0.5
