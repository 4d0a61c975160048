"""Live reward plot of a search run: reward per evaluation and best speedup so far, one curve per branch.

Points arrive in batches (the GUI drains a buffer on a 30 Hz timer), tens of thousands per run, so:
per-branch data live in numpy arrays that grow by doubling; curves are redrawn (one setData each)
at most every REDRAW_MS, and pyqtgraph clips to the view and peak-downsamples to about one sample
per pixel. `flush()` draws pending data at once.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QStackedLayout, QVBoxLayout, QWidget

# Readable on the light theme, distinct for the first few branches (the common case).
PALETTE = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#1b7c83", "#bc4c00", "#6e7781")
RAW_ALPHA = 60
AXIS_COLOR = "#57606a"
TEXT_COLOR = "#1f2328"
REDRAW_MS = 250                 # curves are redrawn at most 4 times a second
DRAWN_SAMPLES_PER_PIXEL = 1.0   # peak downsampling keeps each pixel column's min and max
LEFT_AXIS_WIDTH = 56  # equal widths keep the two x axes aligned
EMPTY_HINT = "Run a search to see rewards here"

Point = tuple[int, int, float, "float | None"]


class _GrowingArray:
    """A float64 array with amortised O(1) appends (capacity doubles when full)."""

    def __init__(self, capacity: int = 256) -> None:
        self._data = np.empty(capacity, dtype=np.float64)
        self._size = 0

    def extend(self, values: np.ndarray) -> None:
        end = self._size + len(values)
        if end > len(self._data):
            grown = np.empty(max(end, 2 * len(self._data)), dtype=np.float64)
            grown[: self._size] = self._data[: self._size]
            self._data = grown
        self._data[self._size:end] = values
        self._size = end

    def view(self) -> np.ndarray:
        """The held values (a view: valid until the next extend)."""
        return self._data[: self._size]

    def __len__(self) -> int:
        return self._size


class _Curve(pg.PlotDataItem):
    """A curve whose auto-range bounds are those of all its data, not of what is drawn.

    pyqtgraph measures a PlotDataItem by its displayed data, which clip-to-view and the auto
    peak-downsampling derive from the view range; auto-range then sets the range from those bounds.
    With streaming data the two chased each other: every paint changed the range, every range a
    new downsampling, and the endless repaints starved every timer of the GUI thread (a
    50,000-candidate stream never finished). Bounds of the full data do not depend on the view."""

    def __init__(self, *args: object, **kwargs: object):
        super().__init__(*args, **kwargs)
        self._bounds: tuple[tuple[float | None, float | None], ...] = ((None, None), (None, None))

    def set_full_data(self, x: np.ndarray, y: np.ndarray) -> None:
        finite = y[np.isfinite(y)]
        if len(x) and len(finite):
            self._bounds = ((float(x[0]), float(x[-1])), (float(finite.min()), float(finite.max())))
        else:
            self._bounds = ((None, None), (None, None))
        self.setData(x, y, skipFiniteCheck=True)

    def dataBounds(self, ax: int, frac: float = 1.0, orthoRange: object = None):  # noqa: N802 (Qt naming)
        return self._bounds[ax] if self.isVisible() else (None, None)


@dataclass(eq=False)        # hashed by identity: the set of curves waiting to be drawn
class _Branch:
    raw_curve: _Curve
    ema_curve: _Curve
    speed_curve: _Curve
    x: _GrowingArray = field(default_factory=_GrowingArray)
    reward: _GrowingArray = field(default_factory=_GrowingArray)
    ema: _GrowingArray = field(default_factory=_GrowingArray)
    best_ms: _GrowingArray = field(default_factory=_GrowingArray)   # running min of median_ms; inf before any
    speedup: _GrowingArray = field(default_factory=_GrowingArray)   # eager_ms / best_ms; NaN where unknown
    last_ema: float | None = None
    first_known: int | None = None   # index of the first point with a finite best_ms


def _finite(value: float | None) -> float | None:
    """value as a float when it is a finite number, else None."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _styled_plot(y_label: str) -> pg.PlotWidget:
    widget = pg.PlotWidget(background="w")
    plot = widget.getPlotItem()
    plot.setLabel("left", y_label, color=TEXT_COLOR)
    plot.showGrid(x=True, y=True, alpha=0.15)
    for name in ("left", "bottom"):
        # Grid lines at the major ticks only: painted in software, the minor levels' translucent
        # lines took half of every redraw (about 8 of 16 ms on the CI-class machine).
        plot.getAxis(name).setStyle(maxTickLevel=0)
    plot.setDownsampling(auto=True, mode="peak")
    plot.setClipToView(True)
    for name in ("left", "bottom"):
        axis = plot.getAxis(name)
        axis.setPen(AXIS_COLOR)
        axis.setTextPen(AXIS_COLOR)
    plot.getAxis("left").setWidth(LEFT_AXIS_WIDTH)
    return widget


class RewardPlot(QWidget):
    """Reward (raw and EMA-smoothed) and best speedup vs eager per evaluation, one colour per branch."""

    def __init__(self, parent: QWidget | None = None, smoothing: float = 0.1) -> None:
        super().__init__(parent)
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"RewardPlot smoothing must be in (0, 1], got {smoothing!r}.")
        self._smoothing = float(smoothing)
        self._eager_ms: float | None = None
        self._branches: dict[int, _Branch] = {}
        self._names: dict[int, str] = {}
        self._stale: set[_Branch] = set()        # data added since the curves were last drawn
        self._last_draw = 0.0
        self._redraw_timer = QTimer(self)
        self._redraw_timer.setSingleShot(True)
        self._redraw_timer.timeout.connect(self.flush)

        self._reward_widget = _styled_plot("reward")
        self._speed_widget = _styled_plot("best speedup vs eager (×)")
        self._reward_plot = self._reward_widget.getPlotItem()
        self._speed_plot = self._speed_widget.getPlotItem()
        # The speed panel follows the reward panel's x range one way. pyqtgraph's setXLink lines
        # the views up through their screen geometry in both directions; with auto-range, axis
        # relayouts and streaming data that fed back into an endless repaint that starved every
        # timer (the event-loop drain included): a 50,000-candidate stream never finished.
        self._speed_plot.enableAutoRange(x=False)
        self._speed_plot.setMouseEnabled(x=False, y=True)
        self._reward_plot.getViewBox().sigXRangeChanged.connect(self._follow_x)
        self._speed_plot.setLabel("bottom", "evaluation", color=TEXT_COLOR)
        self._reward_plot.setLabel("bottom", "evaluation", color=TEXT_COLOR)
        self._legend = self._reward_plot.addLegend(offset=(10, 10), labelTextColor=TEXT_COLOR,
                                                   brush=pg.mkBrush(255, 255, 255, 200))

        plots = QWidget()
        plots_layout = QVBoxLayout(plots)
        plots_layout.setContentsMargins(0, 0, 0, 0)
        plots_layout.setSpacing(0)
        plots_layout.addWidget(self._reward_widget, 3)
        plots_layout.addWidget(self._speed_widget, 2)

        self._hint = QLabel(EMPTY_HINT)
        self._hint.setObjectName("emptyHint")
        self._hint.setAlignment(Qt.AlignmentFlag.AlignCenter)

        self._stack = QStackedLayout(self)
        self._stack.addWidget(self._hint)
        self._stack.addWidget(plots)
        self._update_speed_panel()

    # ----- public API -----

    def add_points(self, points: list[Point]) -> None:
        """(branch_id, evaluation_number, reward, median_ms or None) per evaluated candidate, in order.

        Points whose reward is None/NaN are skipped. A median that is None, NaN or <= 0 leaves the
        branch's best-so-far unchanged."""
        batches: dict[int, tuple[list[float], list[float], list[float]]] = {}
        for branch_id, evaluation, reward, median_ms in points:
            reward = _finite(reward)
            if reward is None:
                continue
            median = _finite(median_ms)
            xs, rewards, medians = batches.setdefault(int(branch_id), ([], [], []))
            xs.append(float(evaluation))
            rewards.append(reward)
            medians.append(median if median is not None and median > 0 else math.nan)
        for branch_id, (xs, rewards, medians) in batches.items():
            self._extend_branch(self._branch(branch_id), xs, rewards, medians)
        if batches:
            self._stack.setCurrentIndex(1)
            self._schedule_draw()

    def set_branch_name(self, branch_id: int, name: str) -> None:
        self._names[int(branch_id)] = name
        branch = self._branches.get(int(branch_id))
        if branch is not None:
            label = self._legend.getLabel(branch.ema_curve)
            if label is not None:
                label.setText(name)

    def set_eager_ms(self, eager_ms: float | None) -> None:
        """Eager PyTorch median in ms; enables the speedup panel. A non-positive value counts as unknown."""
        eager = _finite(eager_ms)
        self._eager_ms = eager if eager is not None and eager > 0 else None
        for branch in self._branches.values():
            speedup = branch.speedup.view()
            speedup[:] = self._speedups(branch.best_ms.view())
            self._draw_speedup(branch)
        self._update_speed_panel()

    def clear(self) -> None:
        """Forget every point and branch (names too); smoothing and the eager time stay."""
        for branch in self._branches.values():
            self._reward_plot.removeItem(branch.raw_curve)
            self._reward_plot.removeItem(branch.ema_curve)
            self._speed_plot.removeItem(branch.speed_curve)
        self._branches.clear()
        self._names.clear()
        self._stale.clear()
        self._redraw_timer.stop()
        self._stack.setCurrentIndex(0)

    def point_count(self) -> int:
        return sum(len(branch.x) for branch in self._branches.values())

    def branch_ids(self) -> list[int]:
        return list(self._branches)

    def smoothed(self, branch_id: int) -> np.ndarray:
        """The EMA of the branch's rewards, one value per held point (a copy)."""
        return self._branches[branch_id].ema.view().copy()

    def best_speedup(self, branch_id: int) -> np.ndarray:
        """eager_ms / best median so far, one value per held point (a copy); NaN before the branch's
        first valid median, or everywhere while eager_ms is unknown."""
        return self._branches[branch_id].speedup.view().copy()

    # ----- internals -----

    def _branch(self, branch_id: int) -> _Branch:
        branch = self._branches.get(branch_id)
        if branch is None:
            color = pg.mkColor(PALETTE[branch_id % len(PALETTE)])
            faint = pg.mkColor(color)
            faint.setAlpha(RAW_ALPHA)
            name = self._names.get(branch_id, f"branch {branch_id}")
            # The raw line is added first so the smoothed one is drawn over it; only the latter gets a legend entry.
            # Thin cosmetic pens and about one sample per pixel: the raster engine's cost grows with
            # line width and with drawn points, and a 50,000-point run repaints ~30 times a second.
            raw = _Curve(pen=pg.mkPen(faint, width=1), skipFiniteCheck=True)
            ema = _Curve(pen=pg.mkPen(color, width=1), name=name, skipFiniteCheck=True)
            speed = _Curve(pen=pg.mkPen(color, width=1), stepMode="left", skipFiniteCheck=True)
            for plot, item in ((self._reward_plot, raw), (self._reward_plot, ema), (self._speed_plot, speed)):
                plot.addItem(item)       # takes the plot's clip-to-view and downsampling settings
                item.opts["autoDownsampleFactor"] = DRAWN_SAMPLES_PER_PIXEL
            branch = _Branch(raw, ema, speed)
            self._branches[branch_id] = branch
        return branch

    def _extend_branch(self, branch: _Branch, xs: list[float], rewards: list[float], medians: list[float]) -> None:
        # EMA carried on from the branch's last value: O(batch), never recomputed over the history.
        alpha = self._smoothing
        last = branch.last_ema
        ema = np.empty(len(rewards), dtype=np.float64)
        for i, reward in enumerate(rewards):
            last = reward if last is None else last + alpha * (reward - last)
            ema[i] = last
        branch.last_ema = last

        # Running min of the medians, seeded with the branch's best so far; fmin ignores NaN (no update).
        previous = branch.best_ms.view()[-1] if len(branch.best_ms) else math.inf
        best = np.fmin.accumulate(np.concatenate(([previous], medians)))[1:]
        if branch.first_known is None:
            known = np.isfinite(best)
            if known.any():
                branch.first_known = len(branch.best_ms) + int(np.argmax(known))

        branch.x.extend(np.asarray(xs, dtype=np.float64))
        branch.reward.extend(np.asarray(rewards, dtype=np.float64))
        branch.ema.extend(ema)
        branch.best_ms.extend(best)
        branch.speedup.extend(self._speedups(best))

        self._stale.add(branch)

    def _draw(self, branch: _Branch) -> None:
        x = branch.x.view()
        branch.raw_curve.set_full_data(x, branch.reward.view())
        branch.ema_curve.set_full_data(x, branch.ema.view())
        self._draw_speedup(branch)

    def _schedule_draw(self) -> None:
        """Draw now if the last drawing is REDRAW_MS old, else once when it is: a repaint of
        tens of thousands of points costs tens of ms, and data may arrive 30 times a second."""
        if not self._stale or self._redraw_timer.isActive():
            return
        since = (time.monotonic() - self._last_draw) * 1e3
        if since >= REDRAW_MS:
            self.flush()
        else:
            self._redraw_timer.start(int(REDRAW_MS - since) + 1)

    def flush(self) -> None:
        """Draw every curve whose data changed since it was last drawn."""
        self._redraw_timer.stop()
        stale, self._stale = self._stale, set()
        for branch in stale:
            self._draw(branch)
        # Settle the auto-range and the view transform now, not in the paint: pyqtgraph does both in
        # prepareForPaint, and the new transform queues another auto-range and paint, so a redraw
        # took two or three back-to-back paints per panel. This way it takes one.
        for plot in (self._reward_plot, self._speed_plot):
            view = plot.getViewBox()
            view.updateAutoRange()
            view.updateMatrix()
        self._last_draw = time.monotonic()

    def _speedups(self, best_ms: np.ndarray) -> np.ndarray:
        if self._eager_ms is None:
            return np.full(len(best_ms), math.nan)
        with np.errstate(divide="ignore"):
            speedup = self._eager_ms / best_ms
        speedup[~np.isfinite(best_ms)] = math.nan
        return speedup

    def _draw_speedup(self, branch: _Branch) -> None:
        # Only the finite tail is drawn (best-so-far never becomes unknown again), so the finite check can be skipped.
        if self._eager_ms is None or branch.first_known is None:
            branch.speed_curve.set_full_data(np.empty(0), np.empty(0))
            return
        start = branch.first_known
        branch.speed_curve.set_full_data(branch.x.view()[start:], branch.speedup.view()[start:])

    def _follow_x(self, _view: object, x_range: tuple[float, float]) -> None:
        current = self._speed_plot.getViewBox().viewRange()[0]
        if abs(current[0] - x_range[0]) > 1e-9 or abs(current[1] - x_range[1]) > 1e-9:
            self._speed_plot.setXRange(x_range[0], x_range[1], padding=0)

    def _update_speed_panel(self) -> None:
        shown = self._eager_ms is not None
        self._speed_widget.setVisible(shown)
        # The x label sits under whichever panel is lowest.
        self._reward_plot.getAxis("bottom").showLabel(not shown)
