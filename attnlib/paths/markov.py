"""The hidden-Markov-chain classification task with hand-designed heads (Chapter 4)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validation import check_float, check_int
from .model import DTYPE, attention_from_bilinear, path_features

# code index 2*h1 + h2 of the 4-path network:
# layer 1 = {same-token, random}, layer 2 = {uniform, random}
PATH_NAMES_4 = ["g", "a1", "d", "a2"]


@dataclass(frozen=True)
class MarkovTaskConfig:
    """Hidden-Markov-chain sequence classification (Chapter 4)."""

    D: int = 200  # feature dimension of a token (v_+ and v_- span two of them)
    n_vis: int = 30  # visible tokens (a BOS token is prepended: n_tok = n_vis + 1)
    P: int = 100  # training sequences
    n_test: int = 1000  # test sequences
    p_stay: float = 0.7  # probability to stay in the hidden state for class +1 (1 - p_stay for -1)
    sigma_perp: float = 1.0  # noise strength orthogonal to the (v_+, v_-) plane
    sigma_par: float = 1.0  # noise strength along v_+ - v_- and along v_+ + v_-
    beta: float = 10.0  # inverse softmax temperature of all heads
    random_head_strength: float = 1.0  # 0 turns the random head into a uniform head

    def __post_init__(self):
        check_int("D", self.D, minimum=4)
        check_int("n_vis", self.n_vis, minimum=2)
        check_int("P", self.P, minimum=2)
        check_int("n_test", self.n_test, minimum=2)
        check_float("p_stay", self.p_stay, minimum=0.0, maximum=1.0)
        for name in ("sigma_perp", "sigma_par", "beta", "random_head_strength"):
            check_float(name, getattr(self, name), minimum=0.0)

    @property
    def n_tok(self) -> int:
        return self.n_vis + 1

    @property
    def n0(self) -> int:
        return self.D + self.n_tok


def _markov_states(n_seq: int, n_vis: int, p_stay: torch.Tensor, gen) -> torch.Tensor:
    s = torch.empty(n_seq, n_vis, dtype=DTYPE)
    s[:, 0] = torch.where(torch.rand(n_seq, generator=gen, dtype=DTYPE) < 0.5, 1.0, -1.0)
    for t in range(1, n_vis):
        stay = torch.rand(n_seq, generator=gen, dtype=DTYPE) < p_stay
        s[:, t] = torch.where(stay, s[:, t - 1], -s[:, t - 1])
    return s


def make_markov_data(cfg: MarkovTaskConfig, n_seq: int, generator: torch.Generator):
    """Draw ``n_seq`` labelled sequences (half of each class). Returns ``(x, y, states)``.

    x : (n_seq, n_tok, N0) with token 0 = BOS (zero features) and a one-hot position code.
    """
    D, n_vis = cfg.D, cfg.n_vis
    y = torch.ones(n_seq, dtype=DTYPE)
    y[n_seq // 2 :] = -1.0
    p = torch.where(y > 0, cfg.p_stay, 1.0 - cfg.p_stay)
    s = _markov_states(n_seq, n_vis, p, generator)
    vp = torch.zeros(D, dtype=DTYPE)
    vp[: D // 2] = math.sqrt(2.0)
    vm = torch.zeros(D, dtype=DTYPE)
    vm[D // 2 :] = math.sqrt(2.0)
    feat = torch.where(s[..., None] > 0, vp, vm)  # (n_seq, n_vis, D)
    z = torch.randn(n_seq, n_vis, D, generator=generator, dtype=DTYPE)
    e1 = (vp - vm) / torch.linalg.norm(vp - vm)
    e2 = (vp + vm) / torch.linalg.norm(vp + vm)
    z1 = (z @ e1)[..., None] * e1
    z2 = (z @ e2)[..., None] * e2
    noise = cfg.sigma_par * (z1 + z2) + cfg.sigma_perp * (z - z1 - z2)
    tokens = torch.zeros(n_seq, cfg.n_tok, cfg.n0, dtype=DTYPE)
    tokens[:, 1:, :D] = feat + noise
    tokens[:, :, D:] = torch.eye(cfg.n_tok, dtype=DTYPE)
    return tokens, y, s


def markov_heads(cfg: MarkovTaskConfig, kind: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """Hand-designed bilinear head ``W`` (N0, N0): key on the left, query on the right.

    ``kind``: ``"same"`` (query t attends to t-1 if it is in the same hidden state, else to BOS),
    ``"uniform"`` or ``"random"`` (Gaussian perturbation of the uniform head).

    The same-token head follows the authors' convention exactly: the positional block scores key
    ``t-1`` for queries ``t >= 2`` and the BOS key (strength 1.5) for every visible query, while the
    BOS query itself has all-zero logits and therefore attends uniformly.
    """
    D, n, n0 = cfg.D, cfg.n_tok, cfg.n0
    W = torch.zeros(n0, n0, dtype=DTYPE)
    if kind == "same":
        vp = torch.zeros(D, dtype=DTYPE)
        vp[: D // 2] = math.sqrt(2.0)
        vm = torch.zeros(D, dtype=DTYPE)
        vm[D // 2 :] = math.sqrt(2.0)
        q = (vp - vm) / (torch.linalg.norm(vp - vm) ** 2 / 2)
        W[:D, :D] = torch.outer(q, q)
        pos = torch.zeros(n, n, dtype=DTYPE)
        # key t-1 for visible query t >= 2 (query 1 has no visible predecessor)
        pos[torch.arange(1, n - 1), torch.arange(2, n)] = 1.0
        pos[0, 1:] = 1.5  # every visible query scores BOS with 1.5; BOS itself scores nothing
        W[D:, D:] = pos
    elif kind == "uniform":
        W[D:, D:] = 1.0
    elif kind == "random":
        c = cfg.random_head_strength
        r = lambda *s: torch.randn(*s, generator=generator, dtype=DTYPE)  # noqa: E731
        W[:D, :D] = c * r(D, D) / D
        W[D:, D:] = c * r(n, n)
        W[:D, D:] = c * r(D, n) / math.sqrt(D)
        W[D:, :D] = c * r(n, D) / math.sqrt(D)
    else:
        raise ValueError(f"kind must be 'same', 'uniform' or 'random', got {kind!r}")
    return W


def markov_attention(x: torch.Tensor, layers, beta: float) -> list[torch.Tensor]:
    """Attention tensors of each layer from a list of per-layer head stacks ``(H_l, N0, N0)``."""
    return [attention_from_bilinear(x, W, beta) for W in layers]


def markov_problem(cfg: MarkovTaskConfig, draw: int = 0, network: str = "four") -> dict:
    """Training and test path features of one random draw of the hidden-Markov-chain task.

    ``network = "four"``: layer 1 = {same-token, random}, layer 2 = {uniform, random}
    (paths g, a1, d, a2 in code order); ``"two"``: layer 1 = {same-token, uniform},
    layer 2 = {uniform} (paths g, d). Draw ``k`` uses training seed ``27 + 1009 k``, test seed
    ``59 + 1009 k`` and random-head seeds ``147 + k``, ``247 + k``. Returns a dict with
    ``xi_tr`` (P, paths, N0), ``y_tr``, ``xi_te``, ``y_te`` and ``heads``.
    """
    x_tr, y_tr, _ = make_markov_data(cfg, cfg.P, torch.Generator().manual_seed(27 + 1009 * draw))
    x_te, y_te, _ = make_markov_data(cfg, cfg.n_test, torch.Generator().manual_seed(59 + 1009 * draw))
    if network == "four":
        layers = [
            torch.stack(
                [
                    markov_heads(cfg, "same"),
                    markov_heads(cfg, "random", torch.Generator().manual_seed(147 + draw)),
                ]
            ),
            torch.stack(
                [
                    markov_heads(cfg, "uniform"),
                    markov_heads(cfg, "random", torch.Generator().manual_seed(247 + draw)),
                ]
            ),
        ]
        heads = [2, 2]
    elif network == "two":
        layers = [
            torch.stack([markov_heads(cfg, "same"), markov_heads(cfg, "uniform")]),
            markov_heads(cfg, "uniform")[None],
        ]
        heads = [2, 1]
    else:
        raise ValueError(f"network must be 'four' or 'two', got {network!r}")
    xi_tr = path_features(x_tr, markov_attention(x_tr, layers, cfg.beta))
    xi_te = path_features(x_te, markov_attention(x_te, layers, cfg.beta))
    return {"xi_tr": xi_tr, "y_tr": y_tr, "xi_te": xi_te, "y_te": y_te, "heads": heads}
