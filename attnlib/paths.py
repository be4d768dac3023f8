"""Attention paths: a finite-width statistical-mechanics theory of multi-head attention networks.

Chapter 4 (``04-attention-paths``) derives everything in this module. The model is a stack of
``L`` attention layers whose heads are *summed*; every attention matrix is a fixed function of the
bare input, so the network is a deep *linear* network in its trained weights. Unrolling it gives
one term per *attention path* (one head per layer). Bayesian learning of the value weights at
finite width ``N`` with ``P = alpha N`` examples is then exactly a Gaussian process with a
*renormalised* kernel

.. math:: K(x, x') = \\sum_{\\pi\\pi'} U_{\\pi\\pi'} C_{\\pi\\pi'}(x, x'),

where ``C`` are fixed path-path kernels and the order parameter ``U`` minimises an action.

Conventions (used everywhere, tests included):

* a sequence is a tensor ``(tokens, N0)``; a batch is ``(batch, tokens, N0)``;
* attention tensors are ``(batch, heads, key s, query t)``, normalised over the key axis;
* ``heads = [H_1, ..., H_L]``; ``widths = [N_1, ..., N_L, N_a]`` (``N_l`` is the *input* width
  of attention layer ``l``); ``variances = [s0^2, s1^2, ..., sL^2, sa^2]``;
* paths are flattened with the head of layer 1 as the slowest index;
* the temperature is ``T``; the number of tokens is ``n_tok``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.optimize
import torch

from ._validation import check_float, check_int

__all__ = [
    # model
    "attention_from_bilinear",
    "readout_vector",
    "init_weights",
    "forward",
    "path_features",
    "effective_path_weights",
    "path_overlap",
    "path_forward",
    # kernels and theory
    "scaled_features",
    "path_kernels",
    "renormalised_kernel",
    "kernel_diagonal",
    "gp_order_parameters",
    "ua_closed_form",
    "PathAction",
    "ActionSolution",
    "predict",
    "accuracy",
    "kernel_alignment",
    "head_scores",
    "adam_raw_solve",
    # hidden-Markov-chain task
    "MarkovTaskConfig",
    "MARKOV_PROFILES",
    "make_markov_data",
    "markov_heads",
    "markov_attention",
    "PATH_NAMES_4",
    "markov_problem",
    "compare_solvers",
    # posterior sampling
    "hmc",
    "HMCResult",
    "PathPosterior",
    # digits one-shot task
    "DigitsConfig",
    "DIGITS_PROFILES",
    "make_digit_episodes",
    "ICLAttentionNet",
    "train_icl_net",
]

DTYPE = torch.float64


# code index 2*h1 + h2 of the 4-path network:
# layer 1 = {same-token, random}, layer 2 = {uniform, random}
PATH_NAMES_4 = ["g", "a1", "d", "a2"]


# ----------------------------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------------------------
def attention_from_bilinear(x: torch.Tensor, W: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """Softmax attention of fixed bilinear heads, computed from the bare input.

    .. math:: \\Omega_{h,st}(x) = \\operatorname{softmax}_s\\big(\\beta\\, x_s^\\top W_h x_t\\big)

    Parameters
    ----------
    x : (batch, n_tok, N0)
    W : (H, N0, N0)  (key on the left, query on the right)

    Returns
    -------
    (batch, H, n_tok key s, n_tok query t), columns summing to one over ``s``.
    """
    Wx = torch.einsum("hij,btj->bhti", W, x)  # W_h x_t  (two-step contraction: cheap)
    logits = beta * torch.einsum("bsi,bhti->bhst", x, Wx)
    return torch.softmax(logits, dim=-2)


def readout_vector(attn: torch.Tensor, readout: str = "last") -> torch.Tensor:
    """Last-layer attention vector ``omega_{h,s}`` seen by the readout position.

    ``attn`` is ``(batch, H, s, t)``; ``readout`` is ``"last"`` (query = last token), ``"first"``
    or ``"mean"`` (mean pooling over queries). Returns ``(batch, H, s)``.
    """
    if readout == "last":
        return attn[..., -1]
    if readout == "first":
        return attn[..., 0]
    if readout == "mean":
        return attn.mean(dim=-1)
    raise ValueError(f"readout must be one of 'last', 'first', 'mean', got {readout!r}")


def init_weights(
    n0: int,
    heads,
    widths,
    variances=None,
    n_chains: int | None = None,
    generator=None,
    dtype=DTYPE,
    device="cpu",
) -> dict:
    """Draw the trained (Bayesian) weights from their Gaussian prior.

    Returns ``{"V0": (N1, N0), "V": [(H_l, N_{l+1}, N_l)], "a": (N_a,)}``, each with a leading
    ``(n_chains,)`` axis when ``n_chains`` is given.
    """
    L = len(heads)
    if len(widths) != L + 1:
        raise ValueError("widths must be [N_1, ..., N_L, N_a]")
    variances = [1.0] * (L + 2) if variances is None else list(variances)
    lead = () if n_chains is None else (n_chains,)

    def g(*shape, var):
        return math.sqrt(var) * torch.randn(*lead, *shape, generator=generator, dtype=dtype, device=device)

    return {
        "V0": g(widths[0], n0, var=variances[0]),
        "V": [g(heads[l], widths[l + 1], widths[l], var=variances[l + 1]) for l in range(L)],
        "a": g(widths[L], var=variances[L + 1]),
    }


def forward(x: torch.Tensor, attns, weights: dict, readout: str = "last") -> torch.Tensor:
    """Layer-by-layer forward pass (Chapter 4, model section).

    .. math::
        x^{(0)}_t = V^{(0)} x_t/\\sqrt{N_0},\\quad
        x^{(\\ell)}_t = \\frac{1}{\\sqrt{H_\\ell N_\\ell}}\\sum_h V^{(\\ell)}_h
        \\sum_s x^{(\\ell-1)}_s
        \\Omega^{(\\ell)}_{h,st},\\quad f = a\\cdot\\bar x^{(L)}/\\sqrt{N_a}

    x : (batch, n_tok, N0); attns : list of L tensors (batch, H_l, n_tok, n_tok);
    weights : from :func:`init_weights` (no chain axis). Returns (batch,).
    """
    V0, Vs, a = weights["V0"], weights["V"], weights["a"]
    n0 = x.shape[-1]
    h = torch.einsum("ij,btj->bti", V0, x) / math.sqrt(n0)  # (batch, n_tok, N1)
    L = len(Vs)
    for l in range(L):
        H, _, n_in = Vs[l].shape
        if l < L - 1:
            mixed = torch.einsum("bhst,bsi->bhti", attns[l], h)  # (batch, H, t, N_l)
            h = torch.einsum("hoi,bhti->bto", Vs[l], mixed) / math.sqrt(H * n_in)
        else:
            om = readout_vector(attns[l], readout)  # (batch, H, s)
            mixed = torch.einsum("bhs,bsi->bhi", om, h)
            h = torch.einsum("hoi,bhi->bo", Vs[l], mixed) / math.sqrt(H * n_in)
    return h @ a / math.sqrt(a.shape[-1])


def path_features(x: torch.Tensor, attns, readout: str = "last") -> torch.Tensor:
    """Path-attended inputs ``xi_pi(x)`` (Chapter 4, path expansion).

    .. math:: \\xi_\\pi(x) = \\sum_{s_0..s_{L-1}} x_{s_0}\\Omega^{(1)}_{h_1,s_0s_1}\\cdots
              \\omega^{(L)}_{h_L,s_{L-1}}

    Returns ``(batch, n_paths, N0)`` with the head of layer 1 as the slowest path index.
    """
    v = readout_vector(attns[-1], readout)  # (batch, H_L, s)
    for A in reversed(attns[:-1]):
        # combine head h_l (outer) with the partial path (h_{l+1}..h_L) (inner)
        v = torch.einsum("bhst,bpt->bhps", A, v)
        v = v.reshape(v.shape[0], -1, v.shape[-1])
    return torch.einsum("bps,bsi->bpi", v, x)


def effective_path_weights(weights: dict) -> torch.Tensor:
    """Effective path weights ``w_pi = V1_{h1}^T ... VL_{hL}^T a / sqrt(N_a N_L ... N_2)``.

    Accepts weights with or without a leading chain axis; returns ``(..., n_paths, N1)``.
    """
    Vs, a = weights["V"], weights["a"]
    w = a.unsqueeze(-2) / math.sqrt(a.shape[-1])  # (..., 1, N_a)
    for l in reversed(range(len(Vs))):
        V = Vs[l]  # (..., H_l, N_{l+1}, N_l)
        w = torch.einsum("...hoi,...po->...hpi", V, w)  # new head index outermost
        w = w.reshape(*w.shape[:-3], -1, w.shape[-1])
        if l > 0:
            w = w / math.sqrt(V.shape[-1])
    return w


def path_overlap(weights: dict) -> torch.Tensor:
    """Overlap of effective path weights ``U_{pi pi'} = w_pi . w_pi' / N_1`` (..., paths, paths)."""
    w = effective_path_weights(weights)
    return w @ w.transpose(-1, -2) / w.shape[-1]


def path_forward(xi: torch.Tensor, weights: dict) -> torch.Tensor:
    """Network output from the path expansion, ``f = sum_pi w_pi^T V0 xi_pi / sqrt(N1 N0 n_paths)``.

    xi : (batch, n_paths, N0). With a leading chain axis in ``weights`` returns (chains, batch).
    """
    w = effective_path_weights(weights)  # (..., paths, N1)
    V0 = weights["V0"]  # (..., N1, N0)
    n_paths, n1 = w.shape[-2], w.shape[-1]
    n0 = V0.shape[-1]
    r = w @ V0  # (..., paths, N0): read-out direction of each path in input space
    return torch.einsum("...pi,bpi->...b", r, xi) / math.sqrt(n1 * n0 * n_paths)


# ----------------------------------------------------------------------------------------------
# kernels and the theory
# ----------------------------------------------------------------------------------------------
def scaled_features(xi: torch.Tensor, sigma0_sq: float = 1.0) -> torch.Tensor:
    """Scaled features ``xi~ = sigma0 xi / sqrt(N0 n_paths)``.

    Then ``C_{pi pi'}(x,x') = xi~_pi(x) . xi~_pi'(x')``; shape unchanged (batch, paths, N0).
    """
    return math.sqrt(sigma0_sq) * xi / math.sqrt(xi.shape[-1] * xi.shape[-2])


def path_kernels(xt_a: torch.Tensor, xt_b: torch.Tensor) -> torch.Tensor:
    """Path-path kernels ``C_{pi pi'}(x^mu, x^nu)`` from scaled features: (paths, paths, Pa, Pb)."""
    return torch.einsum("mpi,nqi->pqmn", xt_a, xt_b)


def renormalised_kernel(U: torch.Tensor, xt_a: torch.Tensor, xt_b: torch.Tensor) -> torch.Tensor:
    """``K = sum_{pi pi'} U_{pi pi'} C_{pi pi'}`` without forming C: (Pa, Pb)."""
    Ub = torch.einsum("pq,nqi->npi", U, xt_b)
    return xt_a.reshape(xt_a.shape[0], -1) @ Ub.reshape(Ub.shape[0], -1).T


def kernel_diagonal(U: torch.Tensor, xt: torch.Tensor) -> torch.Tensor:
    """``K(x, x)`` for each row of ``xt`` (P,)."""
    return torch.einsum("mpi,pq,mqi->m", xt, U, xt)


def gp_order_parameters(heads, variances=None) -> list[torch.Tensor]:
    """GP-limit order parameters ``U^(l) = sa^2 prod_{k>=l} sk^2 * 1`` for l = 1..L."""
    L = len(heads)
    variances = [1.0] * (L + 2) if variances is None else list(variances)
    out, scale = [], variances[L + 1]
    for l in reversed(range(L)):
        scale = scale * variances[l + 1]
        size = int(np.prod(heads[l:]))
        out.insert(0, scale * torch.eye(size, dtype=DTYPE))
    return out


def ua_closed_form(trUL, H_L, N_L, N_a, sL_sq, sa_sq):
    """Minimiser of the action over ``u_a``: root of ``u^2 + beta u - gamma = 0``."""
    beta = sa_sq * (H_L * N_L / N_a - 1.0)
    gamma = sa_sq * N_L * trUL / (N_a * sL_sq)
    return 0.5 * (-beta + torch.sqrt(beta * beta + 4.0 * gamma))


def _partial_trace_outer(M: torch.Tensor, H: int) -> torch.Tensor:
    m = M.shape[-1] // H
    return torch.einsum("hahb->ab", M.reshape(H, m, H, m))


@dataclass
class ActionSolution:
    """Result of :meth:`PathAction.solve`: order parameters at the minimum and diagnostics."""

    Us: list  # [U^(1), ..., U^(L)] (float64)
    u_a: float
    action: float
    residuals: list  # relative saddle-point residual per layer
    n_iter: int
    seconds: float
    history: list = field(default_factory=list)

    @property
    def U(self) -> torch.Tensor:
        return self.Us[0]

    @property
    def residual_max(self) -> float:
        return float(max(self.residuals))


class PathAction:
    """The finite-width action over the order parameters ``U^(1..L)`` (Chapter 4, the action).

    .. math::
        N S = N_a\\big(\\tfrac{u_a}{s_a^2}-\\ln u_a\\big)
        + N_L\\big(\\tfrac{\\operatorname{Tr}U^{(L)}}{s_L^2u_a}-\\ln\\det U^{(L)}+H_L\\ln u_a\\big)
        + \\sum_{\\ell<L} N_\\ell\\big(\\tfrac{1}{s_\\ell^2}\\operatorname{Tr}[(U^{(\\ell+1)})^{-1}
        \\operatorname{Tr}_{h_\\ell}U^{(\\ell)}] - \\ln\\det U^{(\\ell)}
        + H_\\ell\\ln\\det U^{(\\ell+1)}\\big)
        + \\ln\\det(K_U+T) + Y^\\top(K_U+T)^{-1}Y

    with ``u_a`` eliminated in closed form. ``xt`` are scaled path features of the training set
    (P, n_paths, N0), ``Y`` the labels (P,).
    """

    def __init__(self, xt: torch.Tensor, Y: torch.Tensor, heads, widths, T: float, variances=None):
        self.xt = xt.to(DTYPE)
        self.Y = Y.to(DTYPE).to(xt.device)
        self.heads = list(heads)
        self.widths = list(widths)
        self.L = len(heads)
        self.variances = [1.0] * (self.L + 2) if variances is None else list(variances)
        self.T = float(T)
        self.N = float(max(widths))
        self.sizes = [int(np.prod(self.heads[l:])) for l in range(self.L)]
        self.device = xt.device
        if xt.shape[1] != self.sizes[0]:
            raise ValueError(f"features have {xt.shape[1]} paths, heads imply {self.sizes[0]}")
        self._tril = [torch.tril_indices(m, m, device=self.device) for m in self.sizes]
        P, n_paths = xt.shape[0], xt.shape[1]
        # precompute the path-path kernels when they fit (K is then one mat-vec)
        self.C = None
        if n_paths * n_paths * P * P <= 2e7:
            self.C = path_kernels(self.xt, self.xt).reshape(n_paths * n_paths, P * P)

    def kernel(self, U1: torch.Tensor) -> torch.Tensor:
        """Training kernel ``K_U`` (P, P)."""
        if self.C is not None:
            P = self.xt.shape[0]
            return (U1.reshape(1, -1) @ self.C).reshape(P, P)
        return renormalised_kernel(U1, self.xt, self.xt)

    # --- order parameters ---------------------------------------------------------------------
    def u_a(self, UL: torch.Tensor) -> torch.Tensor:
        L = self.L
        return ua_closed_form(
            torch.trace(UL),
            self.heads[-1],
            self.widths[L - 1],
            self.widths[L],
            self.variances[L],
            self.variances[L + 1],
        )

    def energy(self, U1: torch.Tensor) -> torch.Tensor:
        """``ln det(K_U + T) + Y^T (K_U + T)^{-1} Y`` via Cholesky."""
        K = self.kernel(U1)
        A = K + self.T * torch.eye(K.shape[0], dtype=DTYPE, device=self.device)
        Lc = torch.linalg.cholesky(A)
        r = torch.cholesky_solve(self.Y[:, None], Lc)[:, 0]
        return 2.0 * torch.log(torch.diagonal(Lc)).sum() + self.Y @ r

    def entropy(self, Us, u_a=None) -> torch.Tensor:
        L, Hs, Ns, v = self.L, self.heads, self.widths, self.variances
        UL = Us[L - 1]
        ua = self.u_a(UL) if u_a is None else u_a
        S = Ns[L] * (ua / v[L + 1] - torch.log(ua))
        S = S + Ns[L - 1] * (torch.trace(UL) / (v[L] * ua) - torch.logdet(UL) + Hs[L - 1] * torch.log(ua))
        for l in range(L - 1):  # layer l+1 in 1-based notation
            Ul, Unext = Us[l], Us[l + 1]
            pt = _partial_trace_outer(Ul, Hs[l])
            S = S + Ns[l] * (
                torch.trace(torch.linalg.solve(Unext, pt)) / v[l + 1]
                - torch.logdet(Ul)
                + Hs[l] * torch.logdet(Unext)
            )
        return S

    def value(self, Us, u_a=None) -> torch.Tensor:
        """The action ``S`` (normalised by ``N = max width``)."""
        return (self.entropy(Us, u_a) + self.energy(Us[0])) / self.N

    # --- analytic gradient = saddle-point equations --------------------------------------------
    def gradient(self, Us) -> list[torch.Tensor]:
        """Explicit gradient of ``N S`` w.r.t. each (symmetric) ``U^(l)``, u_a at its optimum.

        Setting these to zero gives the saddle-point equations of Chapter 4, e.g. for layer 1
        ``(U^(1))^{-1} = s1^{-2} 1 (x) (U^(2))^{-1} + N_1^{-1} sum C (G - r r^T)``.
        """
        L, Hs, Ns, v = self.L, self.heads, self.widths, self.variances
        ua = self.u_a(Us[L - 1])
        inv = [torch.linalg.inv(U).contiguous() for U in Us]
        grads = []
        for l in range(L):
            if l < L - 1:
                g = Ns[l] * (
                    torch.kron(torch.eye(Hs[l], dtype=DTYPE, device=self.device), inv[l + 1]) / v[l + 1]
                    - inv[l]
                )
            else:
                g = Ns[l] * (
                    torch.eye(self.sizes[l], dtype=DTYPE, device=self.device) / (v[l + 1] * ua) - inv[l]
                )
            if l > 0:
                pt = _partial_trace_outer(Us[l - 1], Hs[l - 1])
                g = g + Ns[l - 1] * (Hs[l - 1] * inv[l] - inv[l] @ pt @ inv[l] / v[l])
            grads.append(g)
        # energy term: sum_{mu nu} C^{mu nu}_{pi pi'} (G - r r^T)_{nu mu}
        K = self.kernel(Us[0])
        G = torch.linalg.inv(K + self.T * torch.eye(K.shape[0], dtype=DTYPE, device=self.device))
        r = G @ self.Y
        B = G - torch.outer(r, r)
        grads[0] = grads[0] + torch.einsum("mpi,mn,nqi->pq", self.xt, B, self.xt)
        return grads

    def residuals(self, Us) -> list[float]:
        """Relative saddle-point residuals ``max|dS/dU^(l)| / (N_l max|(U^(l))^{-1}|)``."""
        grads = self.gradient(Us)
        out = []
        for l, (g, U) in enumerate(zip(grads, Us, strict=True)):
            out.append(float(g.abs().max() / (self.widths[l] * torch.linalg.inv(U).abs().max())))
        return out

    # --- Cholesky parametrisation and solver ---------------------------------------------------
    def _pack(self, Us) -> np.ndarray:
        parts = []
        for U, idx in zip(Us, self._tril, strict=True):
            C = torch.linalg.cholesky(U)
            C = C.clone()
            d = torch.arange(C.shape[0])
            C[d, d] = torch.log(C[d, d])
            parts.append(C[idx[0], idx[1]])
        return torch.cat(parts).detach().cpu().numpy()

    def _unpack(self, theta: torch.Tensor):
        Us, k = [], 0
        for m, idx in zip(self.sizes, self._tril, strict=True):
            n = idx.shape[1]
            C = torch.zeros(m, m, dtype=DTYPE, device=self.device)
            C = C.index_put((idx[0], idx[1]), theta[k : k + n])
            C = C - torch.diag(torch.diagonal(C)) + torch.diag(torch.exp(torch.diagonal(C)))
            Us.append(C @ C.T)
            k += n
        return Us

    def solve(
        self, init=None, gtol: float = 1e-10, maxiter: int = 2000, newton_steps: int = 4
    ) -> ActionSolution:
        """Minimise ``S`` from the GP point: L-BFGS on Cholesky factors, then Newton polishing.

        ``init``: list of starting order parameters (default: the GP values).
        """
        t0 = time.perf_counter()
        Us0 = [U.to(self.device) for U in (init or gp_order_parameters(self.heads, self.variances))]
        x0 = self._pack(Us0)
        history = []

        def fun(x):
            th = torch.tensor(x, dtype=DTYPE, device=self.device, requires_grad=True)
            try:
                S = self.value(self._unpack(th))
            except RuntimeError:  # non-PD kernel: reject the point
                return np.inf, np.zeros_like(x)
            (g,) = torch.autograd.grad(S, th)
            history.append(float(S.detach()))
            return float(S.detach()), g.detach().cpu().numpy()

        res = scipy.optimize.minimize(
            fun,
            x0,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": maxiter, "gtol": gtol, "ftol": 1e-15, "maxcor": 30},
        )
        theta = torch.tensor(res.x, dtype=DTYPE, device=self.device)
        # Newton polishing (small number of parameters): exact Hessian by autograd
        for _ in range(newton_steps):
            f = lambda th: self.value(self._unpack(th))  # noqa: E731
            g = torch.autograd.functional.jacobian(f, theta)
            Hm = torch.autograd.functional.hessian(f, theta)
            try:
                step = torch.linalg.solve(Hm, g)
            except RuntimeError:
                break
            S_old = float(f(theta))
            new = theta - step
            try:
                S_new = float(f(new))
            except RuntimeError:
                break
            if not np.isfinite(S_new) or S_new > S_old + 1e-14 * abs(S_old):
                break
            theta = new
        Us = [U.detach() for U in self._unpack(theta)]
        return ActionSolution(
            Us=Us,
            u_a=float(self.u_a(Us[-1])),
            action=float(self.value(Us)),
            residuals=self.residuals(Us),
            n_iter=int(res.nit),
            seconds=time.perf_counter() - t0,
            history=history,
        )


def adam_raw_solve(
    action: PathAction,
    lr: float = 0.1,
    tol: float = 1e-5,
    max_steps: int = 50_000,
    residual_tol: float | None = None,
):
    """Reference solver in the style of the authors' code: Adam on the raw symmetrised matrices.

    Stops when ``max |dS/dU|`` (gradient w.r.t. the raw entries) falls below ``tol`` or, if
    ``residual_tol`` is given, when the relative saddle-point residual falls below it (checked
    every 50 steps). Returns ``(Us, n_steps, seconds, converged)``.
    """
    t0 = time.perf_counter()
    params = [
        torch.nn.Parameter(U.clone().to(action.device))
        for U in gp_order_parameters(action.heads, action.variances)
    ]
    opt = torch.optim.Adam(params, lr=lr)
    converged = False
    step = 0
    for step in range(1, max_steps + 1):
        opt.zero_grad()
        Us = [(P + P.T) / 2 for P in params]
        S = action.value(Us)
        S.backward()
        gmax = max(float(P.grad.abs().max()) for P in params)
        if residual_tol is None and gmax < tol:
            converged = True
            break
        if residual_tol is not None and step % 50 == 0:
            with torch.no_grad():
                if max(action.residuals([(P + P.T) / 2 for P in params])) < residual_tol:
                    converged = True
                    break
        opt.step()
    Us = [((P + P.T) / 2).detach() for P in params]
    return Us, step, time.perf_counter() - t0, converged


def predict(U: torch.Tensor, xt_train: torch.Tensor, Y: torch.Tensor, xt_test: torch.Tensor, T: float):
    """Predictor statistics of GP regression with the renormalised kernel.

    .. math:: \\langle f_*\\rangle = k_*^\\top (K+T)^{-1} Y,\\qquad
              \\langle\\delta f_*^2\\rangle = K_{**} - k_*^\\top (K+T)^{-1} k_*

    Returns ``(mean, variance)``, each (P_test,).
    """
    U = U.to(xt_train.device, DTYPE)
    K = renormalised_kernel(U, xt_train, xt_train)
    k = renormalised_kernel(U, xt_test, xt_train)  # (P_test, P)
    Lc = torch.linalg.cholesky(K + T * torch.eye(K.shape[0], dtype=DTYPE, device=K.device))
    mean = k @ torch.cholesky_solve(Y.to(DTYPE)[:, None], Lc)[:, 0]
    v = torch.linalg.solve_triangular(Lc, k.T, upper=False)
    var = kernel_diagonal(U, xt_test) - (v * v).sum(0)
    return mean, var


def accuracy(mean: torch.Tensor, y: torch.Tensor) -> float:
    """Sign accuracy of the mean predictor, in percent."""
    return 100.0 * float((torch.sign(mean) == torch.sign(y.to(mean.dtype))).double().mean())


def kernel_alignment(K: torch.Tensor, Y: torch.Tensor, n_pcs: int = 30) -> np.ndarray:
    """Overlap ``|phi_k . Y| / |Y|`` of the top ``n_pcs`` eigenvectors of ``K`` with the labels."""
    evals, evecs = torch.linalg.eigh(K)
    order = torch.argsort(evals, descending=True)[:n_pcs]
    Yn = Y.to(K.dtype) / torch.linalg.norm(Y.to(K.dtype))
    return (evecs[:, order].T @ Yn).abs().cpu().numpy()


def head_scores(U: torch.Tensor, heads) -> np.ndarray:
    """Head scores from ``U``: sum of ``|U|`` over rows or columns of paths through the head.

    Returns an array (L, H_l max) normalised by its maximum (NaN-free for equal head counts).
    """
    L = len(heads)
    Ua = U.abs().cpu().numpy()
    grid = np.stack(np.meshgrid(*[np.arange(h) for h in heads], indexing="ij"), -1).reshape(-1, L)
    out = np.zeros((L, max(heads)))
    for l in range(L):
        for h in range(heads[l]):
            on = grid[:, l] == h
            mask = on[:, None] | on[None, :]
            out[l, h] = Ua[mask].sum()
    return out / out.max()


# ----------------------------------------------------------------------------------------------
# the hidden-Markov-chain task
# ----------------------------------------------------------------------------------------------
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


MARKOV_PROFILES = {
    "quick": MarkovTaskConfig(),
    "full": MarkovTaskConfig(),
}


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
        pos[torch.arange(n - 1), torch.arange(1, n)] = 1.0  # key t-1 for query t
        pos[0, :] += 1.5  # every query scores BOS with 1.5
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


def compare_solvers(
    action: PathAction, tol: float = 1e-5, adam_lr: float = 0.1, max_steps: int = 50_000
) -> dict:
    """Time to the same tolerance ``max |dS/dU| < tol`` (raw-entry gradient, the authors' rule).

    Our solver: L-BFGS on Cholesky factors from the GP point (no Newton polishing), tightened
    until the rule holds. Reference: Adam on the raw symmetrised matrices. Returns wall and CPU
    seconds of both; ``speedup`` is the ratio of CPU times (steadier than wall time on a shared
    machine; on a GPU use the wall-time ratio ``speedup_wall``).
    """
    w0, c0 = time.perf_counter(), time.process_time()
    gtol = 1e-6
    while True:
        sol = action.solve(gtol=gtol, newton_steps=0)
        gmax = max(float(g.abs().max()) for g in action.gradient(sol.Us)) / action.N
        if gmax < tol or gtol < 1e-14:
            break
        gtol /= 100
    t_lbfgs, c_lbfgs = time.perf_counter() - w0, time.process_time() - c0
    c1 = time.process_time()
    Us_adam, steps, t_adam, ok = adam_raw_solve(action, lr=adam_lr, tol=tol, max_steps=max_steps)
    c_adam = time.process_time() - c1
    return {
        "lbfgs_s": t_lbfgs,
        "lbfgs_cpu_s": c_lbfgs,
        "lbfgs_grad_max": gmax,
        "adam_s": t_adam,
        "adam_cpu_s": c_adam,
        "adam_steps": steps,
        "adam_converged": ok,
        "speedup": c_adam / c_lbfgs,
        "speedup_wall": t_adam / t_lbfgs,
        "U_diff": float((Us_adam[0] - sol.U).abs().max()),
    }


# ----------------------------------------------------------------------------------------------
# posterior sampling: Hamiltonian Monte Carlo with step-size adaptation
# ----------------------------------------------------------------------------------------------
@dataclass
class HMCResult:
    """Samples ``(n_samples, chains, dim)`` and diagnostics of :func:`hmc`."""

    samples: torch.Tensor
    step_size: torch.Tensor  # (chains,)
    accept_rate: float
    divergences: int
    rhat_max: float
    ess_min: float
    seconds: float


def _rhat(x: np.ndarray) -> np.ndarray:
    """Split-chain potential scale reduction ``(n, chains, dim) -> (dim,)``."""
    n = x.shape[0] // 2
    c = np.concatenate([x[:n], x[n : 2 * n]], axis=1)  # (n, 2 chains, dim)
    W = c.var(0, ddof=1).mean(0)
    B = n * c.mean(0).var(0, ddof=1)
    var = (n - 1) / n * W + B / n
    return np.sqrt(var / np.maximum(W, 1e-300))


def _ess(x: np.ndarray, max_lag: int = 50) -> np.ndarray:
    """Crude effective sample size per dimension (initial positive autocorrelation sum)."""
    n, m, d = x.shape
    xc = x - x.mean(0, keepdims=True)
    var = (xc**2).mean(0).mean(0) + 1e-300
    rho_sum = np.zeros(d)
    alive = np.ones(d, bool)
    for lag in range(1, min(max_lag, n - 1)):
        rho = (xc[lag:] * xc[:-lag]).mean(0).mean(0) / var
        alive &= rho > 0
        rho_sum += np.where(alive, rho, 0.0)
    return n * m / (1.0 + 2.0 * rho_sum)


def hmc(
    log_prob,
    init: torch.Tensor,
    n_warmup: int,
    n_samples: int,
    n_leapfrog: int = 30,
    target_accept: float = 0.8,
    step_size: float = 1e-2,
    generator: torch.Generator | None = None,
    adapt_mass: bool = True,
    progress=None,
    stat_fn=None,
) -> HMCResult:
    """Hamiltonian Monte Carlo on several independent chains at once.

    ``log_prob(z)`` maps (chains, dim) to (chains,). Warm-up adapts a per-chain step size by dual
    averaging (target acceptance ``target_accept``) and, if ``adapt_mass``, a diagonal mass matrix
    from the second half of the warm-up. Divergences: energy error > 1000. Diagnostics (split
    R-hat, a crude effective sample size) are computed on ``stat_fn(samples)`` (n, chains, k)
    if given, else on the raw coordinates.
    """
    t0 = time.perf_counter()
    z = init.clone().to(DTYPE)
    C, d = z.shape
    dev = z.device
    inv_mass = torch.ones(C, d, dtype=DTYPE, device=dev)
    gamma, t0_da, kappa = 0.05, 10.0, 0.75
    # warm-up windows: [0, w1) step size only; [w1, w2) also collect draws for the metric;
    # at w2 set the diagonal metric and restart dual averaging; [w2, n_warmup) step size again.
    w1, w2 = int(0.3 * n_warmup), int(0.75 * n_warmup)

    def da_reset(eps0):
        return {
            "mu": torch.log(10 * eps0),
            "h": torch.zeros(C, dtype=DTYPE, device=dev),
            "lbar": torch.log(eps0),
            "m": 0,
        }

    eps = torch.full((C,), step_size, dtype=DTYPE, device=dev)
    da = da_reset(eps)

    def lp_grad(q):
        q = q.detach().requires_grad_(True)
        lp = log_prob(q)
        (g,) = torch.autograd.grad(lp.sum(), q)
        return lp.detach(), g.detach()

    lp, g = lp_grad(z)
    samples, acc_sum, n_div = [], 0.0, 0
    store = []
    for it in range(n_warmup + n_samples):
        p = torch.randn(C, d, generator=generator, dtype=DTYPE, device=dev) / torch.sqrt(inv_mass)
        H0 = -lp + 0.5 * (p * p * inv_mass).sum(1)
        q, pq, gq, lpq = z, p + 0.5 * eps[:, None] * g, g, lp
        for k in range(n_leapfrog):
            q = q + eps[:, None] * inv_mass * pq
            lpq, gq = lp_grad(q)
            if k < n_leapfrog - 1:
                pq = pq + eps[:, None] * gq
        pq = pq + 0.5 * eps[:, None] * gq
        H1 = -lpq + 0.5 * (pq * pq * inv_mass).sum(1)
        dH = H1 - H0
        dH = torch.where(torch.isfinite(dH), dH, torch.full_like(dH, 1e10))
        acc = torch.exp(torch.clamp(-dH, max=0.0))
        accept = torch.rand(C, generator=generator, dtype=DTYPE, device=dev) < acc
        z = torch.where(accept[:, None], q.detach(), z)
        lp = torch.where(accept, lpq, lp)
        g = torch.where(accept[:, None], gq, g)
        if it < n_warmup:
            da["m"] += 1
            m = da["m"]
            da["h"] = (1 - 1 / (m + t0_da)) * da["h"] + (target_accept - acc) / (m + t0_da)
            log_eps = da["mu"] - math.sqrt(m) / gamma * da["h"]
            eta = m ** (-kappa)
            da["lbar"] = eta * log_eps + (1 - eta) * da["lbar"]
            eps = torch.exp(log_eps)
            if adapt_mass and w1 <= it < w2:
                store.append(z.clone())
            if adapt_mass and it == w2 - 1 and len(store) > 5:
                w = torch.stack(store)
                n_w = w.shape[0]
                inv_mass = (n_w / (n_w + 5.0)) * w.var(0) + 1e-3 * (5.0 / (n_w + 5.0))
                inv_mass = inv_mass / inv_mass.mean(1, keepdim=True)  # keep the scale with eps
                eps = torch.exp(da["lbar"])
                da = da_reset(eps)
            if it == n_warmup - 1:
                eps = torch.exp(da["lbar"])
        else:
            acc_sum += float(acc.mean())
            n_div += int((dH > 1000).sum())
            samples.append(z.clone())
        if progress is not None:
            progress(it)
    S = torch.stack(samples)
    Sn = (S if stat_fn is None else stat_fn(S)).detach().cpu().numpy()
    return HMCResult(
        samples=S,
        step_size=eps,
        accept_rate=acc_sum / max(n_samples, 1),
        divergences=n_div,
        rhat_max=float(np.nanmax(_rhat(Sn))) if n_samples >= 4 else float("nan"),
        ess_min=float(np.nanmin(_ess(Sn))),
        seconds=time.perf_counter() - t0,
    )


class PathPosterior:
    """Gibbs posterior of the path network's trained weights, with attention frozen.

    .. math:: \\ln p(\\Theta|D) = -\\frac{1}{2T}\\sum_\\mu (f(x^\\mu)-y^\\mu)^2
              - \\sum_W \\frac{\\|W\\|^2}{2\\sigma_W^2} + \\text{const}

    ``collapsed=False`` samples every trained weight; the output is evaluated through the path
    expansion (:func:`path_forward`), which equals the forward pass. ``collapsed=True`` integrates
    the input projection ``V0`` out exactly (it enters linearly with a Gaussian prior), leaving

    .. math:: \\ln p(V^{(1..L)}, a|D) = -\\tfrac12 Y^\\top(K_U+T)^{-1}Y - \\tfrac12\\ln\\det(K_U+T)
              - \\sum_W \\frac{\\|W\\|^2}{2\\sigma_W^2},\\qquad U = w w^\\top/N_1,

    which is exact and much less stiff; predictions then average the conditional GP mean over
    samples (a Rao-Blackwellised estimate of the posterior-mean predictor).
    Parameters are flattened to one vector per chain.
    """

    def __init__(
        self,
        xi: torch.Tensor,
        Y: torch.Tensor,
        heads,
        widths,
        T: float,
        variances=None,
        collapsed: bool = True,
    ):
        self.xi = xi.to(DTYPE)
        self.Y = Y.to(DTYPE).to(xi.device)
        self.heads, self.widths, self.T = list(heads), list(widths), float(T)
        self.collapsed = collapsed
        L = len(heads)
        self.variances = [1.0] * (L + 2) if variances is None else list(variances)
        n0 = xi.shape[-1]
        shapes = [(widths[0], n0)] + [(heads[l], widths[l + 1], widths[l]) for l in range(L)] + [(widths[L],)]
        var = list(self.variances)
        if collapsed:
            shapes, var = shapes[1:], var[1:]
        self.shapes = shapes
        self.numels = [int(np.prod(s)) for s in self.shapes]
        self.dim = sum(self.numels)
        self.var_vec = torch.cat(
            [torch.full((n,), v, dtype=DTYPE) for n, v in zip(self.numels, var, strict=True)]
        ).to(xi.device)
        self.xt = scaled_features(self.xi, self.variances[0])
        P, n_paths = self.xt.shape[:2]
        self.C = path_kernels(self.xt, self.xt).reshape(n_paths * n_paths, P * P)

    def unflatten(self, z: torch.Tensor) -> dict:
        parts = torch.split(z, self.numels, dim=-1)
        lead = z.shape[:-1]
        parts = [p.reshape(*lead, *s) for p, s in zip(parts, self.shapes, strict=True)]
        if self.collapsed:
            return {"V0": None, "V": list(parts[:-1]), "a": parts[-1]}
        return {"V0": parts[0], "V": list(parts[1:-1]), "a": parts[-1]}

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        prior = -0.5 * (z * z / self.var_vec).sum(-1)
        if not self.collapsed:
            f = path_forward(self.xi, self.unflatten(z))  # (chains, P)
            return -0.5 * ((f - self.Y) ** 2).sum(-1) / self.T + prior
        U = path_overlap(self.unflatten(z))  # (chains, paths, paths)
        P = self.Y.shape[0]
        K = (U.reshape(U.shape[0], -1) @ self.C).reshape(-1, P, P)
        Lc = torch.linalg.cholesky(K + self.T * torch.eye(P, dtype=DTYPE, device=K.device))
        r = torch.cholesky_solve(self.Y.expand(K.shape[0], P)[..., None], Lc)[..., 0]
        logdet = 2.0 * torch.log(torch.diagonal(Lc, dim1=-2, dim2=-1)).sum(-1)
        return -0.5 * (self.Y * r).sum(-1) - 0.5 * logdet + prior

    def init(self, n_chains: int, generator=None) -> torch.Tensor:
        return torch.randn(
            n_chains, self.dim, generator=generator, dtype=DTYPE, device=self.xi.device
        ) * torch.sqrt(self.var_vec)

    def sample_overlaps(self, samples: torch.Tensor) -> torch.Tensor:
        """``U`` of every sample: (n_samples * chains, paths, paths)."""
        z = samples.reshape(-1, samples.shape[-1])
        return path_overlap(self.unflatten(z))

    def predictions(self, samples: torch.Tensor, xi_test: torch.Tensor) -> torch.Tensor:
        """Outputs (full) or conditional GP means (collapsed) on test inputs, per sample.

        Returns (n_samples * chains, P_test); the posterior-mean predictor is its mean over axis 0.
        """
        z = samples.reshape(-1, samples.shape[-1])
        if not self.collapsed:
            return path_forward(xi_test.to(DTYPE), self.unflatten(z))
        xt_test = scaled_features(xi_test.to(DTYPE), self.variances[0])
        Us = path_overlap(self.unflatten(z))
        return torch.stack([predict(U, self.xt, self.Y, xt_test, self.T)[0] for U in Us])

    def predictive_moments(self, samples: torch.Tensor, xi_test: torch.Tensor):
        """Posterior-predictive mean and variance of ``f(x*)`` from the samples, (P_test,) each.

        Full sampler: moments of the sampled outputs. Collapsed sampler: law of total variance,
        ``Var f = E[Var(f | U)] + Var(E[f | U])`` with the exact conditional GP moments.
        """
        z = samples.reshape(-1, samples.shape[-1])
        if not self.collapsed:
            f = path_forward(xi_test.to(DTYPE), self.unflatten(z))
            return f.mean(0), f.var(0)
        xt_test = scaled_features(xi_test.to(DTYPE), self.variances[0])
        Us = path_overlap(self.unflatten(z))
        mv = [predict(U, self.xt, self.Y, xt_test, self.T) for U in Us]
        means = torch.stack([m for m, _ in mv])
        var = torch.stack([v for _, v in mv]).mean(0) + means.var(0)
        return means.mean(0), var

    def overlaps(self, samples: torch.Tensor) -> torch.Tensor:
        """Posterior mean of ``U_{pi pi'} = w_pi . w_pi' / N_1`` over all samples."""
        return self.sample_overlaps(samples).mean(0)

    def statistics(self, samples: torch.Tensor) -> torch.Tensor:
        """Symmetry-invariant summaries for diagnostics: the upper triangle of ``U`` per sample,
        shape (n_samples, chains, n_stats). (Raw weights are not identifiable: ``a -> -a``,
        ``V -> -V`` leave the output unchanged, so R-hat on them is meaningless.)"""
        n, c = samples.shape[:2]
        U = self.sample_overlaps(samples)
        iu = torch.triu_indices(U.shape[-1], U.shape[-1])
        return U[:, iu[0], iu[1]].reshape(n, c, -1)


# ----------------------------------------------------------------------------------------------
# one-shot in-context classification with scikit-learn's digits (stand-in for Omniglot)
# ----------------------------------------------------------------------------------------------
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
