"""The histogram (counting) task of Chapter 3: one attention layer, positional-only vs semantic-only."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validation import check_choice, check_float, check_int


@dataclass(frozen=True)
class HistogramConfig:
    """Counting task: label of token i = number of occurrences of x_i in its sequence."""

    length: int = 10           # sequence length L
    vocab: int = 15            # alphabet size
    n_sequences: int = 20_000  # distinct sequences drawn (70 % train, 30 % validation)
    dim: int = 64              # model width (half semantic, half positional embedding)
    hidden: int = 128          # MLP width
    epochs: int = 30           # Adam epochs of the constrained (frozen-mechanism) model
    batch: int = 32            # minibatch size
    lr: float = 1e-3           # peak Adam step size (one-cycle schedule)
    retrain_epochs: int = 5    # SGD epochs of the unconstrained model started at each solution
    retrain_lr: float = 1e-3   # SGD step size of that check

    def __post_init__(self):
        for name in ("length", "vocab", "n_sequences", "dim", "hidden", "epochs", "batch",
                     "retrain_epochs"):
            check_int(name, getattr(self, name), minimum=1 if name != "retrain_epochs" else 0)
        if self.dim % 2:
            raise ValueError("dim must be even (half semantic, half positional)")
        check_float("lr", self.lr, minimum=0.0, strict=True)
        check_float("retrain_lr", self.retrain_lr, minimum=0.0, strict=True)


def histogram_data(config: HistogramConfig, gen: torch.Generator):
    """Distinct uniform sequences ``(N, L)`` and their count labels ``(N, L)`` (values 1..L)."""
    x = torch.randint(0, config.vocab, (config.n_sequences, config.length), generator=gen)
    x = torch.unique(x, dim=0)
    x = x[torch.randperm(x.shape[0], generator=gen)]
    y = (x[:, :, None] == x[:, None, :]).sum(-1)
    return x, y


class HistogramTransformer(torch.nn.Module):
    """Embedding [token | position] -> one softmax attention layer (no residual) -> LayerNorm -> MLP.

    ``mechanism`` masks what the query and key maps read: ``"positional"`` (positional half only),
    ``"semantic"`` (token half only) or ``"both"`` (unconstrained). The value map reads everything.
    """

    def __init__(self, config: HistogramConfig, mechanism: str = "both"):
        super().__init__()
        check_choice("mechanism", mechanism, ("positional", "semantic", "both"))
        D, h = config.dim, config.dim // 2
        self.tok = torch.nn.Embedding(config.vocab, h)
        self.pos = torch.nn.Parameter(torch.randn(config.length, h))
        self.q = torch.nn.Linear(D, D, bias=False)
        self.k = torch.nn.Linear(D, D, bias=False)
        self.v = torch.nn.Linear(D, D, bias=False)
        self.norm = torch.nn.LayerNorm(D)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D, config.hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(config.hidden, config.length + 1))
        mask = torch.ones(D)
        if mechanism == "positional":
            mask[:h] = 0.0
        elif mechanism == "semantic":
            mask[h:] = 0.0
        self.register_buffer("mask", mask)

    def attention(self, x):
        """Attention weights ``(N, L, L)`` of token ids ``x`` of shape ``(N, L)``."""
        e = torch.cat([self.tok(x), self.pos.expand(x.shape[0], -1, -1)], -1)
        em = e * self.mask
        s = self.q(em) @ self.k(em).transpose(-1, -2) / math.sqrt(e.shape[-1])
        return torch.softmax(s, -1), e

    def forward(self, x):
        a, e = self.attention(x)
        return self.mlp(self.norm(a @ self.v(e)))


def _accuracy(model, x, y, batch=4096):
    with torch.no_grad():
        correct = 0
        for i in range(0, x.shape[0], batch):
            correct += (model(x[i:i + batch]).argmax(-1) == y[i:i + batch]).sum().item()
    return correct / y.numel()


def _param_vector(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _param_distance(a, b, keys=None):
    """Sum over tensors of the L2 norm of the difference (optionally only on ``keys`` entries)."""
    return float(sum((a[k] - b[k]).norm() for k in a if keys is None or k in keys))


def _train_epochs(model, opt, xtr, ytr, config: HistogramConfig, epochs: int, gen, sched=None,
                  on_epoch=None):
    """Mini-batch cross-entropy training over ``epochs`` shuffled passes (scheduler stepped per batch).

    ``on_epoch(epoch, mean_train_loss)`` is called after every pass (for training curves).
    """
    lossf = torch.nn.CrossEntropyLoss()
    n_tr = xtr.shape[0]
    for epoch in range(epochs):
        perm = torch.randperm(n_tr, generator=gen)
        total, count = 0.0, 0
        for i in range(0, n_tr, config.batch):
            b = perm[i:i + config.batch]
            opt.zero_grad()
            loss = lossf(model(xtr[b]).reshape(-1, config.length + 1), ytr[b].reshape(-1))
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            total += loss.detach().item() * len(b)
            count += len(b)
        if on_epoch is not None:
            on_epoch(epoch + 1, total / count)


def train_histogram(config: HistogramConfig, mechanism: str, seed: int = 0) -> dict:
    """Train the constrained model with Adam, then the unconstrained model started at its solution.

    Returns validation accuracies (constrained, and after the unconstrained re-training), the
    parameter distances init -> solution and solution -> re-trained, the attention maps of the
    first three validation sequences, the trained model and its training curve (``history``: per epoch
    the mean training loss and the validation accuracy).
    """
    gen = torch.Generator().manual_seed(int(seed))
    torch.manual_seed(int(seed))
    x, y = histogram_data(config, gen)
    n_tr = int(0.7 * x.shape[0])
    xtr, ytr, xva, yva = x[:n_tr], y[:n_tr], x[n_tr:], y[n_tr:]
    model = HistogramTransformer(config, mechanism)
    p0 = _param_vector(model)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, betas=(0.9, 0.98), eps=1e-9)
    steps = config.epochs * math.ceil(n_tr / config.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=steps)
    history = []

    def record(epoch, train_loss):
        history.append({"epoch": epoch, "train_loss": train_loss, "val_acc": _accuracy(model, xva, yva)})

    _train_epochs(model, opt, xtr, ytr, config, config.epochs, gen, sched, on_epoch=record)
    acc = _accuracy(model, xva, yva)
    p1 = _param_vector(model)
    with torch.no_grad():
        maps = model.attention(xva[:3])[0].numpy()
    # stability: unconstrained model (both halves readable), tiny noise, plain SGD
    free = HistogramTransformer(config, "both")
    state = dict(model.state_dict())
    # W_Q diag(mask) and W_K diag(mask): the same function, now with every entry trainable
    state["q.weight"] = state["q.weight"] * model.mask
    state["k.weight"] = state["k.weight"] * model.mask
    state["mask"] = torch.ones(config.dim)
    free.load_state_dict(state)
    with torch.no_grad():
        for p in free.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=gen))
    p1n = _param_vector(free)
    opt = torch.optim.SGD(free.parameters(), lr=config.retrain_lr)
    _train_epochs(free, opt, xtr, ytr, config, config.retrain_epochs, gen)
    p2 = _param_vector(free)
    return {
        "mechanism": mechanism, "val_acc": acc, "val_acc_retrained": _accuracy(free, xva, yva),
        "dist_init_to_solution": _param_distance(p0, p1),
        "dist_solution_to_retrained": _param_distance(p1n, p2),
        "maps": maps, "examples": xva[:3].numpy(), "model": model, "history": history,
    }


