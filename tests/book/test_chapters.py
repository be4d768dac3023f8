"""Every chapter of the table of contents, as executed by `attnbook build` (quick profile)."""

from __future__ import annotations

import json
import math
import re

import pytest

from attnbook.params import toc_chapters

from ..conftest import EXECUTED, ROOT, _need, load_extension

pytestmark = pytest.mark.book

#: The stable summary keys each chapter's issue names.
REQUIRED_KEYS = {
    "00-attention": ["sdpa_max_abs_diff"],
    "01-random-features": [
        "rfmlp_over_rfa_at_max_n", "rfa_spread_over_N", "brfa_over_rfa_deg1", "brfa_over_rfa_deg2",
        "heads_loglog_slope", "kernel_mc_loglog_slope", "max_over_keys_rel_risk",
        "threshold_cumrank_by_block", "crossing_over_cumrank_threshold", "heads_largest_M",
        "heads_risk_over_inf_at_largest_M", "heads_excess_loglog_slope",
        "max_over_keys_rel_gap_to_floor", "brfa_theory_max_abs_log10_dev", "ridge_at_grid_edge",
        "samples_to_risk_by_N",
    ],
    "02-provable-mha": [
        "ablation_random_start_success_m2", "pipeline_no_polish_rel_error_m2",
        "pipeline_with_polish_success_m2", "body_half_thickness_limit",
        "body_half_thickness_largest_n", "body_limit_thickness_by_d",
        "certification_oracle_free_success_rate", "hard_family_hidden_share_by_r",
        "hard_family_success_by_d", "moment_identity_max_rel_error", "adam_nice_success_rate",
    ],
    "03-positional-semantic": [
        "alpha_c", "alpha_l", "alpha_c_by_omega", "alpha_l_by_omega", "eps_g_semantic_alpha2",
        "eps_g_positional_alpha2", "eps_g_linear_baseline", "gd_vs_theory_eps_g_rel_diff",
        "histogram_val_acc_positional", "histogram_val_acc_semantic", "solver_seconds_per_point",
        "solver_speedup_vs_reference", "solver_speedup_vs_reference_single",
        "alpha_c_sign_changes_by_omega", "positional_families_with_multiple_fixed_points",
        "theory_fraction_converged", "reference_iterations_alpha2", "eps_g_by_d",
        "aprime_alpha_c_by_omega", "rank2_map_shape",
    ],
    "04-attention-paths": [
        "hmc_gp_all_paths_acc", "hmc_gp_good_path_acc", "hmc_theory_acc_by_N", "hmc_U_gd_smallest_N",
        "sampling_vs_theory_acc_diff", "sampling_vs_theory_mean_corr", "saddle_residual_max",
        "images_pruning_rank_corr_mean", "solver_speedup_vs_adam",
    ],
}
COMMON_KEYS = ["profile", "device", "seed", "wall_s"]


def _finite(value) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, int | float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return False


@pytest.mark.parametrize("chapter", toc_chapters())
def test_summary_has_every_key(chapter, summaries):
    summary = summaries[chapter]
    missing = [k for k in REQUIRED_KEYS[chapter] + COMMON_KEYS if k not in summary]
    assert not missing, f"{chapter}.summary.json lacks {missing}"
    for key in REQUIRED_KEYS[chapter]:
        assert _finite(summary[key]), f"{chapter}: {key}={summary[key]!r} is not finite"
    assert summary["profile"] == "quick" and summary["seed"] == 0


@pytest.mark.parametrize("chapter", toc_chapters())
def test_executed_notebook_has_no_errors(chapter):
    nb = json.loads((EXECUTED / f"{chapter}.ipynb").read_text())
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error", f"{chapter}: error output {out.get('ename')}"
    tags = [cell["metadata"].get("tags", []) for cell in nb["cells"]]
    assert any("parameters" in t and "remove-cell" in t for t in tags)
    assert any("injected-parameters" in t and "hide-input" in t for t in tags)


def test_chapter0_explicit_attention_matches_sdpa(summaries):
    s = summaries["00-attention"]
    assert s["sdpa_max_abs_diff"] < 1e-12
    # the annealed prediction holds in the self-averaging window and fails beyond beta_*
    assert s["neff_max_rel_err_selfaveraging"] < 0.1
    assert s["neff_rel_err_at_beta_star"] > s["neff_max_rel_err_selfaveraging"]
    assert s["neff_ratio_at_beta3"] > 2


def test_chapter0_quick_run_agrees_with_the_stored_full_run(summaries):
    s = summaries["00-attention"]
    if "neff_full_max_z" not in s:
        pytest.skip("no paper-scale N_eff table stored, or the chapter ran with the full profile")
    assert s["neff_full_layers"] > 24  # the stored table is the paper-scale one
    # max of ~24 differences in combined standard errors: above 4.5 has probability < 2e-4
    assert s["neff_full_max_z"] < 4.5
    assert s["neff_full_max_rel_diff"] < 0.1


#: a {paper-scale} block of a chapter: its marker and its body (book/_ext/paperscale.py)
PAPER_SCALE = re.compile(r"^(`{3,})\{paper-scale\}\s+(\S+)\s*\n(.*?)^\1\s*$", re.M | re.S)


@pytest.mark.parametrize("chapter", toc_chapters())
def test_paper_scale_blocks_have_every_number_they_quote(chapter):
    """A quick run that read a stored table glues the block's marker and then every number of its
    body (the site build checks the same, page by page; this names the chapter and the keys)."""
    GLUE_REF = load_extension("paperscale").GLUE_REF
    nb = json.loads(_need(EXECUTED / f"{chapter}.ipynb").read_text())
    glued = {out["metadata"]["scrapbook"]["name"] for cell in nb["cells"] if cell["cell_type"] == "code"
             for out in cell.get("outputs", []) if "scrapbook" in out.get("metadata", {})}
    source = (ROOT / "chapters" / f"{chapter}.md").read_text()
    for _fence, marker, body in PAPER_SCALE.findall(source):
        if marker in glued:
            missing = sorted(set(GLUE_REF.findall(body)) - glued)
            assert not missing, f"{chapter}: paper-scale block {marker} shown without {missing}"
