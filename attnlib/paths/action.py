"""The finite-width action over the order parameters ``U^(l)`` and its solvers (Chapter 4).

:class:`PathAction` (L-BFGS on Cholesky factors, Newton polish) is the book's solver;
:func:`adam_raw_solve` is the reference in the style of the authors' code (Adam on raw matrices);
:func:`compare_solvers` times both to the same stopping rule.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.optimize
import torch

from .kernels import renormalised_kernel
from .model import DTYPE


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

    The path-path kernels ``C_{pi pi'}`` of the distinct pairs ``pi <= pi'`` are precomputed when
    they hold at most ``precompute_max`` numbers (default 6e7, 480 MB in float64: P = 600 with 16
    paths fits); ``K_U`` and the energy gradient are then one matrix-vector product each. Otherwise,
    or with ``precompute_max=0``, ``K_U`` is rebuilt from the features at every evaluation.
    """

    def __init__(
        self,
        xt: torch.Tensor,
        Y: torch.Tensor,
        heads,
        widths,
        T: float,
        variances=None,
        precompute_max: float = 6e7,
    ):
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
        # precompute the kernels of the distinct path pairs when they fit (K is then one mat-vec):
        # for symmetric U, K = sum_{p<=q} U_pq S_pq with S_pp = C_pp, S_pq = C_pq + C_qp = C_pq + C_pq^T
        self._pairs = torch.triu_indices(n_paths, n_paths, device=self.device)
        self._pair_count = torch.where(self._pairs[0] != self._pairs[1], 2.0, 1.0).to(DTYPE)
        self.C = None
        if self._pairs.shape[1] * P * P <= precompute_max:
            a, b = self.xt[:, self._pairs[0]], self.xt[:, self._pairs[1]]  # (P, pairs, N0)
            Cp = torch.einsum("mki,nki->kmn", a, b)
            off = self._pairs[0] != self._pairs[1]
            Cp[off] = Cp[off] + Cp[off].transpose(-1, -2)
            self.C = Cp.reshape(-1, P * P)

    def kernel(self, U1: torch.Tensor) -> torch.Tensor:
        """Training kernel ``K_U`` (P, P) of a symmetric ``U1``."""
        if self.C is not None:
            P = self.xt.shape[0]
            Us = (U1 + U1.T) / 2  # the same function (and gradient) of every entry as the features route
            return (Us[self._pairs[0], self._pairs[1]] @ self.C).reshape(P, P)
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
        if self.C is not None:  # <C_pq, B> = <S_pq, B> / 2 (p != q, B symmetric), symmetric fill
            gp = (self.C @ B.reshape(-1)) / self._pair_count
            gE = torch.zeros_like(grads[0])
            gE[self._pairs[0], self._pairs[1]] = gp
            gE[self._pairs[1], self._pairs[0]] = gp
        else:
            gE = torch.einsum("mpi,mn,nqi->pq", self.xt, B, self.xt)
        grads[0] = grads[0] + gE
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


def solve_to_tolerance(action: PathAction, tol: float = 1e-5) -> tuple[ActionSolution, float]:
    """L-BFGS (no Newton polishing) tightened until ``max |dS/dU| < tol`` over the raw entries.

    The authors' stopping rule, applied to :meth:`PathAction.solve`: L-BFGS's own ``gtol`` acts on
    the Cholesky parameters, so it is lowered by factors of 100 until the rule holds (or falls
    below 1e-14). Returns the solution and the final ``max |dS/dU|``.
    """
    gtol = 1e-6
    while True:
        sol = action.solve(gtol=gtol, newton_steps=0)
        gmax = max(float(g.abs().max()) for g in action.gradient(sol.Us)) / action.N
        if gmax < tol or gtol < 1e-14:
            return sol, gmax
        gtol /= 100


def compare_solvers(
    action: PathAction,
    tol: float = 1e-5,
    adam_lr: float = 0.1,
    max_steps: int = 50_000,
    reference_recomputes_kernel: bool = True,
) -> dict:
    """Time to the same tolerance ``max |dS/dU| < tol`` (raw-entry gradient, the authors' rule).

    Our solver: L-BFGS on Cholesky factors from the GP point (no Newton polishing), tightened
    until the rule holds. Reference: Adam on the raw symmetrised matrices, as the authors run it
    (float64, fixed learning rate ``adam_lr``, at most ``max_steps`` steps); with
    ``reference_recomputes_kernel`` it rebuilds ``K_U`` from the path features at every step, as
    their code does, instead of using the precomputed path-path kernels. Returns wall and CPU
    seconds of both (the cost of building ``action`` is the caller's to add); ``speedup`` is the
    ratio of CPU times (steadier than wall time on a shared machine; on a GPU use the wall-time
    ratio ``speedup_wall``).
    """
    w0, c0 = time.perf_counter(), time.process_time()
    sol, gmax = solve_to_tolerance(action, tol)
    t_lbfgs, c_lbfgs = time.perf_counter() - w0, time.process_time() - c0
    c1 = time.process_time()
    reference = action
    if reference_recomputes_kernel:
        reference = copy.copy(action)
        reference.C = None
    Us_adam, steps, t_adam, ok = adam_raw_solve(reference, lr=adam_lr, tol=tol, max_steps=max_steps)
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
