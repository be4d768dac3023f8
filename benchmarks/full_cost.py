"""What the `full` profile of each chapter costs on a CPU: probes at full size, scaled.

No full sweep is run. Each probe times one point (or a few steps) of a chapter's `full` sweep at
its full sizes, single-threaded, in CPU seconds (``time.process_time``: on a shared machine CPU
time is steadier than wall time). A probe that would take too long on this CPU is run at two
smaller sizes of its dominant dimension; the growth between them gives the exponent used to
extrapolate to the full size. Tables whose per-point cost was already measured by a committed
benchmark (chapter 3's theory solver, chapter 4's solvers and sampler) take it from
``benchmarks/results/``; the remaining tables are scaled from the measured ``quick`` run
(per-point wall time in the quick build's sweep checkpoints) by the ratio of their sizes.

    .venv/bin/python benchmarks/full_cost.py probe ch1-curves ch1-mc ch1-heads ch3-gd
    .venv/bin/python benchmarks/full_cost.py report      # writes the JSON and the markdown table
    .venv/bin/python benchmarks/full_cost.py table       # the markdown table again, estimates kept
    .venv/bin/python benchmarks/full_cost.py measured 04-attention-paths hmc-theory 21.5
    .venv/bin/python benchmarks/full_cost.py measured 01-random-features samples-to-risk 734 \
        --partial "56 points finished"                      # a run stopped midway: a lower bound

Single tables of a chapter's ``full`` profile are computed and stored by ``attnbook store``
(:mod:`attnbook.tables`; nothing here is needed to build the book or store a table), which writes
the CPU seconds each took (this process and its Dask workers) to
``benchmarks/results/full_runs.json`` (``attnbook.tables.MEASURED``); ``measured`` enters there
the CPU seconds of a table stored by a whole-chapter run. The report's *measured CPU time* column
reads that file.

The last column says, per table, whether a ``full`` run stores it in ``results/`` and, where it
is stored, the measured wall time, device and date from its provenance record (``table`` re-reads
``results/`` without re-estimating, after a ``full`` run has stored new tables).

The report writes ``benchmarks/results/full_cost.json`` (every number, its basis and the
provenance) and ``book/full-cost-table.md`` (the table the reproducibility page includes).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnbook.chapter_params import chapter_sizes  # noqa: E402  (the sizes each chapter writes)
from attnbook.tables import MEASURED, record_measured  # noqa: E402  (CPU seconds of the tables computed)

RESULTS = ROOT / "benchmarks" / "results"
PROBES = RESULTS / "full_cost_probes.json"
OUT = RESULTS / "full_cost.json"
TABLE = ROOT / "book" / "full-cost-table.md"
CHAPTERS = {"00": "00-attention", "01": "01-random-features", "02": "02-provable-mha",
            "03": "03-positional-semantic", "04": "04-attention-paths"}
#: Tables that a chapter's ``full`` run stores in ``results/<chapter>/<table>.csv`` (chapter 3's
#: rows name theirs explicitly).
STORES = {"00": {"neff"},
          "01": {"kernel-mc", "kernel-curves", "samples-to-risk", "max-floor", "heads", "brfa",
                 "crossing", "key-key"},
          "02": {"ablation", "moments", "regimes", "limit", "hard"},
          "03": {"histogram"},  # the other chapter-3 rows say so themselves (stored="yes")
          "04": {"hmc-theory", "two-path", "hmc-sampling", "glyphs-theory", "glyphs-pruning"}}
#: Tables stored in parts (one CSV per width): the table's name, then ``-N<width>``.
PARTS = {("04", "hmc-sampling"): [10, 30, 100]}


def _cpu(fn, **kw) -> float:
    t0 = time.process_time()
    fn(**kw)
    return time.process_time() - t0


# ---- probes ------------------------------------------------------------------------------------
def probe_ch1_curves() -> dict:
    """Chapter 1 kernel learning curves (one seed, N = 8) at n_max = 1024, 2048, 4096."""
    from attnlib import random_qk as rq

    full = chapter_sizes("01-random-features", "full")
    out = {}
    for n_max in (1024, 2048, 4096):
        out[str(n_max)] = _cpu(rq.kernel_curves_point, d=full.d, N=8,
                               n_list=[n for n in full.n_list if n <= n_max], n_val=full.n_val,
                               n_test=full.n_test, seed=0, lambdas=list(full.lambdas))
        print(f"ch1-curves n_max={n_max}: {out[str(n_max)]:.1f} CPU s", flush=True)
    return {"cpu_s_by_n_max": out, "N": 8, "full_n_max": max(full.n_list)}


def probe_ch1_mc() -> dict:
    """Chapter 1 kernel Monte Carlo: the one full point."""
    from attnlib import random_qk as rq

    full = chapter_sizes("01-random-features", "full")
    s = _cpu(rq.kernel_mc_point, d=full.d, N=full.N, sequences=full.mc_sequences,
             heads=list(full.mc_heads), repeats=full.mc_repeats, seed=0)
    print(f"ch1-mc: {s:.1f} CPU s", flush=True)
    return {"cpu_s": s}


def probe_ch1_heads() -> dict:
    """Chapter 1 heads sweep at n_max = 1024 with heads up to 2048 (cost ~ rows x n_max x M)."""
    from attnlib import random_qk as rq

    full = chapter_sizes("01-random-features", "full")
    heads = [m for m in full.heads_list if m <= 2048]
    s = _cpu(rq.heads_sweep_point, d=full.d, N=full.N, n_list=[1024], n_val=full.n_val,
             n_test=full.n_test, seed=0, lambdas=list(full.lambdas), heads_list=heads)
    print(f"ch1-heads: {s:.1f} CPU s", flush=True)
    return {"cpu_s": s, "n_max": 1024, "max_heads": 2048}


def probe_ch1_brfa() -> dict:
    """Chapter 1 RFA/BRFA learning curves (every bias, the full number of heads) at n_max = 1024,
    and the crossing experiment at n_max = 800 (cost ~ rows x n_max x heads)."""
    from attnlib import random_qk as rq

    full = chapter_sizes("01-random-features", "full")
    brfa = _cpu(rq.heads_curves_point, d=full.d, N=full.N, n_list=[n for n in full.n_list if n <= 1024],
                n_val=full.n_val, n_test=full.n_test, seed=0, lambdas=list(full.lambdas),
                heads=full.heads, biases=list(full.bias_list))
    print(f"ch1-brfa: {brfa:.1f} CPU s", flush=True)
    cross = _cpu(rq.heads_curves_point, d=full.small_d, N=full.small_N,
                 n_list=[n for n in full.small_n_list if n <= 800], n_val=full.n_val,
                 n_test=full.n_test, seed=0, lambdas=list(full.lambdas), heads=full.heads,
                 biases=[0.0, full.bias], targets=["geg2"])
    print(f"ch1-crossing: {cross:.1f} CPU s", flush=True)
    return {"brfa_cpu_s": brfa, "brfa_n_max": 1024, "crossing_cpu_s": cross, "crossing_n_max": 800}


#: chapter 3's full profile trains its d = 1000 GD tables one alpha and one block of this many
#: seeds a point (its ``seed_block``)
CH3_SEED_BLOCK = 2


def probe_ch3_gd() -> dict:
    """Chapter 3 GD at d = 1000 as the full profile trains it: one alpha and one block of
    ``CH3_SEED_BLOCK`` seeds, both initialisations; once with the 25 omegas of the phase diagram
    in one batch and once with omega = 0.3 alone. A step's cost is the difference between 25 and
    5 steps, at alpha = 1 and alpha = 2 (it grows faster than n = alpha d: more of the data falls
    out of the cache); the test set (50 000 sequences a seed, once a point) is timed apart."""
    from attnlib import dotattn as da

    seeds = CH3_SEED_BLOCK
    out = {"per_seed_step_s": {}, "seeds": seeds, "d": 1000}
    for key, omegas in (("25 omegas", list(np.round(np.linspace(0.02, 0.5, 25), 4))),
                        ("one omega", [0.3])):
        out["per_seed_step_s"][key] = {}
        for alpha in (1.0, 2.0):
            t = {steps: _cpu(da.train_attention, alphas=[alpha], omegas=omegas,
                             config=da.SimConfig(d=1000, n_seeds=seeds, steps=steps, n_test=500),
                             seed=0, device="cpu") for steps in (5, 25)}
            out["per_seed_step_s"][key][str(alpha)] = (t[25] - t[5]) / 20 / seeds
            print(f"ch3-gd {key}, alpha = {alpha:g}: "
                  f"{out['per_seed_step_s'][key][str(alpha)]:.4f} CPU s a seed and step", flush=True)
    t = {n: _cpu(da.train_attention, alphas=[1.0], omegas=[0.3],
                 config=da.SimConfig(d=1000, n_seeds=seeds, steps=1, n_test=n), seed=0, device="cpu")
         for n in (500, 50_000)}
    out["test_s_per_seed"] = (t[50_000] - t[500]) / seeds
    print(f"ch3-gd test set: {out['test_s_per_seed']:.1f} CPU s a seed", flush=True)
    return out


def ch3_gd_cost(probe: dict, omegas: str, alphas, seeds: int, steps: int = 5000) -> float:
    """CPU seconds of a GD table of chapter 3 from :func:`probe_ch3_gd`: per seed and alpha,
    ``steps`` steps at the probe's cost, interpolated as a power of alpha between alpha = 1 and 2,
    plus the test set."""
    c = probe["per_seed_step_s"][omegas]
    power = math.log2(c["2.0"] / c["1.0"])
    per_seed = sum(steps * c["1.0"] * a**power + probe["test_s_per_seed"] for a in alphas)
    return seeds * per_seed


def probe_ch4_images() -> dict:
    """Chapter 4's image experiment as the full profile runs it: drawing episodes (CPU s per
    1000), one Adam step of one width-512 network on a batch of 128 episodes (the difference
    between 105 and 5 steps, from a pool of 4000), and the theory at the scoring width N = 10
    with P = 600 training episodes (one solve at T = 0.1, on the features of the network after
    those steps). Each is timed after a first call (allocations, kernel selection)."""
    import dataclasses

    from attnlib import glyphs as ag
    from attnlib import paths as ap

    cfg = chapter_sizes("04-attention-paths", "full")["images"]
    glyph_set = ag.make_glyphs(cfg.glyphs)
    g = torch.Generator().manual_seed(0)
    pool = ap.make_episodes(glyph_set, 4000, "train", g, cfg.patch)
    ep_s = _cpu(ap.make_episodes, glyphs=glyph_set, n=4000, split="train", generator=g, patch=cfg.patch) / 4
    t = {}
    for steps in (2, 5, 105):  # the first run warms up
        c = dataclasses.replace(cfg, gd_steps=steps, gd_warmup=0)
        t0 = time.process_time()
        (net,), _ = ap.train_icl_nets(c, pool.x, pool.y, [torch.Generator().manual_seed(1)], [0])
        t[steps] = time.process_time() - t0
    step_s = (t[105] - t[5]) / 100
    print(f"ch4-images: {ep_s:.2f} CPU s per 1000 episodes, {step_s:.3f} CPU s an Adam step", flush=True)
    with torch.no_grad():
        tr, te = pool[: cfg.P], pool[cfg.P: cfg.P + cfg.n_test]
        xt = [ap.scaled_features(ap.path_features(ep.x, [A.double() for A in net.attention(ep.x.float())],
                                                  "mean")) for ep in (tr, te)]
    t0 = time.process_time()
    ap.PathAction(xt[0], tr.y, [4, 4], [10, 10, 10], 0.1).solve(newton_steps=0, gtol=1e-9)
    solve_s = time.process_time() - t0
    print(f"ch4-images: theory at N = 10, P = {cfg.P}: {solve_s:.1f} CPU s", flush=True)
    return {"episodes_s_per_1000": ep_s, "step_s": step_s, "solve_N10_s": solve_s, "width": cfg.width,
            "batch": cfg.gd_batch, "P": cfg.P}


PROBE = {"ch1-curves": probe_ch1_curves, "ch1-mc": probe_ch1_mc, "ch1-heads": probe_ch1_heads,
         "ch1-brfa": probe_ch1_brfa, "ch3-gd": probe_ch3_gd, "ch4-images": probe_ch4_images}


# ---- the measured quick run --------------------------------------------------------------------
def quick_sweeps() -> dict:
    """Per-sweep wall time of the book's quick build (from its sweep checkpoints) and the chapters'
    quick wall times, when the quick build's outputs are on this machine."""
    records_path = ROOT / "book" / "_cache" / "executions.json"
    out = {}
    if not records_path.exists():
        return out
    for slot, rec in json.loads(records_path.read_text()).items():
        if "@" in slot:
            continue
        from attnbook.checkpoints import read_checkpoint, resumable

        sweeps = {}
        for path in resumable(ROOT / "book" / "_cache" / "sweeps" / slot):  # <name>.<key>.jsonl
            done = read_checkpoint(path)
            sweeps[path.stem.rsplit(".", 1)[0]] = {
                "points": len(done), "wall_s": round(sum(r[0]["elapsed_s"] for r in done.values()), 2)}
        out[slot] = {"wall_s": rec.get("wall_s"), "sweeps": sweeps}
    return out


# ---- estimates ---------------------------------------------------------------------------------
def estimates(probes: dict, quick: dict) -> list[dict]:
    """One row per table of the `full` profile: points, basis, estimated CPU seconds (one core)."""

    q1, f1 = (chapter_sizes("01-random-features", p) for p in ("quick", "full"))
    q2, f2 = (chapter_sizes("02-provable-mha", p) for p in ("quick", "full"))
    bench3 = json.loads((RESULTS / "bench_dotattn.json").read_text())
    bench4 = json.loads((RESULTS / "bench_paths.json").read_text())
    rows = []

    def qs(chapter, sweep):
        return quick.get(chapter, {}).get("sweeps", {}).get(sweep, {}).get("wall_s", float("nan"))

    def row(chapter, table, points, basis, cpu_s, gpu, stored=None):
        if stored is None:
            stored = "yes" if table.split(" ")[0] in STORES.get(chapter, ()) else "no"
        rows.append({"chapter": chapter, "table": table, "points": points, "basis": basis,
                     "cpu_s": None if cpu_s is None or math.isnan(cpu_s) else round(cpu_s), "gpu": gpu,
                     "stored": stored})

    # chapter 0: 49 score scales x 400 layers (quick: 25 x 24); cost per point ~ layers
    row("00", "neff", 49, "quick sweep x (49/25 points) x (400/24 layers)",
        qs("00-attention", "neff") * 49 / 25 * 400 / 24, "no (seconds)")

    # chapter 1
    c = probes.get("ch1-curves", {}).get("cpu_s_by_n_max", {})
    if c:
        p = math.log(c["4096"] / c["2048"], 2) if "4096" in c else math.log(c["2048"] / c["1024"], 2)
        last = c.get("4096") or c["2048"]
        n_last = 4096 if "4096" in c else 2048
        t_full = last * (max(f1.n_list) / n_last) ** p
        n_pts = len(f1.N_list) * f1.seeds
        row("01", "kernel-curves", n_pts,
            f"probe, one seed, N = 8, n_max 1024/2048/4096: {c['1024']:.0f}/{c['2048']:.0f}/"
            f"{c.get('4096', float('nan')):.0f} CPU s, growth n^{p:.2f} to n = {max(f1.n_list)}: "
            f"{t_full:.0f} s a point", t_full * n_pts, "yes (n x n eigendecompositions)")
        row("01", "key-key", f1.seeds, "probe: RFA only at n <= 4096, about half the kernel-curves "
            "point at n_max = 4096", f1.seeds * last / 2 * (4096 / n_last) ** p, "yes")
        floor_growth = (max(f1.floor_n_list) / max(q1.floor_n_list)) ** p
        row("01", "max-floor", f1.seeds, f"quick sweep x (n_max {max(f1.floor_n_list)}/"
            f"{max(q1.floor_n_list)})^{p:.2f} x ({f1.seeds}/{q1.seeds} seeds)",
            qs("01-random-features", "max-floor") * floor_growth * f1.seeds / q1.seeds, "yes")
    if "ch1-mc" in probes:
        row("01", "kernel-mc", 1, "probe: the full point", probes["ch1-mc"]["cpu_s"], "yes")
    if "ch1-heads" in probes:
        h = probes["ch1-heads"]
        rows_full, rows_probe = max(f1.n_list) + f1.n_val + f1.n_test, h["n_max"] + f1.n_val + f1.n_test
        scale = rows_full * max(f1.n_list) / (rows_probe * h["n_max"]) * max(f1.heads_list) / h["max_heads"]
        row("01", "heads", f1.seeds, f"probe at n_max = {h['n_max']}, M <= {h['max_heads']}: "
            f"{h['cpu_s']:.0f} CPU s, x{scale:.0f} (kernel accumulation ~ rows x n_max x M); the ridge "
            f"solves at n = {max(f1.n_list)} come on top: a lower bound",
            h["cpu_s"] * scale * f1.seeds, "yes (the finite-head kernel is one large matmul)")
    if "ch1-brfa" in probes:
        b = probes["ch1-brfa"]
        other = f1.n_val + f1.n_test
        sb = (max(f1.n_list) + other) * max(f1.n_list) / ((b["brfa_n_max"] + other) * b["brfa_n_max"])
        row("01", "brfa", f1.brfa_seeds, f"probe at n_max = {b['brfa_n_max']}, every bias, "
            f"{f1.heads} heads: {b['brfa_cpu_s']:.0f} CPU s, x{sb:.0f} (finite-head kernel ~ rows x "
            "n_max); the ridge solves at the largest n come on top: a lower bound",
            b["brfa_cpu_s"] * sb * f1.brfa_seeds, "yes (one large matmul per bias)")
        sc = ((max(f1.small_n_list) + other) * max(f1.small_n_list)
              / ((b["crossing_n_max"] + other) * b["crossing_n_max"]))
        row("01", "crossing", f1.seeds, f"probe at n_max = {b['crossing_n_max']}: "
            f"{b['crossing_cpu_s']:.0f} CPU s, x{sc:.0f} (rows x n_max): a lower bound",
            b["crossing_cpu_s"] * sc * f1.seeds, "yes")
    s2r = ((len(f1.s2r_N_list) + len(f1.s2r_d_list)) / (len(q1.s2r_N_list) + len(q1.s2r_d_list))
           * f1.seeds / q1.seeds * (f1.n_val + f1.n_test) / (q1.n_val + q1.n_test))
    row("01", "samples-to-risk", "about 100", f"quick sweep x {s2r:.0f} (settings, seeds, validation "
        "and test rows); the sample sizes follow the theory, larger at d = 12 and N = 32: a lower bound",
        qs("01-random-features", "samples-to-risk") * s2r, "yes")

    # chapter 2 (point functions defined in the chapter: scaled from the quick run)
    n_abl = len(f2.ablation_heads) * f2.ablation_instances + len(f2.sharp_heads) * f2.sharp_instances
    n_abl_q = len(q2.ablation_heads) * q2.ablation_instances + len(q2.sharp_heads) * q2.sharp_instances
    fa = f2.n_ablation / q2.n_ablation
    row("02", "ablation", n_abl, f"quick sweep per point x {fa:.0f} (examples) x {n_abl}/{n_abl_q} "
        "points; m = 3 (not in quick) costs more: a lower bound",
        qs("02-provable-mha", "ablation") / n_abl_q * fa * n_abl, "little (small tensors, many steps)")
    n_hard = len(f2.hard_heads) * len(f2.hard_dims) + 1
    n_hard_q = len(q2.hard_heads) * len(q2.hard_dims) + 1
    fh = f2.adam_seeds / q2.adam_seeds * f2.adam_max_steps / q2.adam_max_steps
    row("02", "hard", n_hard, f"quick sweep per point x {fh:.0f} (seeds x step cap; runs stop "
        "earlier on a plateau: an upper bound)", qs("02-provable-mha", "hard") / n_hard_q * fh * n_hard,
        "yes (batched Adam)")
    row("02", "moments", 21, f"quick sweep x {f2.moment_samples // q2.moment_samples} (samples)",
        qs("02-provable-mha", "moments") * f2.moment_samples / q2.moment_samples, "no (minutes)")
    row("02", "regimes", 18, f"quick sweep x {f2.regime_samples // q2.regime_samples} (samples)",
        qs("02-provable-mha", "regimes") * f2.regime_samples / q2.regime_samples, "no (minutes)")
    n_lim = len(f2.limit_dims) * len(f2.limit_ks) * f2.limit_instances
    n_lim_q = len(q2.limit_dims) * len(q2.limit_ks) * q2.limit_instances
    fl = 2 ** (max(f2.limit_ks) * (max(f2.limit_dims) - max(q2.limit_dims)))
    row("02", "limit", n_lim, f"quick sweep x {n_lim}/{n_lim_q} points x {fl} (2^(k d) inputs "
        "enumerated at the largest d): an upper bound",
        qs("02-provable-mha", "limit") * n_lim / n_lim_q * fl, "no")

    # chapter 3
    per_theory = bench3["ours_cpu_s_per_point_single"]
    n_grid = 25 * 25 * 2
    row("03", "theory-grid (the 25 x 25 (alpha, omega) grid, both branches)", n_grid,
        f"committed solver benchmark: {per_theory:.2f} CPU s a point (single); points that fail "
        "are solved again from their neighbours: a lower bound", n_grid * per_theory,
        "no (scalar fixed points)", stored="yes")
    for kind, what in (("c", "multi-start, rules up to 14^4"), ("l", "semantic branch, rules up to 12^4")):
        quick_s = qs("03-positional-semantic", f"alpha-{kind}")
        row("03", f"alpha-{kind} (25 omegas; {what})", 25,
            "quick sweep (12 omegas) x 25/12; the full bracketing tolerance is half as wide and "
            "the rules larger: a lower bound", quick_s * 25 / 12, "no", stored="yes")
    if "ch3-gd" in probes and "per_seed_step_s" in probes["ch3-gd"]:
        g = probes["ch3-gd"]
        c25, c1 = g["per_seed_step_s"]["25 omegas"], g["per_seed_step_s"]["one omega"]
        alphas = np.linspace(0.01, 2.0, 25)
        probe_txt = (f"probe: GD at d = 1000, one alpha, a block of {g['seeds']} seeds, both inits: "
                     f"{{:.3f}} CPU s a seed and step at alpha = 1, {{:.3f}} at alpha = 2 (a power of "
                     f"alpha between), x 5000 steps x 24 seeds x the 25 alphas, + the test set "
                     f"({g['test_s_per_seed']:.1f} s a seed and alpha)")
        phase = ch3_gd_cost(g, "25 omegas", alphas, 24)
        row("03", "gd-phase (d = 1000, 25 x 25 grid, 24 seeds)", 25 * 25 * 2 * 24,
            probe_txt.format(c25["1.0"], c25["2.0"]).replace("GD at", "GD, 25 omegas at"),
            phase, "yes (dense d = 1000 products)", stored="yes")
        one = ch3_gd_cost(g, "one omega", alphas, 24)
        row("03", "gd-omega03 (d = 1000, 25 alphas, 24 seeds)", 25 * 2 * 24,
            probe_txt.format(c1["1.0"], c1["2.0"]).replace("GD at", "GD, omega = 0.3 alone, at"),
            one, "yes", stored="yes")
        ds = np.array([10, 15, 23, 36, 56, 87, 135, 209, 323, 500])
        row("03", "gd-scaling (10 d <= 500, 70 seeds)", len(ds) * 70 * 2,
            "gd-omega03 probe per seed and step at alpha = 1.5 x (d/1000)^2 x 5000 steps x 70 seeds",
            c1["1.0"] * 1.5 ** math.log2(c1["2.0"] / c1["1.0"]) * 5000 * 70
            * float(((ds / 1000) ** 2).sum()), "yes", stored="yes")
        # four (sigma, lambda) settings beside the main one (gd-phase's omega = 0.3 column), each
        # like gd-omega03; lambda = 0.001 runs 0.01 / 0.001 = 10x the steps
        row("03", "gd-sigma-lambda (d = 1000, 4 settings of sigma or lambda, 25 alphas, 24 seeds)",
            4 * 25 * 2 * 24, "gd-omega03 x (3 settings + 10 x the steps at lambda = 0.001)",
            one * 13, "yes", stored="yes")
        row("03", "gd-generic (d = 100 runs; alternative-A grid at d = 1000, 25 x 25, 24 seeds)", 4,
            "gd-phase (the alternative-A grid has its sizes) + quick sweep x 140/8 seeds x "
            "2500/1500 steps (the d = 100 runs)",
            phase + qs("03-positional-semantic", "gd-generic") * 140 / 8 * 2500 / 1500, "yes",
            stored="yes")
    row("03", "histogram (trained attention layer)", 2, "quick sweep x 2.5 (sequences) x 2.5 "
        "(epochs), batch 32 instead of 128: a lower bound",
        qs("03-positional-semantic", "histogram") * 2.5 * 2.5, "yes")

    # chapter 4
    mk = bench4["markov"]
    per_markov = mk["ours_cpu_s"] / len(mk["points"])
    row("04", "hmc-theory (Markov task theory, 10 draws x 7 widths)", 70,
        f"committed solver benchmark: {per_markov:.2f} CPU s a point", 70 * per_markov, "no")
    row("04", "two-path", 70, "as hmc-theory", 70 * per_markov, "no")
    hm = bench4["hmc"]
    fh4 = (8 / hm["chains"]) * (1000 / (hm["warmup"] + hm["samples"])) * (30 / hm["leapfrog"])
    row("04", "hmc-sampling (N = 10, 30, 100)", 3, f"committed HMC benchmark at N = 10: "
        f"{hm['cpu_s']:.1f} CPU s, x {fh4:.0f} (chains, iterations, leapfrog steps) x sum(N)/10, "
        "assuming cost ~ N", hm["cpu_s"] * fh4 * (10 + 30 + 100) / 10, "yes")
    im = bench4["images"]
    row("04", "glyphs-theory (10 widths x 10 temperatures, and the GP limit; one network)", im["n_grid"],
        f"committed benchmark: {im['ours_cpu_s_per_point']:.0f} CPU s a point at P = {im['P']}",
        im["ours_cpu_s_grid_estimated"], "yes")

    icfg = chapter_sizes("04-attention-paths", "full")["images"]
    seeds, temps, n_prune = 8, 10, 10_000  # the chapter's full profile
    if "ch4-images" in probes:
        pi = probes["ch4-images"]
        n_ep = icfg.n_pool + icfg.n_val + icfg.n_test + n_prune
        per_seed = icfg.gd_steps * pi["step_s"] + temps * pi["solve_N10_s"]
        row("04", "glyphs-pruning (8 seeds: train, theory at N = 10, prune)", seeds,
            f"probe: {pi['step_s']:.2f} CPU s an Adam step of one width-{icfg.width} network (batch "
            f"{icfg.gd_batch}) x {icfg.gd_steps} steps + {temps} solves at N = 10 ({pi['solve_N10_s']:.0f} "
            f"CPU s each), a seed, x {seeds} seeds; + {n_ep} episodes drawn "
            f"({pi['episodes_s_per_1000']:.2f} CPU s per 1000); the pruning itself is not timed. The "
            "probe solves on the features of a network after 105 steps, slower to solve than a trained "
            f"network's{_solves_of_trained_net()}: the solves are overestimated",
            seeds * per_seed + n_ep / 1000 * pi["episodes_s_per_1000"], "yes (network training)")
    return rows


def _solves_of_trained_net() -> str:
    """The stored glyphs-theory run's CPU time of the 10 solves at N = 10, as a phrase ("" if none)."""
    import pandas as pd

    path = ROOT / "results" / "04-attention-paths" / "glyphs-theory.csv"
    if not path.exists():
        return ""
    df = pd.read_csv(path, usecols=["N", "elapsed_s"])
    at10 = df[df.N == 10].elapsed_s
    return f" (the stored glyphs-theory run: {at10.sum():.0f} CPU s for its {len(at10)} solves at N = 10)"


def _fmt_s(s) -> str:
    if s is None:
        return "?"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def stored_record(r: dict) -> dict | None:
    """Provenance record of the stored ``results/<chapter>/<table>.csv`` of row ``r``, if any."""
    from attnbook.store import StoredResultError, load_result

    path = ROOT / "results" / CHAPTERS.get(r["chapter"], "?") / f"{r['table'].split(' ')[0]}.csv"
    if not path.exists():
        return None
    try:
        return load_result(path)[1]
    except StoredResultError:
        return None


def stored_cell(r: dict) -> str:
    """The last column: stored (measured wall time, device, date), not yet, or not stored by design."""
    parts = PARTS.get((r["chapter"], r["table"].split(" ")[0]))
    if parts:
        name = r["table"].split(" ")[0]
        recs = {N: stored_record(dict(r, table=f"{name}-N{N}")) for N in parts}
        done = [N for N, rec in recs.items() if rec is not None]
        if not done:
            return "not yet"
        first = recs[done[0]]
        wall = sum(recs[N]["wall_s"] for N in done)
        rest = [N for N in parts if N not in done]
        return (f"**stored** at N = {', '.join(map(str, done))} (one table per width): runs took "
                f"{_fmt_s(wall)} wall time ({first['device_name']}, {first['date']})"
                + (f"; N = {', '.join(map(str, rest))} not yet" if rest else ""))
    rec = stored_record(r)
    if rec is not None:  # "partial": a table stored with fewer points than the full profile's
        return (f"**stored**: run took {_fmt_s(rec['wall_s'])} wall time ({rec['device_name']}, "
                f"{rec['date']})" + (f"; {rec['partial']}" if rec.get("partial") else "")
                + (f"; in parts: {rec['resumed']}" if rec.get("resumed") else ""))
    if r["stored"].startswith("yes"):
        return "not yet" + r["stored"][3:]
    return r["stored"]


def measured_cells(r: dict, measured: dict) -> str:
    """Measured CPU time of the table (all its parts: a table stored per width sums them)."""
    chapter = CHAPTERS.get(r["chapter"], "?")
    name = r["table"].split(" ")[0]
    parts = {k: v for k, v in measured.get(chapter, {}).items() if k == name or k.startswith(name + "-N")}
    if not parts:  # stored by a run whose CPU time was not recorded, or not run
        return "not recorded" if stored_cell(r).startswith("**stored**") else "not run"
    total = sum(v["cpu_s"] for v in parts.values())
    what = f" ({len(parts)} of its parts)" if len(parts) > 1 else ""
    if any(v.get("partial") for v in parts.values()):  # a run stopped before the table was done
        return f"at least {_fmt_s(total)} (stopped: {'; '.join(v['partial'] for v in parts.values())})"
    untimed = [v["untimed"] for v in parts.values() if v.get("untimed")]  # an earlier run's points
    if untimed:
        return f"at least {_fmt_s(total)} ({'; '.join(untimed)})"
    return f"{_fmt_s(total)}{what}"


def markdown(rows: list[dict], meta: dict) -> str:
    measured = json.loads(MEASURED.read_text()) if MEASURED.exists() else {}
    lines = ["| chapter | table | points | estimated CPU time (1 core) | basis | GPU worthwhile "
             "| measured CPU time | stored in `results/` |",
             "| --- | --- | ---: | ---: | --- | --- | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['chapter']} | {r['table']} | {r['points']} | {_fmt_s(r['cpu_s'])} | "
                     f"{r['basis']} | {r['gpu']} | {measured_cells(r, measured)} | {stored_cell(r)} |")
    by = {}
    for r in rows:
        by[r["chapter"]] = by.get(r["chapter"], 0) + (r["cpu_s"] or 0)
    total = " · ".join(f"chapter {c}: {_fmt_s(s)}" for c, s in by.items())
    dates = meta.get("probe_dates") or {}
    when = (", ".join(f"{', '.join(sorted(n for n, d in dates.items() if d == day))} on {day}"
                      for day in sorted(set(dates.values()))) if dates else meta["date"])
    lines += ["", f"Sum of the estimates per chapter: {total}. Probes measured on "
              f"{meta['machine']} ({meta['cpu_count']} cores, shared with other jobs), one thread: "
              f"{when}; `benchmarks/full_cost.py` (numbers and bases in "
              "`benchmarks/results/full_cost.json`)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe")
    p.add_argument("names", nargs="+", choices=sorted(PROBE))
    sub.add_parser("report")
    sub.add_parser("table")
    me = sub.add_parser("measured")
    me.add_argument("chapter")
    me.add_argument("name")
    me.add_argument("cpu_s", type=float)
    me.add_argument("--wall-s", type=float, default=None)
    me.add_argument("--how", default="whole-chapter full run (serial), CPU of its process tree "
                                     "sampled every 10 s")
    me.add_argument("--partial", default=None,
                    help="the run was stopped before the table was done: what it finished")
    args = parser.parse_args(argv)
    if args.cmd == "measured":
        record_measured(args.chapter, args.name, args.cpu_s, args.wall_s, args.how, args.partial)
        return 0
    torch.set_num_threads(1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    probes = json.loads(PROBES.read_text()) if PROBES.exists() else {}
    if args.cmd == "probe":
        for name in args.names:
            probes[name] = {**PROBE[name](),
                            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")}
            PROBES.write_text(json.dumps(probes, indent=1) + "\n")
        return 0
    if args.cmd == "table":  # re-render from the committed estimates and what results/ holds now
        saved = json.loads(OUT.read_text())
        for r in saved["rows"]:
            if r["table"].split(" ")[0] in STORES.get(r["chapter"], ()):
                r["stored"] = "yes"
        OUT.write_text(json.dumps(saved, indent=1) + "\n")
        TABLE.write_text(markdown(saved["rows"], saved["provenance"]))
        print(TABLE.read_text())
        return 0
    from attnbook.runs import git_commit
    from attnlib import __version__

    # the quick build's sweep times: from this machine's build, else those the last report used
    quick, quick_from = quick_sweeps(), "the quick build on the same machine"
    if not quick and OUT.exists():
        quick, quick_from = json.loads(OUT.read_text())["quick"], "the quick build the last report read"
    meta = {"script": "benchmarks/full_cost.py", "attnlib_version": __version__, "git_commit": git_commit(),
            "torch_version": torch.__version__, "threads": 1, "machine": platform.machine(),
            "cpu_count": os.cpu_count(), "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
            # each probe's own date (probes before dates were kept: the date of the report they last
            # entered, 2026-12-02)
            "probe_dates": {name: pr.get("date", "2026-12-02") for name, pr in probes.items()},
            "note": "CPU seconds of single-threaded probes on a machine shared with other jobs; quick "
                    f"sweep times are wall seconds of {quick_from}"}
    rows = estimates(probes, quick)
    OUT.write_text(json.dumps({"rows": rows, "probes": probes, "quick": quick, "provenance": meta},
                              indent=1) + "\n")
    TABLE.write_text(markdown(rows, meta))
    print(TABLE.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
