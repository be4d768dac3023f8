"""The transition of Chapter 3 located by design: lowest fixed point from several starts, and a
bracketing root search for alpha_c(omega) with a quadrature error estimate at the bracket ends.

Two numerical facts shape this module. (i) The equations can have several solutions inside one
family (on the positional branch, for instance, fixed points with different m and training losses
a few per cent apart), and which one a damped iteration reaches depends on its start: so every
point is solved from several starts and the lowest training loss is kept
(:func:`lowest_fixed_points`). (ii) The proximal point jumps between local minima as the fields
move, so the channel integrands are only piecewise smooth and a product rule converges slowly; the
error of a rule is therefore *measured*, by solving again with a larger rule, and the rule is
enlarged until that error, converted into a shift of alpha_c, is smaller than the bracket
(:func:`critical_alpha`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from .channel import linear_baseline_error
from .model import branch_init
from .theory import TheoryConfig, solve_fixed_points

MOVES = (5e-4, -5e-4, 1e-3, -1e-3, 3e-3, -3e-3, 1e-2, -1e-2)
"""Steps in alpha tried, in this order, for a point whose iteration cycles (on a given rule the
discretised map can be discontinuous over a band of alpha: a node's proximal point jumps there)."""

MOVES_FAR = (1e-2, -1e-2, 2e-2, -2e-2, 4e-2, -4e-2)
"""The steps for points without bounds (the first bracket, which only needs a sign)."""

PERTURBATIONS = ((0.5, 0.6), (2.0, 0.8))
"""Perturbed starts: (factor on q, factor on the branch's overlap m or theta) of the published start
(a start that violates theta^2 < rho q is skipped)."""


def _starts(branch: str, extra, perturb: bool, rho: float, published: bool = True) -> list:
    """Published start (rescaled to sigma = sqrt(rho), :func:`branch_init`), its perturbations, and
    the extra (continuation) starts for one point."""
    q, m, V, th = branch_init(branch, float(np.sqrt(rho)))
    out = [("published", (q, m, V, th))] if published else []
    for fq, fo in PERTURBATIONS if perturb else ():
        if (th * fo) ** 2 < 0.95 * rho * q * fq:
            out.append((f"perturbed x{fq:g}/{fo:g}", (q * fq, m * fo, V, th * fo)))
    for k, s in enumerate(extra):
        if s is not None and np.all(np.isfinite(s)):
            out.append((f"continuation {k}", tuple(float(v) for v in s)))
    return out


def _valid(df: pd.DataFrame, sigma: float) -> pd.Series:
    """A converged candidate is a fixed point only if it is a physical state and passes the
    training-loss identity (eq-ch3-identity) to 1e-4 relative."""
    ok = df.converged.astype(bool) & np.isfinite(df.eps_t) & (df.eps_t > 0) & (df.q > 0) & (df.V > 0)
    ok &= df.theta**2 < sigma**2 * df.q
    return ok & ((df.eps_t - df.eps_t_direct).abs() < 1e-4 * df.eps_t.abs())


def lowest_fixed_points(alpha, omega, branch, config: TheoryConfig, continuation=None,
                        perturb: bool = True, published: bool = True, device="cpu",
                        distinct_rtol: float = 1e-3, quadrature=None, retry: bool = True) -> pd.DataFrame:
    """Solve every (alpha, omega, branch) point from several starts and keep the lowest eps_t.

    Starts per point: the published one (``published=True``), :data:`PERTURBATIONS` of it
    (``perturb=True``), and the optional ``continuation`` starts (a list, one entry per point, of
    lists of ``(q, m, V, theta)`` -- for instance the solutions at the neighbouring alphas on
    either side). All starts of all points
    are solved in one batch. A candidate counts as converged only if it also is a physical state
    and passes the training-loss identity (:func:`_valid`). Points whose every start fails are
    retried once with stronger damping (0.9) and twice the iteration budget, from the same starts
    (``retry=False`` skips this: :func:`critical_alpha` moves such points in alpha instead).
    ``quadrature`` is passed on to :func:`solve_fixed_points` (e.g. a randomised QMC rule).

    Returns one row per point (the lowest converged candidate, or the lowest of all when none
    converged) with the columns of :meth:`FixedPoints.to_frame`, plus ``n_starts``,
    ``n_converged``, ``multiplicity`` (distinct converged fixed points: training losses differing by
    more than ``distinct_rtol`` relative, or m / theta by more than 1e-3), ``eps_t_spread`` (largest
    minus smallest converged training loss), ``start`` (the winning start) and ``retried``.
    """
    alpha = np.atleast_1d(np.asarray(alpha, dtype=float))
    omega = np.broadcast_to(np.atleast_1d(np.asarray(omega, dtype=float)), alpha.shape)
    branch = [branch] * len(alpha) if isinstance(branch, str) else list(branch)
    continuation = continuation or [[] for _ in alpha]
    rows = []
    for i, (a, w, b) in enumerate(zip(alpha, omega, branch, strict=True)):
        starts = _starts(b, continuation[i], perturb, config.sigma**2, published)
        if not starts:
            raise ValueError("lowest_fixed_points: a point has no start (published=False, "
                             "perturb=False and no continuation)")
        for name, s in starts:
            rows.append((i, a, w, b, name, s))

    def run(rows, cfg):
        fp = solve_fixed_points([r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows],
                                cfg, init=np.array([r[5] for r in rows]), device=device,
                                quadrature=quadrature)
        df = fp.to_frame().assign(point=[r[0] for r in rows], start=[r[4] for r in rows])
        return df.assign(converged=_valid(df, config.sigma))

    cand = run(rows, config).assign(retried=False)
    failed = set(range(len(alpha))) - set(cand[cand.converged].point)
    if failed and retry:
        retry_cfg = replace(config, damping=max(config.damping, 0.9), max_iter=2 * config.max_iter)
        again = run([r for r in rows if r[0] in failed], retry_cfg).assign(retried=True)
        cand = pd.concat([cand, again], ignore_index=True)
    out = []
    for i in range(len(alpha)):
        c = cand[cand.point == i]
        conv = c[c.converged]
        pool = conv if len(conv) else c[np.isfinite(c.eps_t) & (c.eps_t > 0)]
        pool = pool if len(pool) else c
        best = pool.loc[pool.eps_t.idxmin()].copy()
        distinct = []
        for _, r in conv.sort_values("eps_t").iterrows():
            ov = r.m if branch[i] == "positional" else r.theta
            if not any(abs(r.eps_t - e) <= distinct_rtol * abs(e) and abs(ov - o) <= 1e-3
                       for e, o in distinct):
                distinct.append((r.eps_t, ov))
        best["n_starts"] = len(c[~c.retried]) if (~c.retried).any() else len(c)
        best["n_converged"] = len(conv)
        best["multiplicity"] = len(distinct)
        best["eps_t_spread"] = float(conv.eps_t.max() - conv.eps_t.min()) if len(conv) else np.nan
        best["retried"] = bool(c.retried.any())
        out.append(best)
    return pd.DataFrame(out).drop(columns=["point"]).reset_index(drop=True)


def lowest_on_grid(alphas, omega, branch: str, config: TheoryConfig, device="cpu",
                   perturb: bool = True, failed_only: bool = False) -> pd.DataFrame:
    """One branch on an alpha grid: :func:`lowest_fixed_points` at every alpha, then a second pass
    in which every point also starts from the solutions at its two neighbours (continuation in
    both directions); the lowest training loss of the two passes is kept. ``perturb`` is passed on
    to the first pass; ``failed_only=True`` runs the second pass only at points whose first pass
    did not converge (a cheap repair of a curve), and moves a point that still fails by a step of
    :data:`MOVES` in alpha (column ``moved_from``).
    """
    alphas = np.sort(np.atleast_1d(np.asarray(alphas, dtype=float)))
    first = lowest_fixed_points(alphas, omega, branch, config, perturb=perturb, device=device)
    ok = first.converged.to_numpy(bool)
    cont = []
    for i in range(len(alphas)):
        nb = [j for j in (i - 1, i + 1) if 0 <= j < len(alphas) and ok[j]]
        cont.append([_state(first.iloc[j]) for j in nb])
    idx = [i for i in range(len(alphas)) if cont[i] and not (failed_only and ok[i])]
    out = first.copy()
    if failed_only:
        out["moved_from"] = np.nan
    second = (lowest_fixed_points(alphas[idx], omega, branch, config,
                                  continuation=[cont[i] for i in idx], perturb=False,
                                  published=False, device=device).assign(moved_from=np.nan)
              if idx else None)
    for k, i in enumerate(idx):
        a, b = out.iloc[i], second.iloc[k]
        if bool(b.converged) and (not bool(a.converged) or b.eps_t < a.eps_t):
            row = b.copy()
            row["n_starts"] = int(a.n_starts) + int(b.n_starts)
            row["multiplicity"] = max(int(a.multiplicity), int(b.multiplicity))
            out.iloc[i] = row[out.columns]
    if failed_only:
        # a point that still cycles (its rule's map jumps there) is moved in alpha by the steps
        # of MOVES that keep it between its neighbours; ``moved_from`` records the original alpha
        for i in np.flatnonzero(~out.converged.to_numpy(bool)):
            lo = alphas[i - 1] if i > 0 else 0.01
            hi = alphas[i + 1] if i + 1 < len(alphas) else np.inf
            nb = [_state(out.iloc[j]) for j in (i - 1, i + 1)
                  if 0 <= j < len(alphas) and bool(out.iloc[j].converged)]
            for step in MOVES:
                a2 = round(float(alphas[i]) + step, 6)
                if not lo < a2 < hi:
                    continue
                r = lowest_fixed_points([a2], omega, branch, config, continuation=[nb],
                                        perturb=False, device=device, retry=False).iloc[0]
                if bool(r.converged):
                    r["moved_from"] = float(alphas[i])
                    out.iloc[i] = r[out.columns]
                    break
    return out


def _state(row) -> tuple:
    return (float(row.q), float(row.m), float(row.V), float(row.theta))


def critical_alpha(omegas, config: TheoryConfig, guess, half_width: float = 0.05,
                   bracket_tol: float = 0.01, refine_nodes=(10, 12), max_steps: int = 8,
                   kind: str = "c", multistart: bool = True, rebracket_tries: int = 2,
                   repair: bool = False, device="cpu") -> tuple[pd.DataFrame, pd.DataFrame]:
    """alpha_c(omega), the zero of eps_t^sem - eps_t^pos, by a bracketing search at every omega.

    With ``kind="l"`` the same search locates alpha_l(omega) instead, the zero of
    :math:`\\varepsilon_g^{\\rm sem}-\\varepsilon_g^{\\rm lin}` (semantic branch only).

    1. Both branches at ``guess(omega) -+ half_width`` from the published starts; the pair is
       moved until it brackets a sign change.
    2. Regula falsi (Illinois variant) inside the bracket until it is narrower than
       ``bracket_tol``; every new alpha starts from the solutions at both bracket ends
       (continuation from both sides).
    3. Multi-start at the final bracket ends (:func:`lowest_fixed_points`: the published starts,
       their perturbations, the current solution and the neighbours' solutions): the lowest
       training loss is kept, and if that changes the sign pattern the search resumes
       (``multistart=False`` skips this step). On a refined rule the ends start from the published
       point and the coarser rules' multi-start winners only.
    4. Quadrature check: both bracket ends solved again with the next rule of ``refine_nodes``,
       started from the current solutions; the change of the gap divided by its slope across the
       bracket is the quadrature error of the root. If it exceeds the bracket width, the larger
       rule becomes the working rule: a bracket of width ``bracket_tol`` is placed around the
       secant root of the larger rule's values at the old ends (the rule's error is nearly
       constant across a bracket), solved on the larger rule, and the search resumes there.

    Every solve also runs the family-consistency and move-off-a-jump passes described in the
    inner ``solve`` (a point whose overlap differs by > 1 % from a close neighbour's is solved
    again from it; a point whose iteration cycles is moved in alpha by a step of :data:`MOVES`). Where a
    multi-start or a change of rule leaves the bracket ends on the same side, up to
    ``rebracket_tries`` secant re-brackets of growing width are attempted (with 0, that omega is
    reported with ``sign_changes`` 0 and ``alpha`` NaN); ``repair=True`` solves unconverged
    points once more from the nearest converged solutions.

    All omegas advance together (one batched solve per step). Returns ``(crit, points)``:
    ``crit`` has one row per omega (``alpha`` = the root, ``bracket_lo``, ``bracket_hi``,
    ``n_nodes`` of the working rule, ``check_nodes``, ``quad_err_alpha``, ``converged_ends``,
    ``multiplicity_ends``, ``sign_changes`` of the gap over every alpha solved with the working
    rule, ``steps``, ``gap_slope`` across the final bracket, ``quad_err_from_previous_rule``: True
    where the largest rule of ``refine_nodes`` was reached and the error reported is the shift
    measured against the previous rule, which then exceeds the bracket); ``points`` holds the kept solution at
    every solved (omega, rule, alpha, branch) with its multiplicity and convergence flags
    (``moved_from``: the alpha it replaces, for a point moved off a jump of the proximal point).
    """
    if kind not in ("c", "l"):
        raise ValueError(f"kind must be 'c' (alpha_c) or 'l' (alpha_l); got {kind!r}")
    omegas = [float(w) for w in omegas]
    branches = ("positional", "semantic") if kind == "c" else ("semantic",)
    lin = {w: float(linear_baseline_error(w, config.sigma)) for w in omegas}
    rule = {w: config.n_nodes for w in omegas}
    sols = {}         # (omega, n_nodes, alpha) -> {branch: row}
    explored = set()  # keys solved with the perturbed starts too

    def batch(reqs, n, cont, perturb, published):
        """One batched multi-start solve of the branches at the points ``reqs`` on rule ``n``;
        ``cont`` holds one list of continuation starts per (point, branch)."""
        # (an iteration whose change is still above tol after the Anderson phase but below 1e-3 is
        # stopped as stalled: it cycles across a jump of the proximal point, and pass (c) of
        # solve moves such a point rather than iterating on)
        cfg = replace(config, n_nodes=n, tol_stall=max(config.tol_stall, 1e-3))
        res = lowest_fixed_points([a for _, a in reqs for _ in branches],
                                  [w for w, _ in reqs for _ in branches],
                                  list(branches) * len(reqs), cfg,
                                  continuation=cont, perturb=perturb, published=published,
                                  device=device, retry=False).assign(rule=n)
        return [{b: res.iloc[len(branches) * k + j] for j, b in enumerate(branches)}
                for k in range(len(reqs))]

    def neighbours(w, n, a):
        same = sorted(k[2] for k in sols if k[0] == w and k[1] == n)
        return [x for x in same if x < a][-1:] + [x for x in same if x > a][:1]

    def overlap(row, b):
        return float(row.m if b == "positional" else row.theta)

    def converged(sol):
        return all(bool(r.converged) for r in sol.values())

    def solve(requests, perturb=False, published=False, bounds=None):
        """requests: (omega, alpha, n_nodes); solves the branches, grouped by rule.

        Three passes. (a) Every new point from the published start (where asked, or where no
        solution is near), its perturbations (``perturb``) and the solutions nearest to it (same
        rule: its neighbours on either side; a new rule: the nearest points of the other rules).
        (b) Family consistency: where a branch's overlap differs by more than 1 % from that of a
        converged neighbour within 0.02 in alpha on the same rule (the two iterations ended in
        different families of fixed points), the point is solved again from the neighbour's
        solution and the lower training loss is kept. (c) A point where a branch did not converge
        (its discretised map cycles across a jump of the proximal point) is moved in alpha by the
        steps of :data:`MOVES` that stay inside ``bounds[(omega, alpha)]`` (open interval; no
        bound: any step), and solved there; the first converged pair replaces it.
        Returns ``{(omega, n, alpha): new alpha}`` for the points moved in (c).
        """
        by_rule = {}
        for w, a, n in requests:
            if (w, n, a) not in sols or (perturb and (w, n, a) not in explored):
                by_rule.setdefault(n, []).append((w, a))
        moved = {}
        for n, reqs in by_rule.items():
            cont = []
            for w, a in reqs:
                keys = [(w, n, x) for x in ([a] if (w, n, a) in sols else neighbours(w, n, a))]
                if not keys:  # a new rule: start from the nearest solutions of other rules
                    keys = sorted((k for k in sols if k[0] == w), key=lambda k: abs(k[2] - a))[:2]
                for b in branches:
                    st = [sols[k][b] for k in keys]
                    # and one start in every other family met at this omega (on any rule): which
                    # family is lowest can change with the rule
                    for k in sorted((k for k in sols if k[0] == w), key=lambda k: abs(k[2] - a)):
                        r = sols[k][b]
                        if bool(r.converged) and all(abs(overlap(r, b) - overlap(x, b))
                                                     > 0.01 * max(abs(overlap(x, b)), 1e-3) for x in st):
                            st.append(r)
                    cont.append([_state(r) for r in st])
            pub = published or perturb or any(not c for c in cont)
            for (w, a), sol in zip(reqs, batch(reqs, n, cont, perturb, pub), strict=True):
                sols[(w, n, a)] = sol
                if perturb:
                    explored.add((w, n, a))
            # (b) family consistency with the converged neighbours on the same rule
            again, cont = [], []
            for w, a in reqs:
                nb = [(w, n, x) for x in neighbours(w, n, a)
                      if abs(x - a) <= 0.02 and converged(sols[(w, n, x)])]
                starts = [[_state(sols[k][b]) for k in nb
                           if abs(overlap(sols[k][b], b) - overlap(sols[(w, n, a)][b], b))
                           > 0.01 * max(abs(overlap(sols[k][b], b)), 1e-3)] for b in branches]
                if any(starts):
                    again.append((w, a))
                    cont += [st or [_state(sols[(w, n, a)][b])]
                             for st, b in zip(starts, branches, strict=True)]
            if again:
                for (w, a), sol in zip(again, batch(again, n, cont, False, False), strict=True):
                    old = sols[(w, n, a)]
                    for b in branches:
                        if bool(sol[b].converged) and (not bool(old[b].converged)
                                                       or sol[b].eps_t < old[b].eps_t):
                            old[b] = sol[b]
            # (c) move points whose iteration cycles by a small step in alpha
            bad = [(w, a) for w, a in reqs if not converged(sols[(w, n, a)])]
            for step in (MOVES_FAR if bounds is None else MOVES):
                lim = {(w, a): (bounds or {}).get((w, a), (-np.inf, np.inf)) for w, a in bad}
                go = [(w, a) for w, a in bad if lim[(w, a)][0] < a + step < lim[(w, a)][1]
                      and a + step > 0.01]
                if not go:
                    continue
                trial = [(w, round(a + step, 6)) for w, a in go]
                cont = [[_state(sols[(w, n, a)][b])] + [_state(sols[(w, n, x)][b])
                                                         for x in neighbours(w, n, a)]
                        for w, a in go for b in branches]
                for (w, a), (_, a2), sol in zip(go, trial, batch(trial, n, cont, False, True),
                                                strict=True):
                    if converged(sol):
                        sols[(w, n, a2)] = {b: r.copy() for b, r in sol.items()}
                        for r in sols[(w, n, a2)].values():
                            r["moved_from"] = a
                        del sols[(w, n, a)]
                        explored.discard((w, n, a))
                        moved[(w, n, a)] = a2
                bad = [(w, a) for w, a in bad if (w, n, a) not in moved]
        return moved

    def gap(w, a, n=None):
        s = sols[(w, rule[w] if n is None else n, a)]
        if kind == "l":
            return float(s["semantic"].eps_g - lin[w])
        return float(s["semantic"].eps_t - s["positional"].eps_t)

    def rebracket(ws):
        """Restore a bracket at every omega of ``ws`` whose ends no longer bracket the root (after
        a multi-start or a change of rule): secant extrapolation from the two ends, then a bracket
        of growing width around the estimate. Returns the omegas that bracket again."""
        todo = [w for w in ws if not gap(w, bracket[w][0]) > 0 >= gap(w, bracket[w][1])]
        for k in range(rebracket_tries):
            if not todo:
                break
            for w in todo:
                a0, a1 = bracket[w]
                d0, d1 = gap(w, a0), gap(w, a1)
                est = a0 - d0 * (a1 - a0) / (d1 - d0) if d1 != d0 else (a0 + a1) / 2
                # the rule's error is nearly constant across a bracket, so the secant of the new
                # rule's values is accurate: a bracket of the target width around it usually
                # holds the root at once (no further regula falsi on the costly rule)
                h = 0.4995 * bracket_tol * (k + 1)
                bracket[w] = [round(max(0.02, est - h), 6), round(est + h, 6)]
                mult[w], last[w], steps[w] = [1.0, 1.0], None, 0
            moved = solve([(w, a, rule[w]) for w in todo for a in bracket[w]], published=True,
                          bounds={**{(w, bracket[w][0]): (-np.inf, bracket[w][0] + 1.5e-3) for w in todo},
                                  **{(w, bracket[w][1]): (bracket[w][1] - 1.5e-3, np.inf) for w in todo}})
            for w in todo:
                bracket[w] = [moved.get((w, rule[w], a), a) for a in bracket[w]]
            todo = [w for w in todo if not gap(w, bracket[w][0]) > 0 >= gap(w, bracket[w][1])]
        return [w for w in ws if w not in todo]

    # 1. a pair of alphas moved until it brackets the sign change
    bracket = {w: [max(0.02, guess(w) - half_width), guess(w) + half_width] for w in omegas}
    found = set()
    for k in range(8):
        moved = solve([(w, a, rule[w]) for w in omegas if w not in found for a in bracket[w]],
                      published=True)
        for w in omegas:
            if w in found:
                continue
            bracket[w] = [moved.get((w, rule[w], a), a) for a in bracket[w]]
            a0, a1 = bracket[w]
            d0, d1 = gap(w, a0), gap(w, a1)
            if d0 > 0 >= d1:
                found.add(w)
            elif d1 > 0:  # both above: the root is to the right (growing steps)
                bracket[w] = [a1, a1 + 2 * (k + 1) * half_width]
            else:
                bracket[w] = [max(0.02, a0 - 2 * (k + 1) * half_width), a0]
        if len(found) == len(omegas):
            break
    steps = {w: 0 for w in omegas}
    check = {}
    at = {}  # omega -> the alphas at which the check rule was solved (the bracket ends, or moved)
    switch_err = {}  # omega -> the error measured when the working rule was last enlarged

    def quad_err(w, c):
        """Shift of the root when the gap of rule ``c`` replaces that of the working rule: the
        largest change of the gap at the check points, over the slope across the bracket (the
        working rule's gap is interpolated linearly to a check point that was moved)."""
        a0, a1 = bracket[w]
        d0, d1 = gap(w, a0), gap(w, a1)
        slope = (d1 - d0) / (a1 - a0)
        return max(abs(gap(w, x, c) - (d0 + slope * (x - a0))) for x in at[w]) / abs(slope)

    mult = {w: [1.0, 1.0] for w in omegas}  # Illinois factors on the two ends' values
    last = {w: None for w in omegas}         # which end the previous step replaced
    active = [w for w in omegas if w in found]
    rounds = 0
    while active and rounds < 20:
        rounds += 1
        # 2. regula falsi (Illinois) until the bracket is narrow enough
        todo = [w for w in active if bracket[w][1] - bracket[w][0] > bracket_tol and steps[w] < max_steps]
        if todo:
            new = {}
            for w in todo:
                a0, a1 = bracket[w]
                d0, d1 = gap(w, a0) * mult[w][0], gap(w, a1) * mult[w][1]
                a = a0 - d0 * (a1 - a0) / (d1 - d0)
                # keep the new point inside the middle 80 % so that the bracket always shrinks
                new[w] = round(float(np.clip(a, a0 + 0.1 * (a1 - a0), a1 - 0.1 * (a1 - a0))), 6)
            moved = solve([(w, a, rule[w]) for w, a in new.items()],
                          bounds={(w, a): tuple(bracket[w]) for w, a in new.items()})
            new = {w: moved.get((w, rule[w], a), a) for w, a in new.items()}
            for w, a in new.items():
                steps[w] += 1
                end = 0 if gap(w, a) > 0 else 1
                bracket[w][end] = a
                mult[w][end] = 1.0
                if last[w] == end:  # the other end survived twice: halve its weight
                    mult[w][1 - end] *= 0.5
                last[w] = end
            continue
        # 3. multi-start at the bracket ends; resume the search if the sign pattern changes. On a
        #    refined rule the ends start from the published point and from the multi-start winners
        #    of the coarser rules (continuation in the rule): the family was chosen there, cheaply
        #    A bracket end whose new starts all fail is moved off the jump (pass (c) of solve):
        #    outwards freely, inwards by at most 1.5e-3, and the bracket follows it
        base = [w for w in active if rule[w] == config.n_nodes]
        ends = {**{(w, bracket[w][0]): (-np.inf, bracket[w][0] + 1.5e-3) for w in active},
                **{(w, bracket[w][1]): (bracket[w][1] - 1.5e-3, np.inf) for w in active}}
        moved = solve([(w, a, rule[w]) for w in base for a in bracket[w]], perturb=multistart,
                      bounds=ends)
        moved |= solve([(w, a, rule[w]) for w in active if w not in base for a in bracket[w]],
                       published=True, bounds=ends)
        for w in active:
            bracket[w] = [moved.get((w, rule[w], a), a) for a in bracket[w]]
        lost = [w for w in active if not gap(w, bracket[w][0]) > 0 >= gap(w, bracket[w][1])]
        if lost:
            kept = rebracket(lost)
            active = [w for w in active if w not in lost or w in kept]
            continue
        # 4. quadrature check at the bracket ends with the next larger rule
        req = []
        for w in active:
            larger = [n for n in refine_nodes if n > rule[w]]
            check[w] = larger[0] if larger else None
            if check[w] is not None:
                req += [(w, a, check[w]) for a in bracket[w]]
        moved = solve(req, bounds={(w, a): (a - 1.5e-3, a + 1.5e-3) for w, a, _ in req})
        nxt = []
        for w in active:
            if check[w] is None:
                continue
            at[w] = [moved.get((w, check[w], a), a) for a in bracket[w]]
            err = quad_err(w, check[w])
            width = bracket[w][1] - bracket[w][0]
            if err <= width:
                continue
            # the rule's error exceeds the bracket: the larger rule becomes the working rule
            switch_err[w] = err
            rule[w] = check[w]
            bracket[w] = sorted(at[w])  # where the larger rule was solved (a point may have moved)
            mult[w], last[w], steps[w] = [1.0, 1.0], None, 0
            nxt.append(w)
        # where the larger rule moved the crossing out of the bracket, follow it
        active = rebracket(nxt)
    # 5. every point whose iteration failed from its starts is solved again from the published
    #    starts and the converged solutions nearest to it (same omega, same rule); the lower
    #    converged candidate is kept
    bad = [k for k, v in sols.items() if not all(bool(r.converged) for r in v.values())] if repair else []
    for n in sorted({k[1] for k in bad}):
        keys = [k for k in bad if k[1] == n]
        al, om, br, cont = [], [], [], []
        for w, _, a in keys:
            good = [k for k, v in sols.items() if k[0] == w and k[1] == n and k[2] != a
                    and all(bool(r.converged) for r in v.values())]
            good = sorted(good, key=lambda k, a=a: abs(k[2] - a))[:2]
            for b in branches:
                al.append(a)
                om.append(w)
                br.append(b)
                cont.append([_state(sols[k][b]) for k in good])
        res = lowest_fixed_points(al, om, br, replace(config, n_nodes=n), continuation=cont,
                                  perturb=False, device=device).assign(rule=n)
        for j, (w, _, a) in enumerate(keys):
            for i, b in enumerate(branches):
                new, old = res.iloc[len(branches) * j + i], sols[(w, n, a)][b]
                if bool(new.converged) and (not bool(old.converged) or new.eps_t < old.eps_t):
                    sols[(w, n, a)][b] = new
    if bad:
        active = rebracket([w for w in omegas if w in found])
    rows = []
    for w in omegas:
        if w not in found:
            rows.append({"omega": w, "alpha": np.nan})
            continue
        a0, a1 = bracket[w]
        n = rule[w]
        d0, d1 = gap(w, a0), gap(w, a1)
        ends = [sols[(w, n, a)][b] for a in (a0, a1) for b in branches]
        err, from_previous = np.nan, False
        c = check.get(w)
        if c is not None and c != n and all((w, c, x) in sols for x in at.get(w, [None])):
            err = quad_err(w, c)
        elif n != config.n_nodes and w in switch_err:
            # the largest rule was reached: no larger rule checks it, and the shift measured
            # between it and the previous rule is the error estimate reported
            err, from_previous = switch_err[w], True
        grid = sorted(k[2] for k in sols if k[0] == w and k[1] == n)
        g = np.array([gap(w, a) for a in grid])
        rows.append({
            "omega": w, "alpha": a0 - d0 * (a1 - a0) / (d1 - d0) if d0 > 0 >= d1 else np.nan,
            "bracket_lo": a0,
            "bracket_hi": a1, "n_nodes": n, "check_nodes": c, "quad_err_alpha": err,
            "quad_err_from_previous_rule": from_previous,
            "converged_ends": bool(all(bool(e.converged) for e in ends)), "steps": steps[w],
            "multiplicity_ends": int(max(int(e.multiplicity) for e in ends)),
            "gap_slope": (d1 - d0) / (a1 - a0),
            "sign_changes": int(np.sum(np.diff(np.sign(g)) != 0)),
        })
    kept = pd.DataFrame([r for v in sols.values() for r in v.values()]).reset_index(drop=True)
    if "moved_from" not in kept:
        kept["moved_from"] = np.nan
    return pd.DataFrame(rows), kept


def _rows(df: pd.DataFrame) -> list[dict]:
    """A frame as JSON-able rows for :func:`attnlib.sweep` (NaN and NA as None)."""
    df = df.astype(object).where(df.notna(), None)
    return [{k: (v.item() if isinstance(v, np.generic) else v) for k, v in r.items()}
            for r in df.to_dict("records")]


def _theory_config(config) -> TheoryConfig:
    if isinstance(config, TheoryConfig):
        return config
    config = dict(config)
    config["A"] = tuple(tuple(float(v) for v in row) for row in config.get("A", ()))
    return TheoryConfig(**config)


def transition_rows(kind: str, omegas, config, bracket_tol: float = 0.01, refine_nodes=(10, 12),
                    multistart: bool = True, rebracket_tries: int = 2, device="cpu") -> list[dict]:
    """alpha_c (``kind="c"``) or alpha_l (``kind="l"``) at ``omegas`` as JSON-able rows: a point
    function for :func:`attnlib.sweep`, so that groups of omegas run side by side on Dask workers.

    Runs :func:`critical_alpha` from the published tables (plus 0.02) as first guesses; returns the
    rows of its ``crit`` frame with ``table="root"``, then those of its ``points`` frame with
    ``table="points"`` (NaN as None). ``config`` is a :class:`TheoryConfig` or its ``asdict``.
    Each omega's search is independent of the others, so splitting the omegas into groups gives
    the same table as one call.
    """
    from .reference import PUBLISHED_ALPHA_C, PUBLISHED_ALPHA_L

    if kind not in ("c", "l"):
        raise ValueError(f"kind must be 'c' (alpha_c) or 'l' (alpha_l); got {kind!r}")
    table = PUBLISHED_ALPHA_C if kind == "c" else PUBLISHED_ALPHA_L
    ws = sorted(table)

    def guess(w):  # only the first bracket; the search moves it until it brackets the root
        return float(np.interp(w, ws, [table[k] for k in ws])) + 0.02

    crit, pts = critical_alpha(omegas, _theory_config(config), guess, kind=kind,
                               bracket_tol=bracket_tol, multistart=multistart,
                               refine_nodes=tuple(refine_nodes), rebracket_tries=rebracket_tries,
                               device=device)
    return _rows(pd.concat([crit.assign(table="root"), pts.assign(table="points")], ignore_index=True))


def grid_rows(omega: float, alphas, config, branches=("positional", "semantic"), repair: bool = True,
              device="cpu") -> list[dict]:
    """Branches at one omega on an alpha grid as JSON-able rows (a point function for
    :func:`attnlib.sweep`). ``repair=True``: :func:`lowest_on_grid` from the published starts,
    points that fail solved again from their neighbours and, if still failing, moved off a jump of
    the proximal point (column ``moved_from``); ``repair=False``: :func:`lowest_fixed_points` from
    the published starts only (a point that fails is retried with stronger damping, then kept
    unconverged)."""
    cfg = _theory_config(config)
    alphas = [float(a) for a in alphas]
    if repair:
        parts = [lowest_on_grid(alphas, float(omega), b, cfg, perturb=False, failed_only=True,
                                device=device) for b in branches]
    else:
        parts = [lowest_fixed_points(alphas, float(omega), b, cfg, perturb=False, device=device)
                 .assign(moved_from=np.nan) for b in branches]
    return _rows(pd.concat(parts, ignore_index=True))
