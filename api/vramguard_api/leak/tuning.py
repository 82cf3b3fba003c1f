"""Every constant of the leak detector, with its reason: one frozen object.

The detector's figures (docs/leak-detection.md: the tuning and held-out corpora,
recall and false calls) were measured with these values; a change here is a
change of the method and must be measured again (``tests/unit/leak``, ``make
bench``). Budgets do not set these: their thresholds (``spec.leakDetection``:
``minGrowthPerHour``, ``minWindow``, ``minEvidence``) are the three ``default_*``
fields' counterparts, passed to ``leak.called_by`` at each call.

The slow path (``rise.py``) and the fast path (``evidence.py``) share a test
where the test means the same (``confidence``, ``min_low_ratio``,
``plateau_gain``, ``steps_ratio``). Two were tuned apart, and are stricter on the
fast path (``fast_min_snr`` 4 over ``slow_min_snr`` 3, ``fast_persistence`` 0.5
over ``slow_persistence`` 0.4, without the slow path's significance fallback):
it calls a leak after ``minEvidence`` (7 minutes by default) instead of
``minWindow`` (30), on a 1-minute floor noisier than the slow path's 5-minute
one. The unit corpus tests do not pin the difference (``tests/unit/leak/test_corpus.py``
passes with the slow path's values on the fast path too); the benchmark's figures
in docs/leak-detection.md were measured with these.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20
"""Bytes in a mebibyte (a unit, not a tuning)."""
HOUR = 3600.0
"""Seconds in an hour (a unit, not a tuning)."""


@dataclass(frozen=True, slots=True)
class LeakTuning:
    """The detector's constants (seconds, bytes, ratios); the reason of each below it."""

    # --- the budget's thresholds when a caller gives none (the API's defaults) ---
    default_min_growth_bytes_per_hour: float = 200 * MIB
    """``spec.leakDetection.minGrowthPerHour``'s default (200Mi): below it a slow
    rise is a cache or fragmentation, not worth an action."""
    default_min_window_seconds: float = 1800.0
    """``minWindow``'s default (30m): the longest a steady rise waits for a verdict."""
    default_min_evidence_seconds: float = 420.0
    """``minEvidence``'s default (7m): the least time any verdict rests on."""

    # --- series (``series.py``): zeros, dropouts and restarts ---
    zero_fraction: float = 0.05
    """A sample at or below this fraction of the series' median (and at least
    ``zero_bytes``) counts as zero: a failed read or no process."""
    zero_bytes: float = MIB
    """The zero test's floor (bytes), for a series whose median is itself tiny."""
    restart_window_seconds: float = 600.0
    """The memory before and after a run of zeros is compared over this long."""
    restart_drop_fraction: float = 0.05
    """A run of zeros is a restart when the lowest memory in the window after it is
    below the lowest in the window before it by this fraction and ``restart_drop_bytes``."""
    restart_drop_bytes: float = 64 * MIB
    """The least drop (bytes) beside ``restart_drop_fraction`` that makes a run of zeros a restart."""

    # --- floor (``floor.py``) ---
    slow_block_seconds: float = 300.0
    """Floor block of the slow path: long enough to catch a training step's floor and
    to outlast an eval spike, short enough to resolve the onset."""
    min_block_samples: int = 5
    """Blocks widen to hold this many sampling intervals when sampling is sparse."""
    outlier_sigmas: float = 4.0
    """A floor point this many robust deviations above the line through its
    neighbours missed the floor."""

    # --- tests both paths share (``rise.py``, ``evidence.py``) ---
    confidence: float = 0.95
    """The confidence of the growth's interval (Theil–Sen), both paths."""
    min_low_ratio: float = 0.25
    """The growth's lower confidence bound must be at least this fraction of the
    growth: a rate that is measured, not a drift within the noise. Both paths."""
    plateau_gain: float = 0.3
    """A rise-then-plateau fit that lowers the squared error by this fraction ends the
    rise at its bend (a cycle's top, a warm-up's plateau). Both paths."""
    steps_ratio: float = 0.1
    """A staircase of at most two steps (three levels, ``rise.staircase_ratio``) that
    leaves less than this fraction of the straight line's squared error explains the
    rise as one or two step-ups that stopped. On a line with noise (a leak) the ratio
    falls below 0.1 in under 0.5% of draws with 6 to 9 floor points (a rise of 30 to
    45 minutes) at any rise-to-noise ratio of 3 or more, and more rarely with more
    points; on two clear steps it is far below it (docs/leak-detection.md). Both paths."""
    clear_bytes: float = 32 * MIB
    """The least height (bytes) that counts beside the noise, in four tests: an
    excursion's rise, a stray point of the baseline, the level the onset moves past,
    and the fine floor's wander allowance (``MIB_32`` and ``32 * MIB`` before)."""
    excursion_sigmas: float = 4.0
    """An excursion counts when the floor rose this many noise deviations (and
    ``clear_bytes``) before coming back down (``rise.longest_excursion``)."""

    # --- the slow path (``rise.py``): a structural rise, called after minWindow ---
    slow_min_rise_points: int = 4
    """The least floor points after the slow path's onset (and in a part of the rise
    for ``climbs``' significance fallback)."""
    slow_min_snr: float = 3.0
    """The rise (growth times duration) must be this many times the floor's robust
    scatter about the Theil–Sen line. Laxer than ``fast_min_snr``: this path waits
    ``minWindow``, which a cycle's rise does not outlast."""
    slow_persistence: float = 0.4
    """Each half of the rise must climb at this fraction of the whole rise's slope
    (or significantly above zero: a leak that slows between bursts of traffic)."""
    tail_seconds: float = 600.0
    tail_fraction: float = 0.25
    tail_ratio: float = 0.25
    """The tail of the rise (its last ``tail_seconds`` or ``tail_fraction``, whichever
    is longer, with the point before) must climb at ``tail_ratio`` of the rise's slope:
    a cycle's top stops climbing, a leak does not."""

    # --- the fast path (``evidence.py``): a recent clean rise, called after minEvidence ---
    fast_block_seconds: float = 60.0
    """Floor block of the fast path: the agent's history resolution (1-minute minima)."""
    fast_block_widths: tuple[int, ...] = (1, 2, 4, 8)
    fast_wander: float = 2.0
    """The fast block is the shortest of ``fast_block_seconds`` times ``fast_block_widths``
    whose floor wanders at most ``fast_wander`` times as much as the longest's."""
    fast_block_samples: int = 4
    """Fast blocks widen to hold this many raw samples when sampling is sparse: a
    training step spends about a fifth of its time at its floor, and four samples
    catch it more often than not (with the rolling floor, almost always)."""
    fast_horizon_seconds: float = 3600.0
    """The fast path reads the segment's last hour: a rise longer than ``minWindow`` is
    the slow path's."""
    fast_min_points: int = 5
    """The least fine-floor points a recent rise (and the check that something recent
    stands above the floor) rests on."""
    fast_min_snr: float = 4.0
    """The recent rise must be this many times the fine floor's scatter about its line:
    stricter than ``slow_min_snr`` (module docstring)."""
    fast_persistence: float = 0.5
    """Each half of the recent rise climbs at this fraction of its slope, with no
    significance fallback: stricter than ``slow_persistence`` (a step is no ramp)."""
    slowing: float = 0.6
    """The second half of the rise climbs at this fraction of the first half's slope
    or more (a saturating fill halves its slope every 0.7 time constants)."""
    bending: float = 0.15
    """A parabola through the rise may bend it down at its ends by at most this fraction
    of the rise (a saturating fill of three time constants bends about 0.4)."""
    baseline_seconds: float = 600.0
    """The floor before the onset that must have been flat: longer than a model load or
    an aliased sawtooth's trough (and at least ``baseline_blocks`` fast blocks)."""
    baseline_blocks: int = 6
    """The least fast blocks a baseline spans, when blocks are wide (sparse samples)."""
    baseline_ratio: float = 0.25
    baseline_drift: float = 0.05
    """The baseline's slope may be at most ``baseline_ratio`` of the rise's, either way,
    and must not differ significantly from zero unless it is within ``baseline_drift``
    of the rise's (a quiet floor drifts measurably but slowly)."""
    level_sigmas: float = 3.0
    """The rise starts from the baseline's level when within this many deviations of
    it (and a block's growth); the onset moves past points within as many."""
    baseline_sigmas: float = 6.0
    baseline_strays: float = 0.1
    """At most ``baseline_strays`` of the baseline may lie more than ``baseline_sigmas``
    robust deviations (and ``clear_bytes``) from its median."""
    start_seconds: float = 1800.0
    """A rise from the process's start (no flat floor before it: a leak from the start,
    each life between OOM restarts) qualifies once the process has run this long,
    rising as a clean ramp since its model load. Until a cycle that starts with the
    process has turned once, its first rise looks the same: the tuning corpus's
    (``cycle-start``) rise for up to about 26 minutes; at 20 minutes two of them
    were called, at 25 minutes one (docs/leak-detection.md). The default
    ``minWindow``, counted from the process's start rather than from the slow path's
    onset (which its 5-minute blocks place late)."""
    start_flat_seconds: float = 120.0
    """A rise from the process's start must start within this long (and a fast block)
    of the model load: a floor held longer than that after the load and then rising
    is a rise after a (short) flat floor, which needs the baseline of any other."""
    load_seconds: float = 180.0
    """A rise from the process's start is measured from this long after it: a model load."""


TUNING = LeakTuning()
"""The detector's tuning: the one instance every module of ``vramguard_api.leak`` reads."""
