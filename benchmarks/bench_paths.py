"""Chapter 4's action solver against the authors' method on whole sweeps, and the HMC sampler's cost.

Ours: L-BFGS on Cholesky factors of the order parameters from the GP point, tightened until the
authors' stopping rule holds (``attnlib.paths.solve_to_tolerance``; the construction of the
path-path kernels is counted). Reference, as the authors run it: Adam on the raw symmetrised
matrices, float64, fixed learning rate as published (0.1 for the Markov task, 0.008 for the image
task), rebuilding ``K_U`` from the path features at every step, stopping when
``max |dS/dU| < 1e-5`` over the raw entries (at most 50 000 steps).

Sections (all CPU seconds, single-threaded, ``time.process_time``):

* ``markov``: the width sweep of the chapter's Figure (widths 10 ... 1000, ``T = 0.01``, P = 100),
  for each random draw, both solvers run to the end;
* ``images``: the paper's image grid, 10 widths x 10 temperatures at P = 600 with 16 paths
  (L = 2, H = 4), 48 tokens of dimension 192, mean pooling. The inputs are random sequences of
  these shapes with random bilinear heads, and the labels the signs of a random linear read-out of
  the path features: the cost of both solvers depends on the shapes and on how far the minimum
  lies from the GP point, not on what the tokens show. On 2 CPU cores neither solver covers the
  100 points in a reasonable time, so the grid is sampled: the points are visited in a seeded
  random order, ours runs until ``--images-budget-s`` CPU seconds are spent, and the reference
  runs on the first ``--adam-points`` of them. The reference's CPU cost per step is measured with
  the kernel rebuilt every step, and its number of steps is counted by iterating the same Adam
  updates with the precomputed kernels (the same iterates up to rounding), capped at
  ``--adam-max-steps`` (a capped point makes the estimate a lower bound, which the output flags).
  Grid totals are the per-point means times 100; the ratio on the points both solvers ran is
  reported as well. ``--images-inputs glyphs`` replaces the random inputs by real ones: chapter 4's
  glyph episodes (P = 600 of the training pool, N0 = 49) under the attention of a network trained
  by gradient descent with the ``quick`` image profile, with their labels; ``--adam-timed-points k``
  also runs the reference to the end, kernel rebuilt every step, on the first k of its points and
  reports the measured time beside the estimate;
* ``hmc``: the chapter's collapsed HMC sampler at N = 10 (quick sizes), effective samples of the
  worst-mixing entry of U per second, warm-up included.

Usage::

    python benchmarks/bench_paths.py [--sections markov,images,hmc] [--out FILE]

``--out`` writes the results with a provenance record (the committed copy is
``benchmarks/results/bench_paths.json``; chapter 4 quotes the image grid from there).
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import math
import os
import platform
import sys
import time

import numpy as np
import torch

import attnlib
from attnbook.chapter_params import chapter_sizes
from attnbook.runs import git_commit
from attnlib import paths as ap

F64 = torch.float64
MARKOV_WIDTHS = [10, 30, 50, 100, 300, 500, 1000]
IMAGE_WIDTHS = [10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
IMAGE_TEMPS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5]
TOL = 1e-5


def cpu(fn):
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def bench_markov(draws: int) -> dict:
    rows = []
    for draw in range(draws):
        pr = ap.markov_problem(ap.MarkovTaskConfig(), draw, "four")
        xt, y = ap.scaled_features(pr["xi_tr"]), pr["y_tr"]
        for N in MARKOV_WIDTHS:
            act, setup = cpu(lambda N=N, xt=xt, y=y: ap.PathAction(xt, y, [2, 2], [N, N, N], 0.01))
            r = ap.compare_solvers(act, tol=TOL, adam_lr=0.1, reference_recomputes_kernel=True)
            rows.append(
                dict(
                    draw=draw,
                    N=N,
                    ours_cpu_s=setup + r["lbfgs_cpu_s"],
                    adam_cpu_s=r["adam_cpu_s"],
                    adam_steps=r["adam_steps"],
                    adam_converged=r["adam_converged"],
                    max_dU=r["U_diff"],
                )
            )
            print(
                f"markov draw {draw} N {N:>5}: ours {rows[-1]['ours_cpu_s']:.2f} s, "
                f"adam {r['adam_cpu_s']:.2f} s ({r['adam_steps']} steps)",
                flush=True,
            )
    ours = sum(r["ours_cpu_s"] for r in rows)
    adam = sum(r["adam_cpu_s"] for r in rows)
    return {
        "points": rows,
        "ours_cpu_s": ours,
        "adam_cpu_s": adam,
        "speedup_sweep": adam / ours,
        "speedup_per_draw": [
            sum(r["adam_cpu_s"] for r in rows if r["draw"] == d)
            / sum(r["ours_cpu_s"] for r in rows if r["draw"] == d)
            for d in range(draws)
        ],
        "max_dU": max(r["max_dU"] for r in rows),
        "widths": MARKOV_WIDTHS,
        "T": 0.01,
        "P": 100,
        "adam_lr": 0.1,
    }


def random_image_task(P: int = 600, n_tok: int = 48, n0: int = 192, heads: int = 4, seed: int = 0):
    """Random sequences of the image task's shapes, random heads, labels from a random read-out."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(P, n_tok, n0, generator=g, dtype=F64)
    Ws = [torch.randn(heads, n0, n0, generator=g, dtype=F64) / n0 for _ in range(2)]
    xi = ap.path_features(x, [ap.attention_from_bilinear(x, W) for W in Ws], "mean")
    w = torch.randn(heads * heads, n0, generator=g, dtype=F64)
    y = torch.sign((xi * w).sum((1, 2)))
    return ap.scaled_features(xi), y


def glyph_image_task(P: int = 600, seed: int = 0):
    """The chapter's glyph task at P training episodes: the attention of a network trained by
    gradient descent with the ``quick`` image profile (training seed ``seed``), its path features
    of the first P episodes of the training pool, and their labels (N0 = 49, 48 tokens, 16 paths)."""
    icfg = chapter_sizes("04-attention-paths", "quick")["images"]
    glyphs = attnlib.glyphs.make_glyphs(icfg.glyphs)
    g = torch.Generator().manual_seed(seed + 7)  # the chapter's data generator
    pool = ap.make_episodes(glyphs, icfg.n_pool, "train", g, icfg.patch)
    nets, _ = ap.train_icl_nets(icfg, pool.x, pool.y, [torch.Generator().manual_seed(100 + seed)], [seed])
    tr = pool[:P]
    with torch.no_grad():
        attn = [A.double() for A in nets[0].attention(tr.x.float())]
        xi = ap.path_features(tr.x, attn, "mean")
    return ap.scaled_features(xi), tr.y


def adam_steps_and_cost(act: ap.PathAction, lr: float, max_steps: int, cost_steps: int = 10):
    """Adam's steps to the tolerance (precomputed kernels) and its CPU cost per step (kernel rebuilt)."""
    _, steps, _, ok = ap.adam_raw_solve(act, lr=lr, tol=TOL, max_steps=max_steps)
    ref = copy.copy(act)
    ref.C = None
    _, per = cpu(lambda: ap.adam_raw_solve(ref, lr=lr, tol=0.0, max_steps=cost_steps))
    return steps, ok, per / cost_steps


def bench_images(
    adam_points: int, adam_max_steps: int, budget_s: float, seed: int = 0, inputs: str = "random",
    adam_timed_points: int = 0,
) -> dict:
    if inputs == "glyphs":
        (xt, y), train_s = cpu(glyph_image_task)
    else:
        xt, y = random_image_task()
    (base, setup) = cpu(lambda: ap.PathAction(xt, y, [4, 4], [10, 10, 10], 0.1))
    grid = [(N, T) for N in IMAGE_WIDTHS for T in IMAGE_TEMPS]
    order = np.random.default_rng(seed).permutation(len(grid))  # uniform sample of the grid

    def action(N, T):
        act = copy.copy(base)  # same features and kernels; only N and T change
        act.widths, act.N, act.T = [N, N, N], float(N), T
        return act

    rows, spent = [], 0.0
    for i in order:
        N, T = grid[i]
        (sol, gmax), sec = cpu(lambda N=N, T=T: ap.solve_to_tolerance(action(N, T), TOL))
        spent += sec
        rows.append(
            dict(
                N=N,
                T=T,
                ours_cpu_s=sec,
                ours_grad_max=gmax,
                ours_converged=gmax < TOL,
                residual=sol.residual_max,
                iterations=sol.n_iter,
            )
        )
        print(
            f"images N {N:>5} T {T:<5}: ours {sec:.2f} s ({sol.n_iter} it), max|dS/dU| {gmax:.1e}", flush=True
        )
        if spent > budget_s:
            break
    adam_rows = []
    for r in rows[:adam_points]:
        steps, ok, per = adam_steps_and_cost(action(r["N"], r["T"]), 0.008, adam_max_steps)
        row = dict(
            N=r["N"],
            T=r["T"],
            adam_steps=steps,
            adam_converged=ok,
            adam_cpu_s_per_step=per,
            adam_cpu_s_estimated=steps * per,
            ours_cpu_s=r["ours_cpu_s"],
        )
        if len(adam_rows) < adam_timed_points:  # the authors' loop timed to the end, kernel rebuilt
            ref = copy.copy(action(r["N"], r["T"]))
            ref.C = None
            (_, steps_t, _, ok_t), sec_t = cpu(
                lambda ref=ref: ap.adam_raw_solve(ref, lr=0.008, tol=TOL, max_steps=adam_max_steps)
            )
            row.update(adam_cpu_s_timed=sec_t, adam_steps_timed=steps_t, adam_converged_timed=ok_t)
            print(f"images adam (timed) N {r['N']:>5} T {r['T']:<5}: {steps_t} steps, {sec_t:.0f} s",
                  flush=True)
        adam_rows.append(row)
        print(
            f"images adam N {r['N']:>5} T {r['T']:<5}: {steps} steps{'' if ok else ' (cap)'}, "
            f"{per * 1e3:.0f} ms/step -> {steps * per:.0f} s",
            flush=True,
        )
    ours_mean = float(np.mean([r["ours_cpu_s"] for r in rows]))
    adam_mean = float(np.mean([r["adam_cpu_s_estimated"] for r in adam_rows]))
    common = sum(r["adam_cpu_s_estimated"] for r in adam_rows) / sum(r["ours_cpu_s"] for r in adam_rows)
    timed = [r for r in adam_rows if "adam_cpu_s_timed" in r]
    extra = {}
    if timed:
        extra = {
            "adam_timed_over_estimated": sum(r["adam_cpu_s_timed"] for r in timed)
            / sum(r["adam_cpu_s_estimated"] for r in timed),
            "speedup_on_timed_points": sum(r["adam_cpu_s_timed"] for r in timed)
            / sum(r["ours_cpu_s"] for r in timed),
        }
    if inputs == "glyphs":
        extra["glyph_net_training_cpu_s"] = train_s
    return {
        **extra,
        "points": rows,
        "adam_points": adam_rows,
        "setup_cpu_s": setup,
        "n_grid": len(grid),
        "n_ours_measured": len(rows),
        "ours_cpu_s_per_point": ours_mean,
        "ours_cpu_s_grid_estimated": setup + ours_mean * len(grid),
        "ours_unconverged": int(sum(not r["ours_converged"] for r in rows)),
        "adam_cpu_s_per_point": adam_mean,
        "adam_cpu_s_grid_estimated": adam_mean * len(grid),
        "adam_is_lower_bound": any(not r["adam_converged"] for r in adam_rows),
        "speedup_on_common_points": common,
        "speedup_grid_estimated": adam_mean * len(grid) / (setup + ours_mean * len(grid)),
        "P": int(xt.shape[0]),
        "n_paths": 16,
        "n_tok": 48,
        "N0": int(xt.shape[-1]),
        "widths": IMAGE_WIDTHS,
        "temperatures": IMAGE_TEMPS,
        "adam_lr": 0.008,
        "adam_max_steps": adam_max_steps,
        "budget_s": budget_s,
        "sample_seed": seed,
        "inputs": (
            "chapter 4's glyph episodes (quick image profile, N0 = 49) under the attention of a network "
            "trained by gradient descent (training seed 0), labels of the episodes"
            if inputs == "glyphs"
            else "random sequences of the image task's shapes, random heads, labels from a random read-out"
        ),
    }


def bench_images_at(points: list[tuple[int, float]], max_steps: int, inputs: str = "glyphs") -> dict:
    """Both solvers timed to the end at chosen grid points: ours, and the reference with the kernel
    rebuilt every step (capped at ``max_steps``; a capped time is a lower bound)."""
    if inputs == "glyphs":
        xt, y = glyph_image_task()
    else:
        xt, y = random_image_task()
    rows = []
    for N, T in points:
        act = ap.PathAction(xt, y, [4, 4], [N, N, N], T)
        (sol, gmax), ours = cpu(lambda act=act: ap.solve_to_tolerance(act, TOL))
        ref = copy.copy(act)
        ref.C = None
        (_, steps, _, ok), adam = cpu(
            lambda ref=ref: ap.adam_raw_solve(ref, lr=0.008, tol=TOL, max_steps=max_steps)
        )
        rows.append(dict(N=N, T=T, ours_cpu_s=ours, ours_grad_max=gmax, adam_cpu_s_timed=adam,
                         adam_steps=steps, adam_converged=ok))
        print(f"images at N {N} T {T}: ours {ours:.1f} s, adam {adam:.1f} s ({steps} steps"
              f"{'' if ok else ', cap'})", flush=True)
    return {"points": rows, "adam_max_steps": max_steps, "adam_lr": 0.008, "inputs": inputs,
            "P": int(xt.shape[0]), "N0": int(xt.shape[-1])}


def bench_hmc() -> dict:
    pr = ap.markov_problem(ap.MarkovTaskConfig(), 0, "four")
    post = ap.PathPosterior(pr["xi_tr"], pr["y_tr"], [2, 2], [10, 10, 10], 0.01, collapsed=True)
    g = torch.Generator().manual_seed(110)
    res, sec = cpu(
        lambda: ap.hmc(post.log_prob, post.init(4, g), 100, 100, 20, generator=g, stat_fn=post.statistics)
    )
    return {
        "N": 10,
        "chains": 4,
        "warmup": 100,
        "samples": 100,
        "leapfrog": 20,
        "cpu_s": sec,
        "wall_s": res.seconds,
        "ess_min": res.ess_min,
        "ess_per_cpu_s": res.ess_min / sec,
        "accept_rate": res.accept_rate,
        "rhat_max": res.rhat_max,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="markov,images,hmc")
    parser.add_argument("--draws", type=int, default=3, help="random draws of the Markov task")
    parser.add_argument("--adam-points", type=int, default=3)
    parser.add_argument("--adam-max-steps", type=int, default=2500)
    parser.add_argument(
        "--images-budget-s",
        type=float,
        default=900.0,
        help="CPU seconds for our solver on the image grid; points in random order",
    )
    parser.add_argument("--images-inputs", choices=["random", "glyphs"], default="random")
    parser.add_argument(
        "--adam-timed-points", type=int, default=0,
        help="reference points also timed to the end (kernel rebuilt)",
    )
    parser.add_argument(
        "--images-at", default="", help="section images_at: grid points 'N:T,N:T' timed to the end"
    )
    parser.add_argument("--out", default=None, help="write the results (JSON, with provenance) here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    out = {}
    sections = args.sections.split(",")
    if "markov" in sections:
        out["markov"] = bench_markov(args.draws)
        m = out["markov"]
        print(
            f"markov sweep: ours {m['ours_cpu_s']:.1f} s, adam {m['adam_cpu_s']:.1f} s, "
            f"speed-up {m['speedup_sweep']:.1f}"
        )
    if "hmc" in sections:
        out["hmc"] = bench_hmc()
        print(f"hmc: {out['hmc']['ess_per_cpu_s']:.2f} effective samples per CPU second")
    if "images" in sections:
        out["images"] = bench_images(
            args.adam_points, args.adam_max_steps, args.images_budget_s,
            inputs=args.images_inputs, adam_timed_points=args.adam_timed_points,
        )
        m = out["images"]
        print(
            f"image grid: ours {m['ours_cpu_s_grid_estimated']:.0f} s, "
            f"adam {m['adam_cpu_s_grid_estimated']:.0f} s"
            f" (estimated from {m['n_ours_measured']} and {len(m['adam_points'])} points"
            f"{', lower bound' if m['adam_is_lower_bound'] else ''}), "
            f"speed-up {m['speedup_grid_estimated']:.0f}"
        )
    if "images_at" in sections:
        pts = [(int(p.split(":")[0]), float(p.split(":")[1])) for p in args.images_at.split(",") if p]
        out["images_at"] = bench_images_at(pts, args.adam_max_steps, args.images_inputs)
    out["provenance"] = {
        "script": "benchmarks/bench_paths.py",
        "argv": " ".join(sys.argv[1:] if argv is None else argv) or "defaults",
        "attnlib_version": attnlib.__version__,
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
        "threads": 1,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "wall_s": round(time.perf_counter() - t_start, 1),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "note": "CPU seconds on a machine shared with other jobs; ratios are steadier than absolute times",
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2, default=lambda v: v if math.isfinite(v) else None)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
