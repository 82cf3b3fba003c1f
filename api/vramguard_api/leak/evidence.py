"""The fast path: a recent rise of the floor, clean enough to be called a leak
before ``minWindow``. See docs/leak-detection.md, "The fast path".

The floor is read at a finer grain than the slow path's over the segment's last
``tuning.fast_horizon_seconds``: blocks of ``tuning.fast_block_seconds`` (wider when fewer than
``tuning.fast_block_samples`` raw samples stand behind them, or when a long training
step makes the 1-minute floor wander: ``_fine_floor``), each point the lowest
of itself and its two neighbours (``floor.rolling_floor``: with sparse samples
a minute often misses a sawtooth's floor, twice in a row now and then). A
hockey stick gives the onset of the recent rise; the rise *qualifies* when all
of these hold (``_objection`` names the first that fails):

- it has ``tuning.fast_min_points`` floor points or more, and its Theil–Sen growth is
  measured: the lower 95% bound is at least ``tuning.min_low_ratio`` of the growth, and the
  rise is ``tuning.fast_min_snr`` times the floor's scatter about the line;
- it has lasted longer than the longest excursion the segment has already come
  back down from (a cycle seen before), on the slow path's floor or on the
  fine floor;
- it is a ramp, not a step nor a warm-up nor a cache filling up: each half
  climbs at ``tuning.fast_persistence`` of the slope, the second half at ``tuning.slowing`` of the
  first half's, a parabola bends it down by at most ``tuning.bending``, and no
  rise-then-plateau fit explains it better; nor two step-ups with a flat floor
  between them (``rise.staircase``: three levels fit it with less than
  ``tuning.steps_ratio`` of the line's squared error, the middle one held for a
  baseline or more);
- the floor was flat before it (``_flat_before``): a baseline of
  ``tuning.baseline_seconds`` (and ``tuning.baseline_blocks`` blocks) before the onset, flat
  as a whole and in each half, around the level the rise starts from. A rise
  from the process's start (a warm-up, a first cycle), from the trough of a
  cycle or after a fall does not qualify: it waits for the slow path's
  ``minWindow``.

A segment whose start (the process's, or a restart's) lies within the last hour
may instead qualify with a rise *from the process's start* (``_start_index``):
from the end of the model load (``tuning.load_seconds``), rising within
``tuning.start_flat_seconds`` of it, with every test above but the flat floor before
it, once the process has run ``tuning.start_seconds``, or at once when the process
life before it (the series shows a restart) ended on a structural rise: that
workload was seen to leak, not to cycle.

A qualifying rise is a leak when it has lasted ``minEvidence`` and the lower
bound of its growth is at least ``minGrowthPerHour`` (``leak.called_by``): a fast,
clean rise reaches that bound within minutes, a slow or noisy one does not
before ``minWindow`` and waits for the slow path.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..robust import TheilSen, median, median_slope, theil_sen
from .floor import floor_points, misread, rolling_floor
from .rise import longest_excursion, onset_index, persists, rise_end, scatter, staircase
from .tuning import HOUR
from .tuning import TUNING as T

STAIRCASE = "two step-ups with a flat floor between them (three levels fit it better than a line)"
NO_BASELINE = "no flat floor before it (the process's start, or too few points)"
NOT_FLAT = "the floor before it was not flat"
NOT_FROM_FLOOR = "it does not start from the floor before it"
FLAT_BEFORE_OBJECTIONS = (NO_BASELINE, NOT_FLAT, NOT_FROM_FLOOR)
"""The objections of ``_flat_before``: a young segment then tries its rise from the start."""
START_OBJECTION = "from the process's start, not yet longer than a cycle's first rise may be"


@dataclass(frozen=True)
class Evidence:
    """The recent rise of a segment's fine floor.

    ``onset_t_seconds`` to ``end_t_seconds`` (the last floor point): the rise,
    ``seconds`` long; its growth ``intercept_bytes + growth * t / 3600`` with the
    95% interval (bytes per hour); ``objection``: the first condition of the
    module docstring it fails, in words (None: it qualifies); ``floor``: the fine
    floor points it was fitted on; ``from_start``: the rise was judged from the
    process's start, with no baseline (``tuning.start_seconds``).
    """

    onset_t_seconds: float
    end_t_seconds: float
    growth_bytes_per_hour: float
    growth_low_bytes_per_hour: float
    growth_high_bytes_per_hour: float
    intercept_bytes: float
    objection: str | None
    floor: tuple[np.ndarray, np.ndarray]
    from_start: bool = False

    @property
    def seconds(self) -> float:
        """How long the rise has lasted, from its onset to its last floor point, seconds."""
        return self.end_t_seconds - self.onset_t_seconds

    @property
    def qualified(self) -> bool:
        """Whether the rise meets every condition of the module docstring."""
        return self.objection is None


def fast_block_seconds(raw_interval_seconds: float) -> float:
    """The fast path's floor block for raw samples this many seconds apart."""
    return max(T.fast_block_seconds, T.fast_block_samples * raw_interval_seconds)


def baseline_seconds(block_seconds: float) -> float:
    """The flat floor the fast path needs before an onset, with blocks this long."""
    return max(T.baseline_seconds, T.baseline_blocks * block_seconds)


def fit_evidence(
    st: np.ndarray, sv: np.ndarray, excursion_seconds: float, raw_interval_seconds: float,
    previous_rose: Callable[[], bool] | None = None,
) -> Evidence | None:
    """The recent rise of a segment (``current_segment``'s output); None when the
    segment's last hour holds too few floor points for a baseline and a rise (and
    no rise from the process's start), or when its last points do not all stand
    above the floor before them (``_nothing_recent``).
    ``excursion_seconds``: the longest excursion of the segment (``Rise``);
    ``raw_interval_seconds``: the time between raw samples (see ``fast_block_seconds``);
    ``previous_rose``: whether the process life before this segment ended on a
    structural rise (asked only for a rise from the process's start that has not
    yet lasted ``tuning.start_seconds``: such a rise then need not wait, see ``_objection``)."""
    width, ft, fv = _fine_floor(st, sv, fast_block_seconds(raw_interval_seconds))
    if ft.size <= T.fast_min_points or _nothing_recent(fv):
        return None  # no rise to fit
    baseline = baseline_seconds(width)
    first = int(np.searchsorted(ft, ft[0] + baseline))  # onsets that leave a baseline
    evidence = None
    if ft.size - first >= T.fast_min_points:
        evidence = _evidence(ft, fv, int(onset_index(ft, fv, T.fast_min_points, first)), excursion_seconds,
                             (width, baseline), None)
        if evidence.objection not in FLAT_BEFORE_OBJECTIONS:
            return evidence
    # No flat floor before it: a young segment tries its rise from the process's start.
    start = _start_index(st, ft, fv, width)
    if start is None:
        return evidence
    evidence = _evidence(ft, fv, start, excursion_seconds, (width, baseline), float(st[0]))
    if evidence.objection == START_OBJECTION and previous_rose is not None and previous_rose():
        return replace(evidence, objection=None)  # the life before leaked: no cycle to wait for
    return evidence


def _evidence(
    ft: np.ndarray, fv: np.ndarray, onset: int, excursion: float, blocks: tuple[float, float],
    process_start: float | None,
) -> Evidence:
    """The rise of the fine floor from ``ft[onset]`` and why it does not qualify
    (``_objection``); ``process_start``: the segment's start, seconds, when the rise
    is judged as one from the process's start (``_start_index``), else None."""
    rt, rv = ft[onset:], fv[onset:]
    fit = theil_sen(rv, rt, alpha=T.confidence)
    return Evidence(
        onset_t_seconds=float(rt[0]),
        end_t_seconds=float(rt[-1]),
        growth_bytes_per_hour=float(fit.slope) * HOUR,
        growth_low_bytes_per_hour=float(fit.low_slope) * HOUR,
        growth_high_bytes_per_hour=float(fit.high_slope) * HOUR,
        intercept_bytes=float(fit.intercept),
        objection=_objection(ft, fv, onset, fit, excursion, blocks, process_start),
        floor=(ft, fv),
        from_start=process_start is not None,
    )


def _start_index(st: np.ndarray, ft: np.ndarray, fv: np.ndarray, width: float) -> int | None:
    """Where a rise from the process's start begins on the fine floor, or None when
    there is none: the fine floor does not reach back to the segment's start (a
    segment older than the fast path's horizon), or the floor held flat for more
    than ``tuning.start_flat_seconds`` after the model load before it rose (the
    hockey stick's onset: then the rise did not start with the process, and
    needs the flat floor before it of any other rise). The model load is
    skipped: the first ``tuning.load_seconds`` and a block (the rolling floor reads a
    neighbour), then any leading points that ``floor.misread`` takes for a load."""
    if ft[0] > st[0] + 2 * width:
        return None
    index = int(np.searchsorted(ft, st[0] + T.load_seconds + width))
    low = misread(fv[index:])
    while index < ft.size - T.fast_min_points and low[0]:
        index, low = index + 1, low[1:]
    if ft.size - index < T.fast_min_points:
        return None
    onset = index + onset_index(ft[index:], fv[index:], T.fast_min_points)  # the load left out of the fit
    return index if ft[onset] - ft[index] <= max(T.start_flat_seconds, width) else None


def _fine_floor(st: np.ndarray, sv: np.ndarray, shortest: float) -> tuple[float, np.ndarray, np.ndarray]:
    """(block, times, floor) of the fast path: the rolling floor of the segment's
    recent past in the shortest block of ``shortest`` times 1, 2, 4 or 8 whose
    floor wanders no more than ``tuning.fast_wander`` times the longest one's (and 32 MiB).
    Long training steps (minutes) or sparse samples miss the floor in short
    blocks, and their floor then wanders with the step; a block as long as a
    step reads it again. The wander is the robust deviation of the floor's second
    differences, which a line (a leak) does not raise. The longest block is
    read first and the others only until one passes, and none of them when
    the 1-minute floor shows nothing recent above the floor before it
    (``_nothing_recent``): the agent runs this for every pod."""
    first = _rolled(st, sv, shortest)
    if first[1].size > T.fast_min_points and _nothing_recent(first[2]):
        return first[:3]  # nothing recent stands above the floor before it (fit_evidence stops there)
    widest = _rolled(st, sv, shortest * T.fast_block_widths[-1])
    for candidate in itertools.chain([first], (_rolled(st, sv, shortest * k) for k in T.fast_block_widths[1:-1])):
        if candidate[3] <= T.fast_wander * widest[3] + T.clear_bytes:
            return candidate[:3]
    return widest[:3]


def _nothing_recent(fv: np.ndarray) -> bool:
    """Whether the floor's last 3 (rolling) points are not all above the median of
    the points before the last ``tuning.fast_min_points``: a rise that could qualify ends
    well above the floor it started from, so the fit can be skipped (most pods,
    most of the time)."""
    return bool(fv[-3:].min() <= median(fv[:-T.fast_min_points]))


def _rolled(st: np.ndarray, sv: np.ndarray, width: float) -> tuple[float, np.ndarray, np.ndarray, float]:
    """(width, times, rolling floor, wander) of the segment's recent past in blocks of ``width``."""
    recent = st >= st[-1] - max(T.fast_horizon_seconds, 2 * baseline_seconds(width))
    ft, fv = floor_points(st[recent], sv[recent], width, 1)
    # No ``misread`` here: its threshold comes from the flat part's noise and would
    # take the points of a steep rise for misses. The rolling floor handles misses.
    fv = rolling_floor(fv)
    d2 = fv[2:] - 2 * fv[1:-1] + fv[:-2]
    wander = 1.4826 * median(np.abs(d2 - median(d2))) if d2.size >= 3 else np.inf
    return width, ft, fv, wander


def _first_rising(ft: np.ndarray, fv: np.ndarray, onset: int, baseline: float) -> int:
    """The hockey stick's onset moved up past points still at the baseline's level
    (within 3 robust deviations of it, and 32 MiB): a curve that rises fast and
    then levels off (a cache filling up) draws the fitted onset early, onto flat
    points that would hide its shape from ``_slowing``."""
    base = fv[(ft >= ft[onset] - baseline) & (ft < ft[onset])]
    if base.size < 3:
        return onset
    top = median(base) + T.level_sigmas * scatter(base - median(base)) + T.clear_bytes
    while onset < ft.size - T.fast_min_points and fv[onset + 1] <= top:
        onset += 1
    return onset


def _objection(
    ft: np.ndarray, fv: np.ndarray, onset: int, fit: TheilSen, excursion: float, blocks: tuple[float, float],
    process_start: float | None = None,
) -> str | None:
    """Why the rise from ``ft[onset]`` does not qualify (module docstring), or None.
    ``blocks``: the fast block and the baseline, seconds; ``process_start``: the
    segment's start for a rise judged from the process's start (no baseline: it
    must have lasted ``tuning.start_seconds`` instead)."""
    slope, low, intercept = fit.slope, fit.low_slope, fit.intercept
    rt, rv = ft[onset:], fv[onset:]
    seconds = rt[-1] - rt[0]
    if rt.size < T.fast_min_points:
        return "too few points"
    if not low >= T.min_low_ratio * slope > 0:
        return "growth not measured (confidence interval too wide)"
    if seconds <= max(excursion, longest_excursion(ft, fv, smooth=True)):
        return "no longer than an excursion already seen"
    noise = scatter(rv - (intercept + slope * rt))
    if slope * seconds < T.fast_min_snr * noise:
        return "within the noise"
    if not persists(rt, rv, slope, T.fast_persistence, True):
        return "not a steady ramp (a step)"
    steps, held = staircase(rt, rv)
    if steps < T.steps_ratio and held >= blocks[1]:  # the floor held a baseline between two steps
        return STAIRCASE
    rising = onset if process_start is not None else _first_rising(ft, fv, onset, blocks[1])
    if _slowing(ft[rising:], fv[rising:]) or rise_end(rt, rv, T.plateau_gain) < rt[-1]:
        return "slowing down (a warm-up, a cache filling up, a step that stops)"
    if process_start is not None:
        return None if rt[-1] - process_start >= T.start_seconds else START_OBJECTION
    return _flat_before(ft[:onset], fv[:onset], rt[0], intercept + slope * rt[0], slope, noise, blocks)


def _slowing(rt: np.ndarray, rv: np.ndarray) -> bool:
    """Whether the rise bends over: the second half climbs at less than ``tuning.slowing``
    of the first half's slope, or a parabola through the rise bends it down by
    more than ``tuning.bending`` of the rise (a saturating fill, e^(-t/tau), halves its
    slope every 0.7 tau; a leak keeps it)."""
    middle = (rt[0] + rt[-1]) / 2
    first, second = rt <= middle, rt >= middle
    if median_slope(rv[second], rt[second]) < T.slowing * median_slope(rv[first], rt[first]):
        return True
    x = (rt - middle) / (rt[-1] - rt[0])  # -1/2 .. 1/2
    curve, slope, _ = np.polyfit(x, rv, 2)
    return bool(slope > 0 and -curve / 4 > T.bending * slope)


def _flat_before(
    bt: np.ndarray, bv: np.ndarray, onset: float, level: float, slope: float, noise: float, blocks: tuple[float, float]
) -> str | None:
    """Why the floor did not hold the rise's starting ``level`` for the baseline
    (``blocks[1]`` seconds) before ``onset``, or None. Held: a slope within
    ``tuning.baseline_ratio`` of the rise's and not significantly different from zero
    (or within ``tuning.baseline_drift`` of the rise's), over the whole baseline and over
    each of its halves (a cycle's trough falls
    into it or curves out of it); a median near the level: within 3 times the
    larger of the rise's ``noise`` and the baseline's scatter, and a block's
    growth; and at most ``tuning.baseline_strays`` of its points far from its median."""
    width, baseline = blocks
    base = bt >= onset - baseline
    middle = onset - baseline / 2
    parts = (base, base & (bt < middle), bt >= middle)
    if any(np.count_nonzero(part) < 3 for part in parts):
        return NO_BASELINE
    for part in parts:
        fit = theil_sen(bv[part], bt[part], alpha=T.confidence)
        flat = fit.low_slope <= 0 <= fit.high_slope or abs(fit.slope) <= T.baseline_drift * slope
        if not (abs(fit.slope) <= T.baseline_ratio * slope and flat):
            return NOT_FLAT
    # The onset is known to a block: the level to a block's growth.
    centre, spread = median(bv[base]), scatter(bv[base] - median(bv[base]))
    if abs(centre - level) > T.level_sigmas * max(noise, spread) + slope * width:
        return NOT_FROM_FLOOR
    # Flat within its own noise: a cycle's trough has edges, a held level at most a stray point.
    strays = np.count_nonzero(np.abs(bv[base] - centre) > T.baseline_sigmas * spread + T.clear_bytes)
    return NOT_FLAT if strays > T.baseline_strays * np.count_nonzero(base) else None
