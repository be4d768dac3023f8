"""Claims as records (attnbook.claims): a claim is checked against its own value, its held-out
value and the disjointness of the held-out seeds; the claims page lists it."""

from __future__ import annotations

import json

import pytest

import attnbook as ab
from attnbook import claims
from attnbook.layout import BuildError


@pytest.fixture
def run():
    return ab.start_chapter("99-claims", profile="quick", device="cpu", seed=0, quiet=True)


def _claim(run, **kw):
    args = dict(statement="The error stays below 0.15.", criterion=("<", 0.15), control="random starts",
                control_value=0.9, heldout=0.12, heldout_on=[3, 4, 5], figure_on=[0, 1, 2],
                heldout_what="seeds 3-5", figure="fig-x", glue=False)
    args.update(kw)
    return ab.claim(run, "ch9-err", 0.1, **args)


@pytest.mark.parametrize(("criterion", "value", "ok"), [
    (("<", 1), 0.5, True), (("<", 1), 1.0, False), (("<=", 1), 1.0, True), ((">", 0), -0.1, False),
    ((">=", 2), 2, True), (("between", 0.9, 1.1), 1.0, True), (("between", 0.9, 1.1), 1.2, False),
    (("<", 1), float("nan"), False), (("<", 1), None, False),
])
def test_criteria(criterion, value, ok):
    assert claims.holds(criterion, value) is ok


def test_a_supported_claim_is_recorded(run):
    assert _claim(run) == 0.1
    record = run.records["claims"]["ch9-err"]
    assert record["heldout"] == 0.12 and record["heldout_on"] == [3, 4, 5]
    assert record["criterion"] == ["<", 0.15]
    assert claims.check_claims({"09-x": run.records}) == 1


def _contradicted(run, capsys, **kw):
    _claim(run, **kw)
    reason = run.records["claims"]["ch9-err"]["contradicted"]
    assert capsys.readouterr().err.strip() == f"attnbook: {reason}"
    with pytest.raises(ab.ClaimError):
        claims.check_claims({"09-x": run.records})
    return reason


def test_a_contradicting_held_out_value_is_recorded_and_stops_the_site(run, capsys):
    assert "held-out value 0.2 (seeds 3-5) is not below 0.15" in _contradicted(run, capsys, heldout=0.2)


def test_a_figure_value_that_fails_its_own_criterion_is_contradicted(run, capsys):
    assert "figure's value" in _contradicted(run, capsys, criterion=(">", 0.5))


def test_held_out_seeds_must_differ_from_the_figure(run, capsys):
    assert "reuses the figure's [2]" in _contradicted(run, capsys, heldout_on=[2, 3])


def test_a_malformed_claim_raises_at_once(run):
    with pytest.raises(ab.ClaimError, match="criterion"):
        _claim(run, criterion=("~", 1))


def test_the_site_check_catches_an_edited_summary(run):
    _claim(run)
    summary = {"claims": {"ch9-err": dict(run.records["claims"]["ch9-err"], heldout=0.3)}}
    with pytest.raises(ab.ClaimError, match="09-x: claim ch9-err"):
        claims.check_claims({"09-x": summary})


def test_the_claims_page_has_one_row_per_claim(run):
    _claim(run)
    text = claims.claims_markdown({"09-x": run.records, "10-y": {}}, {"09-x": "Nine"})
    assert "## Nine" in text and "10-y" not in text
    assert "The error stays below 0.15." in text and "random starts: 0.9" in text
    assert "0.12 (seeds 3-5)" in text and "{numref}`fig-x`" in text and "below 0.15" in text


def test_a_claim_without_held_out_data_is_listed_as_unchecked(run):
    _claim(run, heldout=None, heldout_on=[0])  # e.g. a full page: no overlap check without a held-out run
    assert claims.unchecked({"09-x": run.records}) == ["09-x/ch9-err"]
    assert "not checked in this build" in claims.claims_markdown({"09-x": run.records})


CLAIM_CHAPTER = '''
import attnbook as ab

run = ab.start_chapter("97-claim", profile=profile, device=device, seed=seed, quiet=True)
ab.claim(run, "ch97-err", 0.1, statement="The error stays below 0.15.", criterion=("<", 0.15),
         control="random starts", control_value=0.9, heldout=heldout, heldout_on=["d = 1000"],
         figure_on=["d = 100"], heldout_what="the run at d = 1000")
run.write_summary()
'''


def test_a_contradicting_held_out_value_fails_the_build(tmp_path, monkeypatch, capsys):
    from attnbook import cli, site, slots

    from ..conftest import myst_chapter, point_book_at, tiny_book

    params = 'profile = "quick"\ndevice = "cpu"\nseed = 0\nheldout = 0.12'
    root = tiny_book(tmp_path / "root", "97-claim", myst_chapter("Claims", params, CLAIM_CHAPTER))
    point_book_at(root, monkeypatch)
    (root / "_config.yml").write_text("title: t\n")
    (root / "book").mkdir()
    assert cli.main(["run", "97-claim"]) == 0  # a supported claim: executed, staged, listed
    src = site.stage_site(["97-claim"])
    assert "The error stays below 0.15." in (src / site.CLAIMS).read_text()
    assert "## Claims" in (src / site.CLAIMS).read_text()  # the chapter's title
    # the kit fed a contradicting held-out value: the chapter runs and says so, the site stops
    assert cli.main(["run", "97-claim", "-p", "heldout=0.3"]) == 0
    with pytest.raises(BuildError, match="a claim is contradicted: 97-claim: claim ch97-err: the held-out"):
        site.stage_site(["97-claim"], {"97-claim": "97-claim@heldout=0.3"})
    # and a summary that contradicts its claim (edited, or written by older code) stops the site
    summary = slots.slot_paths("97-claim", "97-claim")[1]
    record = json.loads(summary.read_text())
    record["claims"]["ch97-err"]["heldout"] = 0.3
    summary.write_text(json.dumps(record))
    with pytest.raises(BuildError, match="a claim is contradicted: 97-claim: claim ch97-err"):
        site.stage_site(["97-claim"])
