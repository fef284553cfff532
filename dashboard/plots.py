"""Server-side charts: matplotlib's object API (no pyplot state) rendered to SVG.

The pages embed them with ``<img>``, so an SVG can never run script in the page, and text is
drawn as glyph paths (``svg.fonttype = path``). Each function takes the plain data built by
``dashboard.views`` and returns the SVG bytes.
"""
from __future__ import annotations

import io
import math
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg", force=False)  # never a GUI backend in a server
from matplotlib.backends.backend_svg import FigureCanvasSVG  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from dashboard.views import dag_layers  # noqa: E402

_LOCK = threading.Lock()  # rcParams are process-global; render one figure at a time
_RC = {"svg.fonttype": "path", "svg.hashsalt": "dpbert-dashboard", "font.size": 9,
       "axes.spines.top": False, "axes.spines.right": False}
STATE_COLOURS = {"COMPLETE": "#d4edda", "CACHED": "#d6e4f0", "RUNNING": "#fff3cd", "NEW": "#fff3cd",
                 "FAILED": "#f8d7da", "CANCELLED": "#e2e3e5"}
DP_COLOUR, NON_DP_COLOUR = "#1f77b4", "#d62728"


def _svg(fig: Figure) -> bytes:
    buf = io.BytesIO()
    FigureCanvasSVG(fig).print_svg(buf, metadata={"Date": None})
    return buf.getvalue()


def _render(draw, figsize: Tuple[float, float]) -> bytes:
    with _LOCK, matplotlib.rc_context(_RC):
        fig = Figure(figsize=figsize, layout="constrained")
        draw(fig)
        return _svg(fig)


def dag_svg(nodes: Sequence[Dict[str, Any]], edges: Sequence[Tuple[str, str]]) -> bytes:
    """Components as boxes (coloured by state, with their duration), layered left to right."""
    ids = [n["id"] for n in nodes]
    layer = dag_layers(ids, edges)
    columns: Dict[int, List[Dict[str, Any]]] = {}
    for n in nodes:
        columns.setdefault(layer[n["id"]], []).append(n)
    n_cols = max(columns) + 1 if columns else 1
    n_rows = max((len(c) for c in columns.values()), default=1)
    box_w, box_h, gap_x, gap_y = 1.9, 0.62, 0.7, 0.3
    width, height = n_cols * (box_w + gap_x) - gap_x + 0.2, n_rows * (box_h + gap_y) - gap_y + 0.2
    where: Dict[str, Tuple[float, float]] = {}

    def draw(fig: Figure):
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, width)
        ax.set_ylim(0, height)
        ax.axis("off")
        for col, members in columns.items():
            offset = (n_rows - len(members)) * (box_h + gap_y) / 2
            for row, n in enumerate(members):
                x = 0.1 + col * (box_w + gap_x)
                y = height - 0.1 - offset - row * (box_h + gap_y) - box_h
                where.setdefault(n["id"], (x, y))
                ax.add_patch(FancyBboxPatch((x, y), box_w, box_h, boxstyle="round,pad=0,rounding_size=0.08",
                                            facecolor=STATE_COLOURS.get(n["state"], "#eeeeee"),
                                            edgecolor="#555555", linewidth=0.8))
                ax.text(x + box_w / 2, y + box_h * 0.64, n["id"], ha="center", va="center",
                        fontsize=8.5, fontweight="bold")
                ax.text(x + box_w / 2, y + box_h * 0.27, f"{n['state']} · {n['duration']}", ha="center",
                        va="center", fontsize=7.5, color="#333333")
        for a, b in edges:
            if a in where and b in where:
                (xa, ya), (xb, yb) = where[a], where[b]
                span = layer[b] - layer[a]  # an edge skipping layers bends around the boxes between
                ax.add_patch(FancyArrowPatch((xa + box_w, ya + box_h / 2), (xb, yb + box_h / 2),
                                             arrowstyle="-|>", mutation_scale=10, color="#555555",
                                             linewidth=0.9, shrinkA=1, shrinkB=1,
                                             connectionstyle=f"arc3,rad={0.0 if span <= 1 else -0.12}"))

    with _LOCK, matplotlib.rc_context(_RC):
        fig = Figure(figsize=(width, height))
        draw(fig)
        return _svg(fig)


def budget_svg(bars: Sequence[Tuple[str, float]], budget: Optional[float]) -> bytes:
    """ε of each ledger line as a horizontal bar, the configured budget as a line."""
    def draw(fig: Figure):
        ax = fig.subplots()
        labels = [label for label, _ in bars][::-1]
        values = [v for _, v in bars][::-1]
        finite = [v for v in values if math.isfinite(v)]
        top = max(finite + ([budget] if budget is not None and math.isfinite(budget) else []) + [1e-9])
        shown = [v if math.isfinite(v) else top * 1.05 for v in values]
        colours = ["#9e9e9e" if not math.isfinite(v) else
                   ("#d62728" if budget is not None and v > budget else DP_COLOUR) for v in values]
        ax.barh(range(len(values)), shown, color=colours, height=0.6)
        for i, v in enumerate(values):
            ax.text(shown[i], i, "  ∞ (non-private)" if not math.isfinite(v) else f"  {v:.3g}",
                    va="center", fontsize=8)
        ax.set_yticks(range(len(values)), labels)
        if budget is not None and math.isfinite(budget):
            ax.axvline(budget, color="#d62728", linestyle="--", linewidth=1)
            ax.text(budget, len(values) - 0.45, f" budget {budget:.3g}", color="#d62728", fontsize=8, va="bottom")
        ax.set_xlim(0, top * 1.3)
        ax.set_xlabel("ε")

    return _render(draw, (6.0, 0.45 * len(bars) + 1.2))


def loss_svg(curves: Dict[str, List[float]], non_dp_final: Optional[float] = None,
             steps: Optional[Dict[str, List[int]]] = None) -> bytes:
    """Loss per training step; ``steps[name]``: the true step of each point (the stored curve is
    subsampled, a resumed run starts at its checkpoint), else points are plotted at 1, 2, ..."""
    def draw(fig: Figure):
        ax = fig.subplots()
        for name, values in sorted(curves.items()):
            xs = (steps or {}).get(name)
            if not xs or len(xs) != len(values):
                xs = range(1, len(values) + 1)
            ax.plot(xs, values, marker="." if len(values) <= 50 else None,
                    color=DP_COLOUR if name == "DP" else NON_DP_COLOUR, label=name)
        if non_dp_final is not None and math.isfinite(non_dp_final) and "non-DP" not in curves:
            ax.axhline(non_dp_final, color=NON_DP_COLOUR, linestyle="--", linewidth=1, label="non-DP final")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("training step")
        ax.set_ylabel("MLM loss")
        ax.grid(alpha=0.3)
        ax.legend(frameon=False)

    return _render(draw, (6.0, 3.4))


def loss_comparison_svg(curves: Dict[str, List[float]], non_dp_final: Optional[float] = None,
                        steps: Optional[Dict[str, List[int]]] = None) -> bytes:
    """The DP curve with the non-private baseline's (operator-only)."""
    return loss_svg(curves, non_dp_final, steps)


def exposure_svg(groups: Sequence[Dict[str, Any]]) -> bytes:
    """Canary exposure against occurrences in the training data, DP vs non-DP model."""
    placed = [g for g in groups if g["occurrences"] is not None]
    held_out = [g for g in groups if g["occurrences"] is None]

    def draw(fig: Figure):
        ax = fig.subplots()
        # Without occurrences (e.g. only held-out canaries) the groups go side by side.
        series, categorical = (placed, False) if placed else (held_out, True)
        xs = [g["occurrences"] for g in placed] if placed else list(range(1, len(held_out) + 1))
        for key, name, colour, marker in (("dp", "DP model", DP_COLOUR, "o"),
                                          ("non_dp", "non-DP model", NON_DP_COLOUR, "s")):
            pts = [(x, g[key]) for x, g in zip(xs, series) if g[key] is not None and math.isfinite(g[key])]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=colour, label=name)
            if placed:
                for g in held_out:
                    if g[key] is not None and math.isfinite(g[key]):
                        ax.axhline(g[key], color=colour, linestyle=":", linewidth=1,
                                   label=f"{name}, held-out canaries")
        if categorical:
            ax.set_xticks(xs, [g["label"] for g in series])
            ax.set_xlabel("canary group")
        else:
            positive = [x for x in xs if x > 0]
            if positive and len(positive) == len(xs) and max(xs) / min(xs) >= 10:
                ax.set_xscale("log")
            ax.set_xlabel("occurrences of the canary in the training data")
        ax.set_ylabel("exposure (bits)")
        ax.grid(alpha=0.3)
        ax.legend(frameon=False, fontsize=8)

    return _render(draw, (6.0, 3.6))


def roc_svg(attacks: Sequence[Dict[str, Any]]) -> bytes:
    def draw(fig: Figure):
        ax = fig.subplots()
        ax.plot([0, 1], [0, 1], color="#999999", linestyle="--", linewidth=1, label="chance")
        for a in attacks:
            if a["fpr"]:
                auc = dict(a["stats"]).get("auc")
                ax.plot(a["fpr"], a["tpr"], label=a["name"] + (f" (AUC {auc})" if auc else ""))
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.grid(alpha=0.3)
        ax.legend(frameon=False, fontsize=8, loc="lower right")

    return _render(draw, (4.6, 4.4))


def dataset_svg(points: Sequence[Dict[str, Any]], budget: Optional[float]) -> bytes:
    """The dataset's composed ε after each ledger entry (by time): the figure the gate enforces,
    the Rényi filter's and the PLD one beside it, and the pinned budget as a line."""
    def draw(fig: Figure):
        ax = fig.subplots()
        xs = list(range(1, len(points) + 1))
        for key, label, style in (("spent", "composed ε (what the gate enforces)", dict(color=DP_COLOUR, linewidth=2)),
                                  ("rdp", "Rényi filter (committed orders)", dict(color="#ff7f0e", linestyle=":")),
                                  ("pld", "PLD", dict(color="#2ca02c", linestyle="-."))):
            ys = [p.get(key) for p in points]
            if any(y is not None and math.isfinite(y) for y in ys):
                ax.step(xs, [math.nan if y is None or not math.isfinite(y) else y for y in ys], where="post",
                        marker="o", markersize=3, label=label, **style)
        if budget is not None and math.isfinite(budget):
            ax.axhline(budget, color="#d62728", linestyle="--", linewidth=1, label=f"pinned budget {budget:.4g}")
        ax.set_xticks(xs, [p.get("label", "") for p in points], rotation=30, ha="right", fontsize=7)
        ax.set_xlabel("ledger entry (by time)")
        ax.set_ylabel("ε")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="lower right")

    return _render(draw, (7.0, 3.6))
