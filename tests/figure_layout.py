"""Is a drawn matplotlib figure readable? Overlapping text and legends on the data, found from
the renderer's own boxes (display pixels, after `fig.canvas.draw()`).

The rules, each a kind in the problems returned:
  (a) "ticks": the visible tick labels of one axis - major and minor, the ticks inside the
      view limits whose label is not empty - do not overlap each other. A log axis with few
      decades in view labels its minor ticks too ("3x10^1 4x10^1 6x10^1"); those count.
  (b) "legend-data": a legend's box does not overlap the data of any axes (its own, or a
      neighbour's it reaches into): bars and other patches, line segments and markers,
      scatter markers, error-bar lines, as drawn (clipped to their axes). Data are the
      artists placed in data coordinates on both axes; lines and spans across the whole axes
      (axhline, axvline, axvspan: one coordinate in axes units) are references, not data.
  (c) "text": no two texts of the figure overlap, across subplots: titles, axis labels, tick
      labels of different axes, offset texts ("1e6"), figure texts (suptitle, captions) and
      each legend's box as a whole (its entries are not compared among themselves).
  (d) "outside": every text and legend lies inside the figure.
Two shapes overlap when they share more than TOLERANCE_PX in every direction (touching and
anti-aliasing slivers do not count). Rotated texts are compared as rotated rectangles, not as
their axis-aligned boxes.

Use: `layout_problems(fig)` lists what is wrong; `assert_readable(fig)` raises with the list;
`checked_saves()` checks every figure a figure function saves (the state it is saved in).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import matplotlib

matplotlib.use("Agg")
import numpy as np
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.collections import Collection, LineCollection
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text
from matplotlib.transforms import Bbox, Transform

TOLERANCE_PX = 1.0
_NO_MARKER = (None, "None", "none", "", " ")
_NO_LINE = ("None", "none", "", " ")


@dataclass(frozen=True)
class Problem:
    kind: str  # "ticks", "legend-data", "text" or "outside"
    what: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.what}"


@dataclass
class _Shape:
    """A text or legend as drawn: its corners in display pixels and a name for messages."""

    name: str
    corners: np.ndarray  # (4, 2), a rectangle, rotated where the text is
    group: str  # tick labels of one axis share a group; every other shape has its own


# ---- geometry ------------------------------------------------------------------------------


def _box_corners(box: Bbox) -> np.ndarray:
    return np.array([[box.x0, box.y0], [box.x1, box.y0], [box.x1, box.y1], [box.x0, box.y1]])


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    """How deep two convex polygons overlap along their least-overlapping direction
    (separating-axis test); <= 0 when they are apart."""
    depth = math.inf
    for poly in (a, b):
        edges = np.roll(poly, -1, axis=0) - poly
        for dx, dy in edges:
            norm = math.hypot(dx, dy)
            if norm == 0:
                continue
            axis = np.array([-dy, dx]) / norm
            pa, pb = a @ axis, b @ axis
            depth = min(depth, min(pa.max(), pb.max()) - max(pa.min(), pb.min()))
    return depth


def _shrunk(box: Bbox, by: float) -> Bbox | None:
    if box.width <= 2 * by or box.height <= 2 * by:
        return None
    return Bbox.from_extents(box.x0 + by, box.y0 + by, box.x1 - by, box.y1 - by)


def _segment_hits(p: np.ndarray, q: np.ndarray, box: Bbox) -> bool:
    """Whether the segment p-q passes through the box (Liang-Barsky clipping)."""
    t0, t1 = 0.0, 1.0
    d = q - p
    for delta, low, high, start in ((d[0], box.x0, box.x1, p[0]), (d[1], box.y0, box.y1, p[1])):
        if delta == 0:
            if start < low or start > high:
                return False
            continue
        ta, tb = (low - start) / delta, (high - start) / delta
        t0, t1 = max(t0, min(ta, tb)), min(t1, max(ta, tb))
        if t0 > t1:
            return False
    return True


def _polyline_hits(points: np.ndarray, box: Bbox) -> bool:
    finite = np.isfinite(points).all(axis=1)
    return any(
        finite[i] and finite[i + 1] and _segment_hits(points[i], points[i + 1], box)
        for i in range(len(points) - 1)
    )


def _squares_hit(centres: np.ndarray, half_px: np.ndarray, box: Bbox) -> bool:
    centres = np.asarray(centres, float).reshape(-1, 2)
    half = np.broadcast_to(np.asarray(half_px, float), (len(centres),))
    ok = np.isfinite(centres).all(axis=1)
    c, h = centres[ok], half[ok]
    return bool(
        np.any(
            (c[:, 0] + h > box.x0)
            & (c[:, 0] - h < box.x1)
            & (c[:, 1] + h > box.y0)
            & (c[:, 1] - h < box.y1)
        )
    )


# ---- texts ---------------------------------------------------------------------------------


def _drawn_text(text: Text) -> str:
    return text.get_text().strip() if text.get_visible() else ""


def _text_corners(text: Text, renderer) -> np.ndarray:
    """The rectangle the text covers (matplotlib's extent of a wrapped text is as wrapped)."""
    box = text.get_window_extent(renderer)
    angle = text.get_rotation() % 180
    if min(angle, abs(angle - 90), 180 - angle) < 1e-6:
        return _box_corners(box)
    text.set_rotation(0)
    try:
        flat = text.get_window_extent(renderer)
    finally:
        text.set_rotation(angle)
    # rotating about the centre keeps the centre of the axis-aligned box where it was
    cx, cy = (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2
    w, h = flat.width / 2, flat.height / 2
    rad = math.radians(angle)
    rot = np.array([[math.cos(rad), -math.sin(rad)], [math.sin(rad), math.cos(rad)]])
    local = np.array([[-w, -h], [w, -h], [w, h], [-w, h]])
    return local @ rot.T + np.array([cx, cy])


def _short(text: str, limit: int = 40) -> str:
    """The text as a reader sees it ("3x10^1" for mathtext's 3\\times10^{1}), shortened."""
    text = re.sub(r"\\mathdefault\{(.*)\}", r"\1", text).replace("\\times", "x")
    text = re.sub(r"[${}]", "", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _axes_name(fig: Figure, ax: Axes) -> str:
    title = next((t.get_text() for t in _titles(ax) if t.get_text()), "")
    return f"axes {fig.axes.index(ax)}" + (f" ({_short(title, 30)!r})" if title else "")


def _titles(ax: Axes) -> list[Text]:
    return [ax.title, *(getattr(ax, f"_{side}_title", None) for side in ("left", "right"))]


def _in_view(axis: Axis, locs: np.ndarray) -> np.ndarray:
    """Which tick locations lie inside the view limits (matplotlib draws only those)."""
    scale = axis.get_transform()
    lo, hi = sorted(scale.transform(np.asarray(axis.get_view_interval(), float)))
    with np.errstate(all="ignore"):
        at = scale.transform(np.asarray(locs, float))
    slack = 1e-9 * max(abs(hi - lo), 1e-300)
    return np.isfinite(at) & (at >= lo - slack) & (at <= hi + slack)


def _tick_labels(axis: Axis) -> list[Text]:
    labels = []
    for locs, ticks in (
        (axis.get_majorticklocs(), axis.get_major_ticks),
        (axis.get_minorticklocs(), axis.get_minor_ticks),
    ):
        locs = np.asarray(locs)
        if not len(locs):
            continue
        for tick, inside in zip(ticks(len(locs)), _in_view(axis, locs), strict=True):
            if inside and tick.get_visible():
                labels += [t for t in (tick.label1, tick.label2) if _drawn_text(t)]
    return labels


def _shapes(fig: Figure, renderer) -> list[_Shape]:
    shapes: list[_Shape] = []

    def add(text: Text, name: str, group: str | None = None) -> None:
        if _drawn_text(text):
            shapes.append(
                _Shape(name, _text_corners(text, renderer), group or f"{len(shapes)}:{name}")
            )

    for i, text in enumerate(fig.texts):
        add(text, f"figure text {i} {_short(text.get_text())!r}")
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        where = _axes_name(fig, ax)
        for text in _titles(ax):
            if text is not None:
                add(text, f"{where} title {_short(text.get_text())!r}")
        for text in ax.texts:
            add(text, f"{where} text {_short(text.get_text())!r}")
        if not ax.axison:
            continue
        for letter, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            if not axis.get_visible():
                continue
            add(axis.label, f"{where} {letter} label {_short(axis.label.get_text())!r}")
            add(axis.get_offset_text(), f"{where} {letter} offset text")
            for text in _tick_labels(axis):
                add(text, f"{where} {letter} tick label {_short(text.get_text())!r}",
                    f"{where} {letter}")
    for legend in _legends(fig):
        box = legend.get_window_extent(renderer)
        shapes.append(_Shape(_legend_name(fig, legend), _box_corners(box), f"legend {id(legend)}"))
    return shapes


# ---- legends and data ----------------------------------------------------------------------


def _legends(fig: Figure) -> list[Legend]:
    found = [ax.get_legend() for ax in fig.axes if ax.get_visible()]
    return [lg for lg in [*found, *fig.legends] if lg is not None and lg.get_visible()]


def _legend_name(fig: Figure, legend: Legend) -> str:
    title = legend.get_title().get_text()
    owner = legend.axes if legend.axes is not None and legend not in fig.legends else None
    where = _axes_name(fig, owner) if owner is not None else "figure"
    return f"{where} legend" + (f" {title!r}" if title else "")


def _in_data_coords(transform: Transform, ax: Axes) -> bool:
    return transform == ax.transData or transform.contains_branch(ax.transData)


def _line_hits(line: Line2D, ax: Axes, box: Bbox, renderer) -> bool:
    if not _in_data_coords(line.get_transform(), ax):
        return False
    points = line.get_transform().transform(line.get_xydata())
    drawn_line = line.get_linestyle() not in _NO_LINE and line.get_linewidth() > 0
    if drawn_line and _polyline_hits(points, box):
        return True
    if line.get_marker() not in _NO_MARKER and line.get_markersize() > 0:
        half = renderer.points_to_pixels(line.get_markersize()) / 2
        return _squares_hit(points, half, box)
    return False


def _patch_hits(patch: Patch, ax: Axes, box: Bbox) -> bool:
    if not _in_data_coords(patch.get_data_transform(), ax):
        return False
    path = patch.get_transform().transform_path(patch.get_path())
    extent = path.get_extents()
    if min(extent.width, extent.height) < TOLERANCE_PX / 2:
        return False  # a zero-height bar draws nothing
    return path.intersects_bbox(box, filled=patch.get_fill())


def _collection_hits(collection: Collection, ax: Axes, box: Bbox, renderer) -> bool:
    offsets = collection.get_offsets()
    if len(offsets) and _in_data_coords(collection.get_offset_transform(), ax):
        sizes = collection.get_sizes()  # marker areas in points^2
        half = renderer.points_to_pixels(np.sqrt(sizes if len(sizes) else [36.0])) / 2
        centres = collection.get_offset_transform().transform(offsets)
        return _squares_hit(centres, half if len(half) == len(centres) else half[0], box)
    if not _in_data_coords(collection.get_transform(), ax):
        return False
    if isinstance(collection, LineCollection):
        return any(
            _polyline_hits(collection.get_transform().transform(np.asarray(seg)), box)
            for seg in collection.get_segments()
            if len(seg)
        )
    return any(
        collection.get_transform().transform_path(path).intersects_bbox(box, filled=True)
        for path in collection.get_paths()
    )


def _artist_name(kind: str, label: str) -> str:
    return kind if label.startswith("_") else f"{kind} {_short(label)!r}"  # "_child3": unnamed


def _data_hit(ax: Axes, region: Bbox, renderer) -> str | None:
    """The first data artist of the axes drawn inside the region (display pixels)."""
    for line in ax.lines:
        if line.get_visible() and _line_hits(line, ax, region, renderer):
            return _artist_name("line", line.get_label())
    for patch in ax.patches:
        if patch.get_visible() and _patch_hits(patch, ax, region):
            return _artist_name(type(patch).__name__.lower(), patch.get_label())
    for collection in ax.collections:
        if collection.get_visible() and _collection_hits(collection, ax, region, renderer):
            return _artist_name(type(collection).__name__, collection.get_label())
    return None


def _legend_on_data(fig: Figure, legend: Legend, renderer) -> list[Problem]:
    box = legend.get_window_extent(renderer)
    problems = []
    for ax in fig.axes:  # its own axes' data, and any other's it reaches
        if not ax.get_visible():
            continue
        inside = Bbox.intersection(box, ax.bbox)  # data are clipped to their axes
        region = _shrunk(inside, TOLERANCE_PX) if inside is not None else None
        hit = _data_hit(ax, region, renderer) if region is not None else None
        if hit:
            problems.append(
                Problem("legend-data", f"{_legend_name(fig, legend)} covers {_axes_name(fig, ax)}"
                        f" {hit}")
            )
    return problems


# ---- the checks ----------------------------------------------------------------------------


def layout_problems(fig: Figure) -> list[Problem]:
    """Every overlap and every text outside the figure, as the figure draws now."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    shapes = _shapes(fig, renderer)
    problems: list[Problem] = []
    lows = np.array([s.corners.min(axis=0) for s in shapes]).reshape(-1, 2)
    highs = np.array([s.corners.max(axis=0) for s in shapes]).reshape(-1, 2)
    for i, j in itertools.combinations(range(len(shapes)), 2):
        if (np.minimum(highs[i], highs[j]) - np.maximum(lows[i], lows[j]) <= TOLERANCE_PX).any():
            continue  # their axis-aligned boxes are apart: so are they
        a, b = shapes[i], shapes[j]
        depth = _overlap(a.corners, b.corners)
        if depth > TOLERANCE_PX:
            kind = "ticks" if a.group == b.group else "text"
            problems.append(Problem(kind, f"{a.name} overlaps {b.name} by {depth:.0f} px"))
    page = _box_corners(fig.bbox)
    for shape in shapes:
        lo, hi = shape.corners.min(axis=0), shape.corners.max(axis=0)
        if (lo < page[0] - TOLERANCE_PX).any() or (hi > page[2] + TOLERANCE_PX).any():
            problems.append(Problem("outside", f"{shape.name} reaches outside the figure"))
    for legend in _legends(fig):
        problems += _legend_on_data(fig, legend, renderer)
    return problems


def assert_readable(fig: Figure, name: str = "figure") -> None:
    problems = layout_problems(fig)
    assert not problems, f"{name} is not readable:\n  " + "\n  ".join(map(str, problems))


@dataclass
class SavedFigure:
    path: Path
    problems: list[Problem] = field(default_factory=list)


@contextmanager
def checked_saves() -> Iterator[list[SavedFigure]]:
    """Check every figure saved inside the block, as it is saved (its layout done, at the
    dpi it is saved with); yields the list of SavedFigure, filled as figures are saved."""
    saved: list[SavedFigure] = []
    original = Figure.savefig

    def checking_savefig(fig: Figure, fname, *args, **kwargs):
        dpi = kwargs.get("dpi")
        before = fig.dpi
        if isinstance(dpi, int | float):
            fig.set_dpi(dpi)
        try:
            saved.append(SavedFigure(Path(str(fname)), layout_problems(fig)))
        finally:
            fig.set_dpi(before)
        return original(fig, fname, *args, **kwargs)

    with mock.patch.object(Figure, "savefig", checking_savefig):
        yield saved
