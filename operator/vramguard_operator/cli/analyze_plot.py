"""Pictures of a verdict for ``vramguard analyze``: a terminal sparkline of the
floor, and ``--plot out.png`` (matplotlib, the optional ``plot`` extra:
``pip install 'vramguard[plot]'``).

The plot has one panel per series, ``WIDTH_PX`` by ``PANEL_HEIGHT_PX`` pixels
each, stacked: the samples, the floor points the detector read (the slow path's
5-minute floor, and the fast path's fine floor when it has a recent rise), the
fitted rise with its 95% confidence band, restarts; the axes fit the data in
units that suit its span (seconds, minutes or hours; bytes, MiB or GiB), and
the limit (``--limit``, else the log's memory.total) and the projection to it
are notes, never a stretched axis. matplotlib is imported only when a plot is
asked for.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vramguard_api.leak import Analysis, LeakResult
from vramguard_api.leak.judgement import Judgement, Verdict
from vramguard_api.units import format_bytes, format_seconds
from vramguard_operator.cli.memlog import Series

WIDTH_PX, PANEL_HEIGHT_PX, DPI = 1000, 500, 100
SPARK_WIDTH = 48
_BARS = "▁▂▃▄▅▆▇█"
_ASCII_BARS = "_.-~=+*#"
GIB = 2**30
HOUR = 3600.0


class PlotError(Exception):
    """The plot cannot be drawn: matplotlib is missing, or the file cannot be written."""


def sparkline(t: np.ndarray, v: np.ndarray, width: int = SPARK_WIDTH) -> str:
    """The floor of a series in ``width`` characters: the lowest sample of each of
    ``width`` equal spans of time, scaled from the lowest to the highest, with
    the range. Empty for fewer than 2 samples. Block characters when the terminal
    can print them, ASCII otherwise."""
    keep = v > 0  # zeros are failed reads or no process
    t, v = t[keep], v[keep]
    if t.size < 2 or t[-1] <= t[0]:
        return ""
    bins = np.minimum(((t - t[0]) / (t[-1] - t[0]) * width).astype(int), width - 1)
    floor = np.full(width, np.nan)
    np.fmin.at(floor, bins, v)
    lo, hi = float(np.nanmin(floor)), float(np.nanmax(floor))
    bars = _BARS if _can_print(_BARS) else _ASCII_BARS
    scale = (len(bars) - 1) / (hi - lo) if hi > lo else 0.0
    chars = "".join(" " if math.isnan(f) else bars[int(round((f - lo) * scale))] for f in floor)
    return f"{chars}  {format_bytes(lo)} .. {format_bytes(hi)}"


def _can_print(text: str) -> bool:
    try:
        text.encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def plot(judged: Sequence[tuple[Series, Analysis, LeakResult, Judgement]], path: Path, limit: int | None) -> None:
    """Draw every series' verdict into the PNG file ``path``, one panel each.

    Raises ``PlotError`` when matplotlib is not installed, the file cannot be written,
    or its name does not end in a format matplotlib writes (``.png``, ``.svg``, ``.pdf``...)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("needs matplotlib: pip install 'vramguard[plot]'") from None
    panels = max(1, len(judged))
    fig, axes = plt.subplots(panels, 1, figsize=(WIDTH_PX / DPI, PANEL_HEIGHT_PX * panels / DPI), squeeze=False)
    try:
        for ax, (series, a, result, j) in zip(axes[:, 0], judged, strict=False):
            own = limit if limit is not None else (None if series.total is None else int(series.total))
            _panel(ax, series, a, result, j, own)
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
    except OSError as err:
        raise PlotError(f"cannot write {path}: {err}") from None
    except ValueError as err:  # matplotlib: "Format 'txt' is not supported (supported formats: ...)"
        raise PlotError(f"{path}: {err}; name the file .png, .svg or .pdf") from None
    finally:
        plt.close(fig)


# Units of the axes, chosen by the span they show: (seconds per unit, name), (bytes per unit, name).
_TIME_UNITS = ((HOUR, "hours"), (60.0, "minutes"), (1.0, "seconds"))
_BYTE_UNITS = ((GIB, "GiB"), (2.0**20, "MiB"), (1.0, "bytes"))


def axis_units(span_s: float, peak_bytes: float) -> tuple[tuple[float, str], tuple[float, str]]:
    """The time unit that shows ``span_s`` as at least 2 of it (hours for 2 h and more, minutes
    for 2 min and more, else seconds) and the byte unit that shows ``peak_bytes`` as at least 1."""
    time = next((u for u in _TIME_UNITS if span_s >= 2 * u[0]), _TIME_UNITS[-1])
    size = next((u for u in _BYTE_UNITS if peak_bytes >= u[0]), _BYTE_UNITS[-1])
    return time, size


def _panel(ax, series: Series, a: Analysis, result: LeakResult, j: Judgement, limit: int | None) -> None:
    """One series: samples (visible points), floors, fit and band, restarts; the axes fit the
    data, and the limit and the projection to it are annotations, never a stretched axis."""
    span = float(a.t[-1] - a.t[0]) if a.t.size >= 2 else 0.0
    (t_unit, t_name), (b_unit, b_name) = axis_units(span, float(a.v.max()) if a.v.size else 0.0)
    x = lambda t: np.asarray(t, dtype=float) / t_unit  # noqa: E731
    y = lambda b: np.asarray(b, dtype=float) / b_unit  # noqa: E731
    ax.plot(x(a.t), y(a.v), color="0.6", linewidth=0.6, marker=".", markersize=2.5, label="samples")
    if a.floor is not None:
        ax.plot(x(a.floor[0]), y(a.floor[1]), "o", color="tab:blue", markersize=3, label="floor (5-min blocks)")
    if a.evidence is not None:
        ft, fv = a.evidence.floor
        ax.plot(x(ft), y(fv), ".", color="tab:green", markersize=3, label="recent floor (fine blocks)")
    for restart in a.restarts:
        ax.axvline(restart / t_unit, color="tab:red", linestyle=":", linewidth=1)
    fit = _fit_line(a, result)
    if fit is not None:
        tt, mid, low, high = fit
        what = "fitted rise" if result.evidence_seconds is not None else "growth over the segment (no steady rise)"
        ax.plot(x(tt), y(mid), color="tab:orange", linewidth=2, label=what)
        ax.fill_between(x(tt), y(low), y(high), color="tab:orange", alpha=0.25, label="95% band")
    if a.t.size:
        ax.set_xlim(x(a.t[0]), x(a.t[-1]) if span > 0 else x(a.t[0]) + 1)
    if limit is not None:
        _limit_note(ax, a, result, limit, b_unit)
    growth = (f", growth {format_bytes(result.growth_bytes_per_hour)}/h "
              f"(95% lower bound {format_bytes(result.growth_low_bytes_per_hour)}/h)") if a.rise is not None else ""
    why = f"\n{j.detail}" if j.verdict is Verdict.UNDETERMINED else ""
    ax.set_title(f"{series.label}: {j.text}{growth}{why}", fontsize=9)
    ax.set_xlabel(t_name + ("" if series.origin is None else f" since {series.origin:%Y/%m/%d %H:%M:%S}"))
    ax.set_ylabel(b_name)
    ax.legend(loc="upper left", fontsize=7)


def _limit_note(ax, a: Analysis, result: LeakResult, limit: int, b_unit: float) -> None:
    """The limit as a line when it lies within the data's range (or just above it), else as a
    note; the projection to it as a note at the last sample."""
    low, high = ax.get_ylim()
    if limit / b_unit <= high + (high - low) * 0.5:
        ax.axhline(limit / b_unit, color="tab:red", linewidth=1, label=f"limit {format_bytes(limit)}")
    ttl = result.time_to_limit_seconds
    eta = "not projected (no significant growth)" if ttl is None or not math.isfinite(ttl) \
        else f"reached in {format_seconds(ttl)} at {format_bytes(result.growth_bytes_per_hour)}/h"
    ax.annotate(f"limit {format_bytes(limit)}: {eta}", xy=(1.0, 1.0), xycoords="axes fraction",
                xytext=(-4, -4), textcoords="offset points", ha="right", va="top", fontsize=8, color="tab:red")


def _fit_line(a: Analysis, result: LeakResult) -> tuple[np.ndarray, ...] | None:
    """(times, fit, low, high) of the rise the verdict rests on, from its onset to the
    last sample: lines through the rise's median point (as Theil–Sen's intercept)
    at the slope and at the ends of its 95% interval."""
    fast = a.fast
    if fast is not None and result.onset_t_seconds == fast.onset_t_seconds:
        ft, fv = fast.floor
        onset, slope = fast.onset_t_seconds, fast.growth_bytes_per_hour
        low, high, intercept = fast.growth_low_bytes_per_hour, fast.growth_high_bytes_per_hour, fast.intercept_bytes
    elif a.rise is not None and a.floor is not None:
        ft, fv = a.floor
        rise = a.rise
        onset = rise.onset_t_seconds if rise.structural else float(ft[0])
        slope, low, high = rise.growth_bytes_per_hour, rise.growth_low_bytes_per_hour, rise.growth_high_bytes_per_hour
        intercept = rise.intercept_bytes
    else:
        return None
    points = ft[ft >= onset]
    if points.size < 2 or not all(math.isfinite(x) for x in (slope, low, high, intercept)):
        return None
    pivot = float(np.median(points))
    level = intercept + slope / HOUR * pivot
    tt = np.array([onset, float(a.st[-1])])
    return (tt, *(level + s / HOUR * (tt - pivot) for s in (slope, low, high)))
