"""One-shot in-context image classification: episodes and the gradient-descent network (Chapter 4).

The paper's second experiment (Tiberi et al. 2024) trains a network of the theory's shape by
gradient descent on 2-way 1-shot episodes of Omniglot characters, freezes its learned attention and
applies the theory to it. Here the characters come from :mod:`attnlib.glyphs`, a generated
Omniglot-like set (classes split by script into meta-train and meta-test).

An episode is the sequence [support A, support B, query] of three images, each cut into
``(size / patch)^2`` patches; a token is

.. math:: x_t = \\mathrm{norm}(\\text{patch}_t) + e_{\\text{label}(t)} + p_t ,

the patch normalised to zero mean and unit variance, plus a frozen random embedding of the image's
label (A, B, or unknown for the query) and a sinusoidal position code. The target is ``y = +1``
when the query shows support A's class and ``-1`` when it shows B's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from .._validation import ParameterError, check_float, check_int
from ..glyphs import GlyphConfig, GlyphSet, make_glyphs
from .model import DTYPE, path_features

__all__ = [
    "ImageTaskConfig",
    "Episodes",
    "patch_tokens",
    "make_episodes",
    "image_task_episodes",
    "ICLAttentionNet",
    "train_icl_net",
    "train_icl_nets",
    "learning_rate",
]


@dataclass(frozen=True)
class ImageTaskConfig:
    """Sizes of the one-shot glyph experiment (Chapter 4).

    ``patch``: side of a square patch (it must divide the image side); ``width``: value width
    ``N`` of the gradient-descent network; ``heads``: heads per layer (``L = 2`` layers, so
    ``heads^2`` paths); ``qk_dim``: inner dimension ``G`` of the learned query-key forms;
    ``gd_*``: Adam steps, batch, learning rate, weight decay, learning-rate schedule
    (``"constant"``, or ``"cosine"``: ``lr_k = lr (1 + cos(pi k / steps)) / 2``) and linear
    warm-up steps before it (:func:`learning_rate`); ``n_pool``:
    training episodes drawn for gradient descent; ``P``, ``n_val``, ``n_test``: training, validation and test
    sequences of the theory (validation and test episodes use meta-test classes).
    """

    glyphs: GlyphConfig = field(default_factory=GlyphConfig)
    patch: int = 7
    width: int = 512
    heads: int = 4
    qk_dim: int = 32
    gd_steps: int = 6000
    gd_batch: int = 128
    gd_lr: float = 3e-3
    gd_weight_decay: float = 0.0
    gd_schedule: str = "constant"
    gd_warmup: int = 0
    n_pool: int = 20000
    P: int = 600
    n_val: int = 1000
    n_test: int = 1000

    def __post_init__(self):
        if not isinstance(self.glyphs, GlyphConfig):
            raise ParameterError(f"glyphs={self.glyphs!r} must be a GlyphConfig")
        check_int("patch", self.patch, minimum=1)
        if self.glyphs.size % self.patch:
            raise ParameterError(f"patch={self.patch} must divide the image size {self.glyphs.size}")
        for name in ("width", "heads", "qk_dim", "gd_steps", "gd_batch", "n_pool", "P", "n_val", "n_test"):
            check_int(name, getattr(self, name), minimum=1)
        check_float("gd_lr", self.gd_lr, minimum=0.0, strict=True)
        check_float("gd_weight_decay", self.gd_weight_decay, minimum=0.0)
        check_int("gd_warmup", self.gd_warmup, minimum=0, maximum=self.gd_steps - 1)
        if self.gd_schedule not in ("constant", "cosine"):
            raise ParameterError(f"gd_schedule={self.gd_schedule!r} must be 'constant' or 'cosine'")


@dataclass(frozen=True)
class Episodes:
    """A batch of embedded episodes.

    ``x``: (n, 3 * patches, patch^2) float64 tokens; ``y``: (n,) float64 in {+1, -1};
    ``classes``, ``drawers``: (n, 3) int, class and drawer of [support A, support B, query].
    """

    x: torch.Tensor
    y: torch.Tensor
    classes: torch.Tensor
    drawers: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def __getitem__(self, idx) -> Episodes:
        return Episodes(self.x[idx], self.y[idx], self.classes[idx], self.drawers[idx])


def patch_tokens(images: torch.Tensor, patch: int, eps: float = 0.05) -> torch.Tensor:
    """Normalised patches ``(..., (S/patch)^2, patch^2)`` of images ``(..., S, S)``.

    Patches are read row by row; each is shifted to zero mean and divided by
    ``sqrt(var + eps)`` (``eps`` keeps blank patches from amplifying the pixel noise).
    """
    S = images.shape[-1]
    k = S // patch
    lead = images.shape[:-2]
    p = images.reshape(*lead, k, patch, k, patch).transpose(-3, -2).reshape(*lead, k * k, patch * patch)
    return (p - p.mean(-1, keepdim=True)) / torch.sqrt(p.var(-1, keepdim=True) + eps)


def _embeddings(n_tok: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Frozen label embeddings (3, dim) (A, B, unknown) and sinusoidal position codes (n_tok, dim)."""
    g_fixed = torch.Generator().manual_seed(1234)  # part of the architecture, not of the seed
    label_emb = torch.randn(3, dim, generator=g_fixed)
    pos = torch.arange(n_tok, dtype=torch.float32)[:, None]
    freq = torch.exp(-math.log(100.0) * torch.arange(0, dim + 1, 2, dtype=torch.float32) / dim)
    pe = torch.zeros(n_tok, 2 * freq.shape[0])
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)
    return label_emb, pe[:, :dim]


def make_episodes(
    glyphs: GlyphSet, n: int, split: str, generator: torch.Generator, patch: int = 7
) -> Episodes:
    """``n`` 2-way 1-shot episodes [support A, support B, query] from the classes of ``split``.

    Two distinct classes A and B of ``split`` ("train": meta-train scripts, "test": meta-test
    scripts) are drawn uniformly; support A and support B are random drawings of them; the query
    is another drawing (a different drawer) of A with probability 1/2, else of B. Returns
    :class:`Episodes` with ``y = +1`` when the query is of class A.
    """
    n = check_int("n", n, minimum=1)
    cls = torch.from_numpy(glyphs.classes(split))
    if len(cls) < 2:
        raise ParameterError(f"split={split!r} has fewer than two classes")
    D = glyphs.images.shape[1]
    ab = torch.argsort(torch.rand(n, len(cls), generator=generator), dim=1)[:, :2]
    ca, cb = cls[ab[:, 0]], cls[ab[:, 1]]
    is_a = torch.rand(n, generator=generator) < 0.5
    two = torch.argsort(torch.rand(n, D, generator=generator), dim=1)[:, :2]  # distinct drawers
    other = torch.randint(D, (n,), generator=generator)
    # the query's class gets the two distinct drawers; the other support any drawer
    cq = torch.where(is_a, ca, cb)
    da = torch.where(is_a, two[:, 0], other)
    db = torch.where(is_a, other, two[:, 0])
    dq = two[:, 1]
    classes = torch.stack([ca, cb, cq], 1)
    drawers = torch.stack([da, db, dq], 1)
    imgs = torch.from_numpy(glyphs.images)[classes, drawers]  # (n, 3, S, S)
    tok = patch_tokens(imgs, patch)  # (n, 3, n_p, d)
    n_p, dim = tok.shape[-2], tok.shape[-1]
    label_emb, pe = _embeddings(3 * n_p, dim)
    x = (tok + label_emb[None, :, None, :]).reshape(n, 3 * n_p, dim) + pe
    y = torch.where(is_a, 1.0, -1.0).to(DTYPE)
    return Episodes(x.to(DTYPE), y, classes, drawers)


@functools.lru_cache(maxsize=1)
def image_task_episodes(cfg: ImageTaskConfig, seed: int, n_prune: int) -> dict[str, Episodes]:
    """Every episode of the image experiment of Chapter 4, drawn from the glyph set of ``cfg``.

    One CPU generator seeded with ``seed`` draws, in this order: ``"pool"``, ``cfg.n_pool``
    meta-train episodes for gradient descent; ``"val"`` and ``"test"``, ``cfg.n_val`` and
    ``cfg.n_test`` meta-test episodes (choosing the temperature, measuring accuracy); ``"prune"``,
    ``n_prune`` meta-test episodes on which heads are pruned. ``"train"``, the theory's training
    set, is the first ``cfg.P`` episodes of the pool. A function of its arguments alone, cached
    (one set per process): each point of a sweep, on whichever worker, sees the same episodes.
    """
    if not isinstance(cfg, ImageTaskConfig):
        raise ParameterError(f"cfg={cfg!r} must be an ImageTaskConfig")
    check_int("n_prune", n_prune, minimum=1)
    if cfg.P > cfg.n_pool:
        raise ParameterError(f"P={cfg.P} training episodes cannot come from a pool of {cfg.n_pool}")
    glyphs = make_glyphs(cfg.glyphs)
    g = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))
    out = {split: make_episodes(glyphs, n, kind, g, cfg.patch)
           for split, n, kind in (("pool", cfg.n_pool, "train"), ("val", cfg.n_val, "test"),
                                  ("test", cfg.n_test, "test"), ("prune", n_prune, "test"))}
    out["train"] = out["pool"][: cfg.P]
    return out


class ICLAttentionNet(torch.nn.Module):
    """Gradient-descent version of the path network with learned query-key forms.

    The theory's architecture (Chapter 4, the model): input projection ``V0`` (width ``N``),
    ``L`` layers of ``H`` summed heads whose attention is computed from the embedded input ``x``
    in every layer,

    .. math:: \\Omega^{(\\ell)}_{h,st} = \\operatorname{softmax}_s\\big(
              (W_K x_s)\\cdot(W_Q x_t)/\\sqrt G\\big),

    value matrices ``V[l]`` (H, N, N), mean pooling over tokens and a linear readout ``a``. The
    network is linear in ``V0, V, a`` for fixed attention, so the forward pass is computed through
    the path expansion ``f = sum_pi w_pi^T V0 xi_pi / sqrt(N1 N0 n_paths)`` (identical to the
    layer-by-layer pass, and far cheaper at large ``N``). ``head_mask`` (L, H) of 0/1 removes
    heads; the head sum of each layer is renormalised by ``1/sqrt(#active heads)``.
    """

    def __init__(self, n0: int, width: int, heads: int, layers: int = 2, qk_dim: int = 16):
        super().__init__()
        self.n0, self.width, self.H, self.L, self.G = n0, width, heads, layers, qk_dim
        self.V0 = torch.nn.Parameter(torch.randn(width, n0))
        self.V = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(heads, width, width)) for _ in range(layers)]
        )
        self.a = torch.nn.Parameter(torch.randn(width))
        self.WQ = torch.nn.Parameter(torch.randn(layers, heads, qk_dim, n0) / math.sqrt(n0))
        self.WK = torch.nn.Parameter(torch.randn(layers, heads, qk_dim, n0) / math.sqrt(n0))
        self.register_buffer("head_mask", torch.ones(layers, heads))

    def bilinear_forms(self) -> torch.Tensor:
        """``W_h = W_K^T W_Q / sqrt(G)`` per layer and head: (L, H, N0, N0)."""
        return torch.einsum("lhgi,lhgj->lhij", self.WK, self.WQ) / math.sqrt(self.G)

    def attention(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Attention of every layer, (batch, H, key s, query t), from the low-rank forms."""
        q = torch.einsum("lhgi,bti->lbhtg", self.WQ.to(x.dtype), x)
        k = torch.einsum("lhgi,bsi->lbhsg", self.WK.to(x.dtype), x)
        logits = torch.einsum("lbhsg,lbhtg->lbhst", k, q) / math.sqrt(self.G)
        return list(torch.softmax(logits, dim=-2).unbind(0))

    def weights(self) -> dict:
        """The trained value weights in the theory's layout (for :func:`path_overlap`)."""
        return {"V0": self.V0, "V": list(self.V), "a": self.a}

    def path_weights(self) -> torch.Tensor:
        """Read-out direction of every path in input space, ``r_pi = w_pi^T V0``: (paths, N0),
        including the masked heads' renormalisation ``prod_l sqrt(H / #active_l)``."""
        w = self.a[None, :] / math.sqrt(self.width)
        for l in reversed(range(self.L)):
            V = self.V[l] * self.head_mask[l][:, None, None]
            w = torch.einsum("hoi,po->hpi", V, w).reshape(-1, self.width) / math.sqrt(self.width)
        n_act = self.head_mask.sum(1).clamp_min(1.0)
        norm = math.sqrt(self.n0 * self.H**self.L) * float(torch.sqrt(n_act / self.H).prod())
        return (w @ self.V0) / norm

    def outputs_from_paths(self, xi: torch.Tensor) -> torch.Tensor:
        """Outputs ``f = sum_pi r_pi . xi_pi`` from precomputed path features (batch, paths, N0).

        Removing heads changes only ``r``, so every pruned network can be evaluated on the same
        frozen features. Returns (batch,)."""
        return torch.einsum("pi,bpi->b", self.path_weights().to(xi.dtype), xi)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outputs_from_paths(path_features(x, self.attention(x), "mean"))


def _stacked_outputs(params: dict, x: torch.Tensor, width: int, heads: int, layers: int, qk_dim: int):
    """Outputs (S, B) of S unmasked :class:`ICLAttentionNet` s whose parameters are stacked along a
    leading seed axis, on inputs ``x`` (S, B, n, N0): the same path expansion as
    :meth:`ICLAttentionNet.forward`, one slice per network."""
    S, B, n, n0 = x.shape
    w = params["a"][:, None, :] / math.sqrt(width)  # (S, paths so far, N)
    for l in reversed(range(layers)):
        w = torch.einsum("shoi,spo->shpi", params["V"][l], w).reshape(S, -1, width) / math.sqrt(width)
    r = (w @ params["V0"]) / math.sqrt(n0 * heads**layers)  # (S, paths, N0)
    q = torch.einsum("slhgi,sbti->slbhtg", params["WQ"] / math.sqrt(qk_dim), x)
    k = torch.einsum("slhgi,sbui->slbhug", params["WK"], x)
    logits = torch.einsum("slbhug,slbhtg->slbhut", k, q)
    attn = torch.softmax(logits, dim=-2)  # (S, L, B, H, key u, query t)
    attns = [attn[:, l].reshape(S * B, heads, n, n) for l in range(layers)]
    xi = path_features(x.reshape(S * B, n, n0), attns, "mean")
    return torch.einsum("spi,sbpi->sb", r, xi.reshape(S, B, -1, n0))


def learning_rate(cfg: ImageTaskConfig, step: int) -> float:
    """Learning rate of Adam step ``step``: linear warm-up over the first ``cfg.gd_warmup`` steps,
    then ``cfg.gd_lr`` (constant) or a half cosine from ``cfg.gd_lr`` to 0 over the remaining steps."""
    if step < cfg.gd_warmup:
        return cfg.gd_lr * (step + 1) / cfg.gd_warmup
    if cfg.gd_schedule == "constant":
        return cfg.gd_lr
    k, n = step - cfg.gd_warmup, cfg.gd_steps - cfg.gd_warmup
    return cfg.gd_lr * 0.5 * (1 + math.cos(math.pi * k / n))


def train_icl_nets(
    cfg: ImageTaskConfig,
    x_pool: torch.Tensor,
    y_pool: torch.Tensor,
    generators: list[torch.Generator],
    seeds: list[int],
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[list[ICLAttentionNet], torch.Tensor]:
    """Train one :class:`ICLAttentionNet` per seed by Adam(W) on the squared loss to labels +-1,
    all seeds at once.

    Network ``i`` starts from the weights ``torch.manual_seed(seeds[i])`` gives and draws its
    mini-batches of ``cfg.gd_batch`` episodes from ``x_pool`` with ``generators[i]``. The
    parameters of all networks are stacked along a leading seed axis and the loss is the sum of
    the networks' mean losses, so each slice receives exactly its own network's gradient and
    Adam, acting entry by entry, updates it exactly as a separate run would: this is separate
    training, done in one pass to share the per-step overhead. Training runs on ``device`` in
    ``dtype``; the networks are returned on the CPU (float32), in eval mode, with the losses
    (steps, seeds).
    """
    if len(generators) != len(seeds) or not seeds:
        raise ParameterError(f"need one batch generator per seed: {len(generators)} for {len(seeds)} seeds")
    n0 = x_pool.shape[-1]
    nets = []
    for s in seeds:
        torch.manual_seed(s)
        nets.append(ICLAttentionNet(n0, cfg.width, cfg.heads, 2, cfg.qk_dim))
    stack = lambda get: torch.nn.Parameter(torch.stack([get(m).detach() for m in nets]).to(device, dtype))  # noqa: E731
    params = {
        "V0": stack(lambda m: m.V0),
        "V": [stack(lambda m, l=l: m.V[l]) for l in range(2)],
        "a": stack(lambda m: m.a),
        "WQ": stack(lambda m: m.WQ),
        "WK": stack(lambda m: m.WK),
    }
    flat = [params["V0"], *params["V"], params["a"], params["WQ"], params["WK"]]
    opt = torch.optim.AdamW(flat, lr=cfg.gd_lr, weight_decay=cfg.gd_weight_decay)
    xp, yp = x_pool.to(device, dtype), y_pool.to(device, dtype)
    losses = []
    for step in range(cfg.gd_steps):
        opt.param_groups[0]["lr"] = learning_rate(cfg, step)
        idx = torch.stack([torch.randint(xp.shape[0], (cfg.gd_batch,), generator=g) for g in generators])
        idx = idx.to(device)
        out = _stacked_outputs(params, xp[idx], cfg.width, cfg.heads, 2, cfg.qk_dim)
        per_net = ((out - yp[idx]) ** 2).mean(1)
        opt.zero_grad()
        per_net.sum().backward()
        opt.step()
        losses.append(per_net.detach())
    with torch.no_grad():
        for i, m in enumerate(nets):
            m.V0.copy_(params["V0"][i])
            for l in range(2):
                m.V[l].copy_(params["V"][l][i])
            m.a.copy_(params["a"][i])
            m.WQ.copy_(params["WQ"][i])
            m.WK.copy_(params["WK"][i])
    return [m.eval() for m in nets], torch.stack(losses).cpu()


def train_icl_net(
    cfg: ImageTaskConfig,
    x_pool: torch.Tensor,
    y_pool: torch.Tensor,
    generator: torch.Generator,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> tuple[ICLAttentionNet, list[float]]:
    """Train one :class:`ICLAttentionNet` by Adam on the squared loss to labels +-1 (float32), with
    the learning-rate schedule of ``cfg`` (:func:`learning_rate`).

    Mini-batches of ``cfg.gd_batch`` episodes are drawn from ``x_pool`` with the CPU
    ``generator``; ``seed`` sets the initial weights. Training runs on ``device``; the network is
    returned on the CPU, in eval mode, with the loss of every step.
    """
    torch.manual_seed(seed)
    net = ICLAttentionNet(x_pool.shape[-1], cfg.width, cfg.heads, 2, cfg.qk_dim).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.gd_lr, weight_decay=cfg.gd_weight_decay)
    xp, yp = x_pool.float().to(device), y_pool.float().to(device)
    losses = []
    for step in range(cfg.gd_steps):
        opt.param_groups[0]["lr"] = learning_rate(cfg, step)
        idx = torch.randint(xp.shape[0], (cfg.gd_batch,), generator=generator).to(device)
        loss = ((net(xp[idx]) - yp[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return net.cpu().eval(), [float(v) for v in losses]
