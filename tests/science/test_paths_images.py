"""The one-shot glyph task of chapter 4: episode builder and the gradient-descent path network."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlib import ParameterError
from attnlib import glyphs as ag
from attnlib import paths as ap


@pytest.fixture(scope="module")
def glyph_set() -> ag.GlyphSet:
    return ag.make_glyphs(ag.GlyphConfig(n_drawers=5, max_per_script=8), cache=False)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def test_episodes_are_valid_two_way_one_shot(glyph_set):
    ep = ap.make_episodes(glyph_set, 400, "test", gen(0))
    assert ep.x.shape == (400, 48, 49) and ep.x.dtype == torch.float64 and len(ep) == 400
    cls, dr, y = ep.classes.numpy(), ep.drawers.numpy(), ep.y.numpy()
    assert set(np.unique(y)) == {-1.0, 1.0}
    assert np.all(cls[:, 0] != cls[:, 1])  # two different characters
    # the query is of A's class exactly when y = +1, and it is a different drawing of it
    q_is_a = cls[:, 2] == cls[:, 0]
    np.testing.assert_array_equal(q_is_a, y > 0)
    assert np.all(cls[:, 2] == np.where(y > 0, cls[:, 0], cls[:, 1]))
    same = np.where(y > 0, dr[:, 0], dr[:, 1])
    assert np.all(dr[:, 2] != same)
    # classes come from the split only
    assert set(cls.ravel().tolist()) <= set(glyph_set.classes("test").tolist())
    tr = ap.make_episodes(glyph_set, 200, "train", gen(1))
    assert set(tr.classes.numpy().ravel().tolist()) <= set(glyph_set.classes("train").tolist())
    # balanced labels: binomial(400, 1/2), 5 standard deviations
    assert abs(y.mean()) < 5 / math.sqrt(400)


def test_episode_tokens_are_patch_plus_label_plus_position(glyph_set):
    ep = ap.make_episodes(glyph_set, 6, "train", gen(2))
    imgs = torch.from_numpy(glyph_set.images)[ep.classes, ep.drawers]  # (6, 3, 28, 28)
    tok = ap.patch_tokens(imgs, 7).reshape(6, 48, 49).double()
    rest = ep.x - tok  # label embedding + position code, the same for every episode
    torch.testing.assert_close(rest, rest[:1].expand_as(rest), rtol=0, atol=1e-5)
    # within an image the label part is constant: differences between images' tokens at the same
    # patch position are differences of label embeddings plus position codes
    lab = rest[0].reshape(3, 16, 49)
    assert float((lab[0] - lab[1]).std(0).abs().max()) > 0.0
    # patches are normalised to zero mean
    assert float(tok.mean(-1).abs().max()) < 1e-5
    # deterministic from the generator
    again = ap.make_episodes(glyph_set, 6, "train", gen(2))
    torch.testing.assert_close(ep.x, again.x)


def test_bad_episode_requests_raise(glyph_set):
    with pytest.raises(ParameterError):
        ap.make_episodes(glyph_set, 10, "valid", gen(0))
    with pytest.raises(ParameterError):
        ap.make_episodes(glyph_set, 0, "train", gen(0))
    with pytest.raises(ParameterError):
        ap.ImageTaskConfig(patch=5)  # does not divide 28
    with pytest.raises(ParameterError):
        ap.ImageTaskConfig(gd_lr=0.0)


def test_image_task_episodes_are_one_generator_stream_in_a_fixed_order(glyph_set):
    # the chapter's episodes: pool, validation, test and pruning episodes drawn in that order from
    # one generator, the theory's training set the head of the pool; a sweep point on another
    # worker, calling the function afresh, gets exactly these episodes
    cfg = ap.ImageTaskConfig(glyphs=ag.GlyphConfig(n_drawers=5, max_per_script=8), n_pool=40, P=10,
                             n_val=7, n_test=9)
    ap.image_task_episodes.cache_clear()
    data = ap.image_task_episodes(cfg, 3, 11)
    g = gen(3)
    for split, n, kind in (("pool", 40, "train"), ("val", 7, "test"), ("test", 9, "test"),
                           ("prune", 11, "test")):
        ref = ap.make_episodes(glyph_set, n, kind, g)
        torch.testing.assert_close(data[split].x, ref.x)
        torch.testing.assert_close(data[split].y, ref.y)
    torch.testing.assert_close(data["train"].x, data["pool"].x[:10])
    assert ap.image_task_episodes(cfg, 3, 11) is data  # cached: drawn once per process
    ap.image_task_episodes.cache_clear()
    assert torch.equal(ap.image_task_episodes(cfg, 3, 11)["test"].x, data["test"].x)
    with pytest.raises(ParameterError, match="P=50"):
        ap.image_task_episodes(ap.ImageTaskConfig(glyphs=cfg.glyphs, n_pool=40, P=50), 3, 11)
    with pytest.raises(ParameterError):
        ap.image_task_episodes(cfg, 3, 0)
    ap.image_task_episodes.cache_clear()


def test_icl_net_is_the_theory_model_and_prunes_with_renormalisation():
    torch.manual_seed(0)
    net = ap.ICLAttentionNet(9, 6, 4, 2, 3).double()
    x = torch.randn(5, 12, 9, dtype=torch.float64)
    attns = net.attention(x)
    # low-rank query-key attention equals the bilinear form softmax(x_s^T W_h x_t)
    W = net.bilinear_forms()
    for l in range(2):
        torch.testing.assert_close(attns[l], ap.attention_from_bilinear(x, W[l]))
    # the path-expansion forward pass equals the layer-by-layer pass of the theory's model
    torch.testing.assert_close(net(x), ap.forward(x, attns, net.weights(), "mean"))
    # removing heads: the layer-by-layer pass over the remaining heads, renormalised sums
    net.head_mask[0, 1] = 0
    net.head_mask[1, 3] = 0
    w = net.weights()
    w2 = {"V0": w["V0"], "V": [w["V"][0][[0, 2, 3]], w["V"][1][[0, 1, 2]]], "a": w["a"]}
    a2 = [attns[0][:, [0, 2, 3]], attns[1][:, [0, 1, 2]]]
    torch.testing.assert_close(net(x), ap.forward(x, a2, w2, "mean"))


def test_learning_rate_schedule():
    """Linear warm-up to gd_lr, then a half cosine from gd_lr down to 0 (or constant)."""
    cfg = ap.ImageTaskConfig(gd_steps=100, gd_lr=1e-2, gd_warmup=10, gd_schedule="cosine")
    lrs = np.array([ap.learning_rate(cfg, k) for k in range(100)])
    np.testing.assert_allclose(lrs[:10], 1e-2 * np.arange(1, 11) / 10)
    np.testing.assert_allclose(lrs[10:], 1e-2 * 0.5 * (1 + np.cos(np.pi * np.arange(90) / 90)))
    assert np.all(np.diff(lrs[10:]) < 0) and lrs[-1] < 1e-5
    const = ap.ImageTaskConfig(gd_steps=100, gd_lr=1e-2, gd_warmup=5)
    assert [ap.learning_rate(const, k) for k in (0, 4, 5, 99)] == pytest.approx([2e-3, 1e-2, 1e-2, 1e-2])
    with pytest.raises(ParameterError):
        ap.ImageTaskConfig(gd_steps=100, gd_warmup=100)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_batched_training_equals_separate_runs(schedule):
    """Stacking seeds along a leading axis is separate training: same parameters as one run per seed."""
    cfg = ap.ImageTaskConfig(width=8, qk_dim=3, gd_steps=15, gd_batch=5, n_pool=40, gd_schedule=schedule,
                             gd_warmup=3)
    g = gen(0)
    x = torch.randn(40, 12, 9, generator=g, dtype=torch.float64)
    y = torch.where(torch.rand(40, generator=g) < 0.5, 1.0, -1.0).double()
    seeds = [3, 4]
    nets, losses = ap.train_icl_nets(cfg, x, y, [gen(100 + s) for s in seeds], seeds, dtype=torch.float64)
    assert losses.shape == (15, 2)
    for s, net in zip(seeds, nets, strict=True):
        torch.manual_seed(s)
        ref = ap.ICLAttentionNet(9, 8, 4, 2, 3).double()
        opt = torch.optim.AdamW(ref.parameters(), lr=cfg.gd_lr, weight_decay=0.0)
        batches = gen(100 + s)
        for k in range(cfg.gd_steps):
            if k < 3:
                opt.param_groups[0]["lr"] = cfg.gd_lr * (k + 1) / 3
            elif schedule == "cosine":
                frac = (k - 3) / (cfg.gd_steps - 3)
                opt.param_groups[0]["lr"] = cfg.gd_lr * 0.5 * (1 + math.cos(math.pi * frac))
            else:
                opt.param_groups[0]["lr"] = cfg.gd_lr
            idx = torch.randint(40, (5,), generator=batches)
            loss = ((ref(x[idx]) - y[idx]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        # float64 training; the returned nets hold float32 parameters
        for (name, p), (_, q) in zip(net.named_parameters(), ref.named_parameters(), strict=True):
            torch.testing.assert_close(p.detach().double(), q.detach(), rtol=1e-6, atol=1e-6, msg=name)
    # the two seeds really are different networks
    assert float((nets[0].V0 - nets[1].V0).detach().abs().max()) > 0.1
    with pytest.raises(ParameterError):
        ap.train_icl_nets(cfg, x, y, [gen(0)], seeds)
    with pytest.raises(ParameterError):
        ap.ImageTaskConfig(gd_schedule="linear")


@pytest.mark.slow
def test_icl_net_learns_the_glyph_task(glyph_set):
    cfg = ap.ImageTaskConfig(
        glyphs=glyph_set.config, width=16, qk_dim=16, gd_steps=600, gd_batch=32, n_pool=2000, P=50, n_val=50,
        n_test=400,
    )  # a toy set (5 drawers, 8 classes per script) and 600 steps: the small forms of the first version
    pool = ap.make_episodes(glyph_set, cfg.n_pool, "train", gen(3))
    test = ap.make_episodes(glyph_set, cfg.n_test, "test", gen(4))
    net, losses = ap.train_icl_net(cfg, pool.x, pool.y, gen(5), seed=0)
    assert np.mean(losses[-30:]) < np.mean(losses[:30])
    with torch.no_grad():
        acc = ap.accuracy(net(test.x.float()).double(), test.y)
    # above chance on unseen scripts by more than 4 binomial standard deviations (2.5 points)
    assert acc > 50 + 4 * 100 * 0.5 / math.sqrt(cfg.n_test)
