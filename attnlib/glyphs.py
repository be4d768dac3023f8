"""Glyphs: a generated Omniglot-like data set of hand-drawn-looking characters from many scripts.

Chapter 4 (``04-attention-paths``) uses it as a stand-in for Omniglot (Lake et al. 2015), which
cannot be downloaded when the book is built. Characters are rendered at run time from the fonts
that matplotlib ships (the DejaVu and STIX families), one *class* per code point, grouped into
*scripts* (alphabets: Latin, Greek, Cyrillic, Armenian, Georgian, Hebrew, Arabic, N'Ko, Canadian
syllabics, Tifinagh, ... and several symbol blocks). Each class is drawn by ``n_drawers``
simulated "drawers": the font's glyph, fitted into the frame, goes through a random stroke-width
change, a random affine map (rotation, shear, anisotropic scale, shift), a smooth random elastic
displacement field and pixel noise,

.. math:: I_{c,d}(u) = \\operatorname{clip}\\big(g_{c}^{(s_d)}(A_d u + b_d + \\delta_d(u))
          + \\epsilon_d(u),\\ 0,\\ 1\\big),

where ``g_c^{(s)}`` is the glyph of class ``c`` with its strokes thickened or thinned by ``s``,
``delta_d`` a displacement field interpolated from a coarse Gaussian grid and ``epsilon_d``
Gaussian noise. Scripts, not classes, are split into meta-train and meta-test, as Omniglot
splits its alphabets into background and evaluation sets.

Glyphs the font does not really contain (no entry in the character map, or a blank bitmap) are
rejected, and so are glyphs that look like an earlier class (correlation of the fitted,
undistorted images above ``duplicate_corr``: Latin ``A``, Greek ``Alpha`` and Cyrillic ``A`` are
one class, not three).

Everything is deterministic given the config (the seed included) and the installed fonts. The
rendered set is cached as a compressed ``.npz`` under ``$ATTNLIB_CACHE_DIR`` (default
``~/.cache/attnlib``, or ``$XDG_CACHE_HOME/attnlib``); the file is written atomically.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ._validation import ParameterError, check_float, check_int

__all__ = [
    "SCRIPTS",
    "GlyphConfig",
    "GlyphSet",
    "make_glyphs",
    "glyph_cache_dir",
    "render_base_glyphs",
    "distort",
]

_FORMAT_VERSION = 1

# script name -> (font file, code-point ranges). Letters and syllables of real scripts first,
# then symbol blocks that play the part of invented alphabets.
SCRIPTS: dict[str, tuple[str, tuple[tuple[int, int], ...]]] = {
    "Latin": ("DejaVuSans.ttf", ((0x41, 0x5A), (0x61, 0x7A))),
    "Greek": ("DejaVuSans.ttf", ((0x391, 0x3A9), (0x3B1, 0x3C9))),
    "Cyrillic": ("DejaVuSans.ttf", ((0x410, 0x44F), (0x402, 0x40F))),
    "Armenian": ("DejaVuSans.ttf", ((0x531, 0x556), (0x561, 0x586))),
    "Georgian": ("DejaVuSans.ttf", ((0x10D0, 0x10FA),)),
    "Hebrew": ("DejaVuSans.ttf", ((0x5D0, 0x5EA),)),
    "Arabic": ("DejaVuSans.ttf", ((0x621, 0x64A),)),
    "NKo": ("DejaVuSans.ttf", ((0x7CA, 0x7EA),)),
    "Canadian syllabics": ("DejaVuSans.ttf", ((0x1401, 0x166C),)),
    "Ogham": ("DejaVuSans.ttf", ((0x1681, 0x169A),)),
    "Tifinagh": ("DejaVuSans.ttf", ((0x2D30, 0x2D65),)),
    "Lisu": ("DejaVuSans.ttf", ((0xA4D0, 0xA4F7),)),
    "Lao": ("DejaVuSans.ttf", ((0xE81, 0xEAE),)),
    "Yijing": ("DejaVuSans.ttf", ((0x4DC0, 0x4DFF),)),
    "IPA": ("DejaVuSans.ttf", ((0x250, 0x2AF),)),
    "Letterlike": ("DejaVuSans.ttf", ((0x2100, 0x214F),)),
    "Arrows": ("DejaVuSans.ttf", ((0x2190, 0x21FF),)),
    "Math operators": ("DejaVuSans.ttf", ((0x2200, 0x22FF),)),
    "Technical": ("DejaVuSans.ttf", ((0x2300, 0x23FF),)),
    "Box drawing": ("DejaVuSans.ttf", ((0x2500, 0x257F),)),
    "Geometric": ("DejaVuSans.ttf", ((0x25A0, 0x25FF),)),
    "Symbols": ("DejaVuSans.ttf", ((0x2600, 0x26FF),)),
    "Dingbats": ("DejaVuSans.ttf", ((0x2700, 0x27BF),)),
    "Supplemental arrows": ("STIXGeneral.ttf", ((0x2900, 0x297F),)),
    "Math symbols B": ("STIXGeneral.ttf", ((0x2980, 0x29FF),)),
}


@dataclass(frozen=True)
class GlyphConfig:
    """Parameters of the generated glyph set (all lengths in pixels unless stated).

    ``size``: output side (28-32 like Omniglot's usual down-sampling); ``n_drawers``: drawings per
    class; ``max_per_script``: classes kept per script (a seeded choice among the valid glyphs);
    ``test_fraction``: share of scripts held out as meta-test; ``stroke``: largest stroke-width
    change, in output pixels; ``rotation``: largest rotation (degrees); ``shear``, ``scale``:
    largest shear and relative scale change; ``shift``: largest shift as a fraction of the
    frame; ``elastic``: RMS elastic displacement as a fraction of the frame, on a
    ``elastic_grid`` x ``elastic_grid`` grid of control points; ``noise``: pixel-noise standard
    deviation; ``duplicate_corr``: correlation above which a glyph counts as a duplicate.
    """

    size: int = 28
    n_drawers: int = 20
    max_per_script: int = 40
    test_fraction: float = 0.4
    stroke: float = 0.7
    rotation: float = 12.0
    shear: float = 0.15
    scale: float = 0.12
    shift: float = 0.06
    elastic: float = 0.025
    elastic_grid: int = 4
    noise: float = 0.05
    duplicate_corr: float = 0.95
    seed: int = 0

    def __post_init__(self):
        check_int("size", self.size, minimum=16, maximum=128)
        check_int("n_drawers", self.n_drawers, minimum=2)
        check_int("max_per_script", self.max_per_script, minimum=2)
        check_float("test_fraction", self.test_fraction, minimum=0.0, maximum=1.0, strict=True)
        check_float("stroke", self.stroke, minimum=0.0, maximum=3.0)
        check_float("rotation", self.rotation, minimum=0.0, maximum=90.0)
        check_float("shear", self.shear, minimum=0.0, maximum=1.0)
        check_float("scale", self.scale, minimum=0.0, maximum=0.5)
        check_float("shift", self.shift, minimum=0.0, maximum=0.3)
        check_float("elastic", self.elastic, minimum=0.0, maximum=0.2)
        check_int("elastic_grid", self.elastic_grid, minimum=2, maximum=16)
        check_float("noise", self.noise, minimum=0.0, maximum=1.0)
        check_float("duplicate_corr", self.duplicate_corr, minimum=0.0, maximum=1.0, strict=True)
        check_int("seed", self.seed, minimum=0)


@dataclass(frozen=True)
class GlyphSet:
    """A rendered glyph set.

    ``images``: (n_classes, n_drawers, size, size) float32 in [0, 1] (ink = 1);
    ``codepoints``: (n_classes,) int; ``script``: (n_classes,) int index into ``scripts``;
    ``meta_test``: (n_classes,) bool, True for classes of held-out scripts.
    """

    images: np.ndarray
    codepoints: np.ndarray
    script: np.ndarray
    scripts: tuple
    meta_test: np.ndarray
    config: GlyphConfig

    @property
    def n_classes(self) -> int:
        return int(self.images.shape[0])

    def classes(self, split: str) -> np.ndarray:
        """Indices of the classes of ``split`` = ``"train"`` (meta-train) or ``"test"``."""
        if split not in ("train", "test"):
            raise ParameterError(f"split={split!r} is not allowed; choose one of: 'train', 'test'")
        return np.flatnonzero(self.meta_test if split == "test" else ~self.meta_test)

    def script_names(self, split: str) -> list[str]:
        """Names of the scripts of ``split``, in order of first appearance."""
        idx = self.classes(split)
        return [self.scripts[i] for i in dict.fromkeys(self.script[idx].tolist())]


def glyph_cache_dir() -> Path:
    """Where rendered glyph sets are cached: ``$ATTNLIB_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/attnlib``, else ``~/.cache/attnlib``."""
    env = os.environ.get("ATTNLIB_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attnlib"


def _font_path(name: str) -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name


def _fit(bitmap: np.ndarray, side: int, fill: float = 0.8) -> np.ndarray:
    """Centre a glyph bitmap in a ``side`` x ``side`` frame, its longer side ``fill * side``."""
    h, w = bitmap.shape
    m = max(h, w)
    sq = np.zeros((m, m), dtype=np.float32)
    sq[(m - h) // 2 : (m - h) // 2 + h, (m - w) // 2 : (m - w) // 2 + w] = bitmap
    inner = max(2, int(round(fill * side)))
    t = torch.from_numpy(sq)[None, None]
    t = F.interpolate(t, size=(inner, inner), mode="bilinear", antialias=True, align_corners=False)
    out = np.zeros((side, side), dtype=np.float32)
    o = (side - inner) // 2
    out[o : o + inner, o : o + inner] = t[0, 0].clamp(0, 1).numpy()
    return out


def render_base_glyphs(side: int = 64, scripts: dict | None = None) -> tuple[np.ndarray, list, list]:
    """Undistorted glyphs of every code point the fonts really contain, fitted to the frame.

    Returns ``(images (n, side, side) float32, codepoints, script names)``. A code point is kept
    when the font's character map has it and its bitmap has at least 12 inked pixels at 64 pt.
    """
    from matplotlib.ft2font import FT2Font, LoadFlags

    scripts = SCRIPTS if scripts is None else scripts
    fonts: dict[str, FT2Font] = {}
    imgs, cps, names = [], [], []
    for name, (font, ranges) in scripts.items():
        if font not in fonts:
            fonts[font] = FT2Font(str(_font_path(font)))
        ft = fonts[font]
        cmap = ft.get_charmap()
        for lo, hi in ranges:
            for cp in range(lo, hi + 1):
                if cp not in cmap:
                    continue
                ft.clear()
                ft.set_size(64, 72)
                ft.set_text(chr(cp), 0.0, flags=LoadFlags.NO_HINTING)
                ft.draw_glyphs_to_bitmap(antialiased=True)
                bm = np.asarray(ft.get_image(), dtype=np.float32) / 255.0
                rows, cols = np.nonzero(bm > 0.5)
                if rows.size < 12:
                    continue  # blank or nearly blank glyph
                bm = bm[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
                imgs.append(_fit(bm, side))
                cps.append(cp)
                names.append(name)
    return np.stack(imgs), cps, names


def _dedup(imgs: np.ndarray, threshold: float) -> np.ndarray:
    """Indices of glyphs kept: each glyph is dropped if it correlates above ``threshold`` with
    an earlier kept one (images compared at 16 x 16 after blurring)."""
    t = torch.from_numpy(imgs)[:, None]
    small = F.adaptive_avg_pool2d(t, 16).reshape(len(imgs), -1).double()
    z = small - small.mean(1, keepdim=True)
    z = z / z.norm(dim=1, keepdim=True).clamp_min(1e-12)
    corr = (z @ z.T).numpy()
    keep: list[int] = []
    for i in range(len(imgs)):
        if not keep or corr[i, keep].max() < threshold:
            keep.append(i)
    return np.array(keep)


def distort(
    base: torch.Tensor, cfg: GlyphConfig, generator: torch.Generator, chunk: int = 128
) -> torch.Tensor:
    """Random drawings of each base glyph (vectorised over glyphs and drawers).

    base : (n, S, S) float in [0, 1], undistorted glyphs on a frame of side ``S``.
    Returns (n, n_drawers, size, size) float32. Each drawing samples the blurred glyph once
    (``grid_sample``, at twice the output resolution) through the drawer's affine map plus
    elastic field, sets its stroke width by thresholding the blurred ink at a random level
    (a lower level gives thicker strokes), is average-pooled to ``size`` and gets pixel noise.
    """
    n, S = base.shape[0], base.shape[-1]
    D, out = cfg.n_drawers, cfg.size
    hi = 2 * out
    g = generator

    def u(*shape):  # uniform in [-1, 1]
        return 2.0 * torch.rand(*shape, generator=g) - 1.0

    # all random numbers first, in a fixed order (the result does not depend on ``chunk``)
    ang = math.radians(cfg.rotation) * u(n, D)
    sh = cfg.shear * u(n, D)
    sx = 1.0 + cfg.scale * u(n, D)
    sy = 1.0 + cfg.scale * u(n, D)
    b = 2.0 * cfg.shift * u(n, D, 2)
    m = cfg.elastic_grid
    ctrl = torch.randn(n, D, 2, m, m, generator=g) * (2.0 * cfg.elastic)
    # stroke: threshold level of the blurred ink; 0.5 keeps the font's width, and a shift of
    # ``stroke`` output pixels moves the edge by about that much (edge slope ~ 1/(2 sigma))
    sigma = 0.5 * S / out  # blur of half an output pixel, in base pixels
    edge = 1.0 / (2.5 * sigma * out / S)  # ink change per output pixel across an edge
    level = (0.5 + cfg.stroke * edge * 0.5 * u(n, D)).clamp(0.1, 0.9)
    noise = cfg.noise * torch.randn(n, D, out, out, generator=g)

    # Gaussian blur of the base glyphs, as two matrix products (separable)
    pos = torch.arange(S, dtype=torch.float32)
    Kb = torch.exp(-0.5 * ((pos[:, None] - pos[None, :]) / sigma) ** 2)
    Kb = Kb / Kb.sum(0, keepdim=True)
    x = torch.einsum("ys,nst,tx->nyx", Kb.T, base.float(), Kb)[:, None]
    # elastic field: smooth (Gaussian radial basis) interpolation of the control points
    ctr = torch.linspace(0.0, hi - 1.0, m)
    Bf = torch.exp(-0.5 * ((torch.arange(hi)[None, :] - ctr[:, None]) / (hi / (m - 1))) ** 2)
    Bf = Bf / Bf.sum(0, keepdim=True)  # (m, hi)

    c, si = torch.cos(ang), torch.sin(ang)
    A = torch.stack([torch.stack([c, c * sh - si], -1), torch.stack([si, si * sh + c], -1)], -2)
    A = A / torch.stack([sx, sy], -1)[..., None, :]  # rotation @ shear @ diag(1/sx, 1/sy)
    lin = torch.linspace(-1.0, 1.0, hi)
    gy, gx = torch.meshgrid(lin, lin, indexing="ij")
    pts = torch.stack([gx, gy], -1)  # (hi, hi, 2) as (x, y)
    result = torch.empty(n, D, out, out)
    for i in range(0, n, chunk):
        j = min(n, i + chunk)
        k = j - i
        grid = torch.einsum("ndij,yxj->ndyxi", A[i:j], pts) + b[i:j, :, None, None, :]
        grid = grid + torch.einsum("ndcij,iy,jx->ndyxc", ctrl[i:j], Bf, Bf)
        # drawers stacked along the output rows: the glyph is not copied per drawer
        img = F.grid_sample(
            x[i:j], grid.reshape(k, D * hi, hi, 2), mode="bilinear", padding_mode="zeros", align_corners=False
        )
        img = img.reshape(k, D, hi, hi)
        lv = level[i:j, :, None, None]  # ramp from 0 (no ink) to 1 (full ink) around the level
        img = ((img - lv) / (2.0 * torch.minimum(lv, 1.0 - lv)) + 0.5).clamp(0.0, 1.0)
        result[i:j] = F.avg_pool2d(img, 2)
    return (result + noise).clamp(0.0, 1.0)


def _cache_key(cfg: GlyphConfig) -> str:
    fonts = sorted({f for f, _ in SCRIPTS.values()})
    spec = {
        "config": asdict(cfg),
        "version": _FORMAT_VERSION,
        "scripts": {k: [v[0], [list(r) for r in v[1]]] for k, v in SCRIPTS.items()},
        "fonts": {f: os.path.getsize(_font_path(f)) for f in fonts},
        "torch": torch.__version__.split("+")[0],
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _build(cfg: GlyphConfig) -> dict:
    rng = np.random.default_rng(cfg.seed)
    base, cps, names = render_base_glyphs(side=64)
    keep = _dedup(base, cfg.duplicate_corr)
    base, cps, names = base[keep], np.array(cps)[keep], [names[i] for i in keep]
    # at most max_per_script classes per script, a seeded choice kept in code-point order
    script_list = list(dict.fromkeys(names))
    by_script = {s: [i for i, n in enumerate(names) if n == s] for s in script_list}
    chosen = []
    for s in script_list:
        idx = by_script[s]
        if len(idx) > cfg.max_per_script:
            idx = sorted(rng.choice(idx, size=cfg.max_per_script, replace=False).tolist())
        chosen.extend(idx)
    chosen = np.array(chosen)
    base, cps = base[chosen], cps[chosen]
    script = np.array([script_list.index(names[i]) for i in chosen])
    # split scripts (not classes) into meta-train and meta-test
    n_test = max(1, int(round(cfg.test_fraction * len(script_list))))
    test_scripts = rng.permutation(len(script_list))[:n_test]
    meta_test = np.isin(script, test_scripts)
    gen = torch.Generator().manual_seed(cfg.seed)
    imgs = distort(torch.from_numpy(base), cfg, gen)
    return {
        "images": np.round(imgs.numpy() * 255.0).astype(np.uint8),
        "codepoints": cps.astype(np.int64),
        "script": script.astype(np.int64),
        "scripts": np.array(script_list),
        "meta_test": meta_test,
    }


def make_glyphs(cfg: GlyphConfig | None = None, cache: bool = True) -> GlyphSet:
    """Render (or load from the cache) the glyph set of ``cfg``.

    The first call renders and writes ``glyphs-<key>.npz`` into :func:`glyph_cache_dir`; later
    calls with the same config, fonts and format load it. Images are stored as uint8.
    """
    cfg = GlyphConfig() if cfg is None else cfg
    if not isinstance(cfg, GlyphConfig):
        raise ParameterError(f"cfg={cfg!r} must be a GlyphConfig")
    path = glyph_cache_dir() / f"glyphs-{_cache_key(cfg)}.npz"
    data = None
    if cache and path.exists():
        try:
            with np.load(path, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}
        except (OSError, ValueError):  # a damaged file: render again
            data = None
    if data is None:
        data = _build(cfg)
        if cache:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
            try:
                with os.fdopen(fd, "wb") as fh:
                    np.savez_compressed(fh, **data)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    return GlyphSet(
        images=data["images"].astype(np.float32) / 255.0,
        codepoints=data["codepoints"],
        script=data["script"],
        scripts=tuple(str(s) for s in data["scripts"]),
        meta_test=data["meta_test"].astype(bool),
        config=cfg,
    )
