"""One-shot in-context image classification: episodes and the gradient-descent network (Chapter 4)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .model import DTYPE, attention_from_bilinear


@dataclass(frozen=True)
class DigitsConfig:
    """2-way 1-shot in-context episodes from ``sklearn.datasets.load_digits`` (Chapter 4)."""

    patch: int = 4  # 8x8 images cut into (8/patch)^2 patches of patch*patch pixels
    train_classes: tuple = (0, 1, 2, 3, 4, 5)  # meta-train digits
    test_classes: tuple = (6, 7, 8, 9)  # meta-test digits (never seen in training)
    width: int = 64  # value width N of the gradient-descent network
    heads: int = 4  # heads per layer (L = 2 layers: 16 paths)
    qk_dim: int = 16  # inner dimension G of the learned query-key forms
    gd_steps: int = 1500  # Adam steps of the gradient-descent network
    gd_batch: int = 64
    gd_lr: float = 1e-3
    P: int = 200  # training sequences for the theory
    n_val: int = 300  # validation sequences (temperature selection)
    n_test: int = 1000  # test sequences


DIGITS_PROFILES = {
    "quick": DigitsConfig(width=32, gd_steps=800, gd_batch=32, P=120),
    "full": DigitsConfig(width=256, gd_steps=6000, gd_batch=128, P=600, n_val=1000, n_test=2000),
}


def _digit_tokens(patch: int):
    from sklearn.datasets import load_digits

    d = load_digits()
    img = torch.tensor(d.images, dtype=torch.float32)  # (n, 8, 8), values 0..16
    n, k = img.shape[0], 8 // patch
    p = img.reshape(n, k, patch, k, patch).permute(0, 1, 3, 2, 4).reshape(n, k * k, patch * patch)
    p = (p - p.mean(-1, keepdim=True)) / (p.std(-1, keepdim=True) + 1.0)  # per-patch normalisation
    return p, torch.tensor(d.target)


def make_digit_episodes(cfg: DigitsConfig, n_episodes: int, split: str, generator: torch.Generator):
    """Embedded 2-way 1-shot sequences: [support A, support B, query], each image as patches.

    token = normalised patch + sinusoidal position code + frozen random label embedding
    (labels: support A = +, support B = -, query = unknown). Returns ``(x, y)`` with
    x (n, 3 * patches, patch^2) and y = +1 if the query is of support A's class, else -1.
    ``split`` = "train" (meta-train classes) or "test" (meta-test classes).
    """
    patches, target = _digit_tokens(cfg.patch)
    classes = cfg.train_classes if split == "train" else cfg.test_classes
    n_p, dim = patches.shape[1], patches.shape[2]
    g_fixed = torch.Generator().manual_seed(1234)  # the embedding is part of the architecture
    label_emb = torch.randn(3, dim, generator=g_fixed)
    pos = torch.arange(3 * n_p, dtype=torch.float32)[:, None]
    freq = torch.exp(-math.log(100.0) * torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    pe = torch.zeros(3 * n_p, dim)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)
    pe = pe / pe.norm(dim=-1, keepdim=True)
    by_class = {c: torch.nonzero(target == c)[:, 0] for c in classes}
    cl = torch.tensor(classes)
    x = torch.empty(n_episodes, 3 * n_p, dim)
    y = torch.empty(n_episodes, dtype=DTYPE)
    for e in range(n_episodes):
        ca, cb = cl[torch.randperm(len(cl), generator=generator)[:2]].tolist()
        ia = by_class[ca][torch.randint(len(by_class[ca]), (2,), generator=generator)]
        ib = by_class[cb][torch.randint(len(by_class[cb]), (1,), generator=generator)]
        pos_q = bool(torch.rand(1, generator=generator) < 0.5)
        if pos_q:
            a_img, q_img, b_img = ia[0], ia[1], ib[0]
        else:  # query from class B: draw a second B image
            ib2 = by_class[cb][torch.randint(len(by_class[cb]), (2,), generator=generator)]
            a_img, b_img, q_img = ia[0], ib2[0], ib2[1]
        x[e, :n_p] = patches[a_img] + label_emb[0]
        x[e, n_p : 2 * n_p] = patches[b_img] + label_emb[1]
        x[e, 2 * n_p :] = patches[q_img] + label_emb[2]
        y[e] = 1.0 if pos_q else -1.0
    return (x + pe).to(DTYPE), y


class ICLAttentionNet(torch.nn.Module):
    """Gradient-descent version of the path network with learned query-key forms.

    Same architecture as the theory: input projection, ``L`` layers of summed heads whose
    attention is computed from the embedded input ``x`` in every layer, mean pooling, linear
    readout. ``head_mask`` (L, H) of 0/1 removes heads; the head sum is renormalised by
    ``1/sqrt(#active heads)``.
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
        Ws = self.bilinear_forms().to(x.dtype)
        return [attention_from_bilinear(x, Ws[l]) for l in range(self.L)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attns = self.attention(x)
        h = torch.einsum("ij,btj->bti", self.V0.to(x.dtype), x) / math.sqrt(self.n0)
        for l in range(self.L):
            m = self.head_mask[l].to(x.dtype)
            n_act = float(m.sum())
            mixed = torch.einsum("bhst,bsi->bhti", attns[l], h)
            h = torch.einsum("h,hoi,bhti->bto", m, self.V[l].to(x.dtype), mixed) / math.sqrt(
                max(n_act, 1.0) * self.width
            )
        return h.mean(1) @ self.a.to(x.dtype) / math.sqrt(self.width)


def train_icl_net(
    cfg: DigitsConfig,
    x_pool: torch.Tensor,
    y_pool: torch.Tensor,
    generator: torch.Generator,
    seed: int = 0,
) -> tuple[ICLAttentionNet, list[float]]:
    """Train :class:`ICLAttentionNet` by Adam on the squared loss to labels +-1 (float32)."""
    torch.manual_seed(seed)
    net = ICLAttentionNet(x_pool.shape[-1], cfg.width, cfg.heads, 2, cfg.qk_dim)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.gd_lr)
    xp, yp = x_pool.float(), y_pool.float()
    losses = []
    for _ in range(cfg.gd_steps):
        idx = torch.randint(xp.shape[0], (cfg.gd_batch,), generator=generator)
        loss = ((net(xp[idx]) - yp[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return net, losses
