"""The generated Omniglot-like glyph set (attnlib.glyphs, chapter 4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlib import ParameterError
from attnlib import glyphs as ag

SMALL = ag.GlyphConfig(n_drawers=4, max_per_script=6)


@pytest.fixture(scope="module")
def small() -> ag.GlyphSet:
    return ag.make_glyphs(SMALL, cache=False)


def test_deterministic_given_the_seed(small):
    again = ag.make_glyphs(SMALL, cache=False)
    np.testing.assert_array_equal(small.images, again.images)
    np.testing.assert_array_equal(small.codepoints, again.codepoints)
    np.testing.assert_array_equal(small.meta_test, again.meta_test)
    other = ag.make_glyphs(ag.GlyphConfig(n_drawers=4, max_per_script=6, seed=1), cache=False)
    assert other.images.shape[1:] == small.images.shape[1:]
    assert not np.array_equal(other.images[: len(small.images)], small.images[: len(other.images)])


def test_classes_split_by_script(small):
    tr, te = small.classes("train"), small.classes("test")
    assert len(tr) > 0 and len(te) > 0
    assert set(tr.tolist()).isdisjoint(te.tolist())
    assert len(tr) + len(te) == small.n_classes
    # whole scripts go to one side, as Omniglot splits alphabets
    assert set(small.script[tr].tolist()).isdisjoint(small.script[te].tolist())
    assert set(small.script_names("train")).isdisjoint(small.script_names("test"))
    assert len(set(small.codepoints.tolist())) == small.n_classes
    assert np.bincount(small.script).max() <= SMALL.max_per_script
    n_scripts = len(small.scripts)
    assert len(small.script_names("test")) == round(SMALL.test_fraction * n_scripts)


def test_images_are_not_degenerate(small):
    im = small.images
    assert im.shape == (small.n_classes, SMALL.n_drawers, SMALL.size, SMALL.size)
    assert im.min() >= 0.0 and im.max() <= 1.0
    ink = (im > 0.5).mean(axis=(2, 3))  # inked fraction of every drawing
    assert ink.min() > 0.005 and ink.max() < 0.9
    # drawers differ, and drawings of one class resemble each other more than other classes
    flat = im.reshape(small.n_classes, SMALL.n_drawers, -1)
    assert np.abs(flat[:, 0] - flat[:, 1]).mean(1).min() > 0.0
    z = flat - flat.mean(-1, keepdims=True)
    z /= np.linalg.norm(z, axis=-1, keepdims=True)
    cen = z.mean(1)
    within = np.einsum("cdp,cp->cd", z, cen).mean()
    between = np.einsum("cdp,kp->cdk", z, cen)
    between = (between.sum(-1) - np.einsum("cdc->cd", between)).mean() / (small.n_classes - 1)
    assert within > between + 0.3


def test_no_duplicate_glyphs():
    base, cps, _ = ag.render_base_glyphs(side=64)
    keep = ag._dedup(base, 0.95)
    small = torch.nn.functional.adaptive_avg_pool2d(torch.from_numpy(base[keep])[:, None], 16)
    z = small.reshape(len(keep), -1).double()
    z = z - z.mean(1, keepdim=True)
    z = z / z.norm(dim=1, keepdim=True)
    c = z @ z.T
    c.fill_diagonal_(0.0)
    assert float(c.max()) < 0.95
    assert len(keep) < len(cps)  # Latin A, Greek Alpha, Cyrillic A ... collapse


def test_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLIB_CACHE_DIR", str(tmp_path))
    cfg = ag.GlyphConfig(n_drawers=3, max_per_script=3, seed=5)
    first = ag.make_glyphs(cfg)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 1 and files[0].startswith("glyphs-") and files[0].endswith(".npz")
    second = ag.make_glyphs(cfg)
    np.testing.assert_array_equal(first.images, second.images)
    np.testing.assert_array_equal(first.meta_test, second.meta_test)
    assert first.scripts == second.scripts
    assert ag.glyph_cache_dir() == tmp_path


@pytest.mark.parametrize(
    "kw", [dict(size=8), dict(n_drawers=1), dict(test_fraction=1.0), dict(noise=-0.1), dict(seed=-1)]
)
def test_bad_config_is_rejected(kw):
    with pytest.raises(ParameterError):
        ag.GlyphConfig(**kw)
