"""Persistence: turn per-epoch flags into verdicts with k-of-n onset and m-clean hysteresis.

Why: a single bad window is a spike, not a straggler. A GPU flagged in the current epoch is
``suspect``; flagged in ``persist_k`` of its last ``persist_n`` *scored* epochs it is a
``straggler``; a straggler stays one until it has ``clear_m`` consecutive clean epochs (then the
k of n counts no more: the episode ended, and a recovered node reads healthy in ``clear_m``
windows).

**Intermittent slowness.** A node slow in 30% of the windows (a flapping link, a periodic
neighbour) rarely shows 3 flags in 5 windows. So a second, longer rule: flagged in
``intermittent_k`` of the last ``intermittent_n`` scored epochs (6 of 20) also makes a straggler,
marked *intermittent* (:attr:`PersistenceState.intermittent`), never on fewer flags than
``persist_k`` (a stricter short rule stays stricter). A healthy GPU would need 6 chance flags in 20
windows: with a per-window false flag rate p that is about C(20,6) p^6, 4e-8 per GPU-window at
p = 1%.

What the long rule must not do is hold or re-convict a node on the flags of **one episode that
ended**: a CPU hog that was killed is a straggler that recovered, and clears like one, within
``clear_m`` clean epochs. Two rules keep it so:

* An *episode* is a run of flags; ``clear_m`` clean epochs (what clears a verdict) end it, fewer
  do not (a slow episode may miss a flag or two). A straggler whose flags stopped is held past
  ``clear_m`` clean epochs only when its last ``intermittent_n`` epochs hold two or more
  episodes: slowness that came back. (Counting the 6 of 20 alone held a rank convicted for two
  minutes after a one-minute fault on an H200.)
* When a straggler clears, the flags it had are *spent* (:attr:`PersistenceState.spent`): they no
  longer count toward a new conviction by the long rule, only toward holding a later one. Why:
  after a real episode of five flags, one chance flag (a hiccup) would make 6 of 20 in two
  episodes. A node that truly comes back is convicted again by the short rule or by
  ``intermittent_k`` new flags, and its old episode then holds it as intermittent.

Epochs in which a GPU had no data or too few samples do not count either way (its history does
not move), so a sparse or absent agent neither convicts nor clears a node; the report shows a GPU
absent for ``clear_m`` of its job's scored epochs as ``no_data`` (:meth:`PersistenceState.
verdicts`).

State is kept as numpy arrays indexed by the job's GPU row, so one update touches 16,384 GPUs
without a Python loop. The last ``persist_n`` flags are bits of one integer per GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hypertrace.analyzer.config import ScoringConfig

HEALTHY, SUSPECT, STRAGGLER, INSUFFICIENT, NO_DATA = 0, 1, 2, 3, 4
VERDICT_NAMES = ("healthy", "suspect", "straggler", "insufficient_data", "no_data")


def _popcount(x: np.ndarray) -> np.ndarray:
    """Set bits per element (numpy's own where it has one: no loop over the bits)."""
    x = x.astype(np.uint64)
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x).astype(np.int64)
    n = np.zeros(x.shape, dtype=np.int64)
    while np.any(x):
        n += (x & np.uint64(1)).astype(np.int64)
        x = x >> np.uint64(1)
    return n


def _episodes(bits: np.ndarray, mask: np.uint64, gap: int) -> np.ndarray:
    """Separate episodes in each flag history (bit 0 the newest): runs of flags split by at
    least ``gap`` clean windows (fewer clean windows do not end an episode). Each is counted at
    its newest flag: a flag none of whose ``gap`` newer windows is flagged."""
    x = bits.astype(np.uint64) & mask
    newer = np.zeros_like(x)
    for a in range(1, gap + 1):
        newer |= x << np.uint64(a)
    return _popcount(x & ~newer & mask)


@dataclass
class PersistenceState:
    """Per-GPU persistence state of one job; arrays grow as new GPUs appear."""

    history: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    clean_streak: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    state: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8))
    windows_flagged: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    windows_seen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    last_sufficient: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    #: the last intermittent_n flags (bits), and whether the straggler verdict came from them only
    long_history: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    intermittent: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    #: the bits of ``long_history`` that belong to an episode that was convicted and cleared:
    #: they may hold a later conviction, never make one (module docstring)
    spent: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    #: scored epochs of the job in a row without any window of this GPU; -1 until it is first
    #: in a scored epoch (a GPU registered but not yet scored is not "gone")
    absent: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def size(self) -> int:
        return int(self.state.size)

    def grow(self, n: int) -> None:
        """Make room for GPU rows up to ``n`` (new GPUs start healthy with no history)."""
        extra = n - self.size
        if extra <= 0:
            return
        self.history = np.concatenate((self.history, np.zeros(extra, dtype=np.uint64)))
        self.clean_streak = np.concatenate((self.clean_streak, np.zeros(extra, dtype=np.int64)))
        self.state = np.concatenate((self.state, np.zeros(extra, dtype=np.int8)))
        self.windows_flagged = np.concatenate((self.windows_flagged, np.zeros(extra, np.int64)))
        self.windows_seen = np.concatenate((self.windows_seen, np.zeros(extra, np.int64)))
        self.last_sufficient = np.concatenate((self.last_sufficient, np.zeros(extra, bool)))
        self.long_history = np.concatenate((self.long_history, np.zeros(extra, np.uint64)))
        self.intermittent = np.concatenate((self.intermittent, np.zeros(extra, bool)))
        self.spent = np.concatenate((self.spent, np.zeros(extra, np.uint64)))
        self.absent = np.concatenate((self.absent, np.full(extra, -1, np.int64)))

    def reset(self, rows: np.ndarray) -> None:
        """Forget ``rows`` (a retired GPU's row, reused for a new GPU that starts healthy)."""
        for arr in (self.history, self.clean_streak, self.state, self.windows_flagged,
                    self.windows_seen, self.last_sufficient, self.long_history,
                    self.intermittent, self.spent):
            arr[rows] = 0
        self.absent[rows] = -1

    def update(self, rows: np.ndarray, sufficient: np.ndarray, flagged: np.ndarray,
               cfg: ScoringConfig) -> np.ndarray:
        """Apply one epoch to GPU ``rows``; returns their verdict codes after it.

        ``sufficient[i]``: row i had enough data to be scored this epoch; ``flagged[i]``: it was
        flagged (only meaningful where sufficient). Insufficient rows keep their state; their
        verdict is ``insufficient_data`` unless they are already stragglers. Every row not in
        ``rows`` that was ever scored counts one more epoch without data (:meth:`verdicts`).
        """
        rows = np.asarray(rows, dtype=np.int64)
        self.absent[self.absent >= 0] += 1
        self.absent[rows] = 0
        suff = np.asarray(sufficient, dtype=bool)
        flag = np.asarray(flagged, dtype=bool) & suff
        r = rows[suff]
        f = flag[suff]
        mask = np.uint64((1 << cfg.persist_n) - 1)
        hist = ((self.history[r] << np.uint64(1)) | f.astype(np.uint64)) & mask
        self.history[r] = hist
        streak = np.where(f, 0, self.clean_streak[r] + 1)
        self.clean_streak[r] = streak
        self.windows_seen[r] += 1
        self.windows_flagged[r] += f
        long_mask = np.uint64((1 << cfg.intermittent_n) - 1)
        long_hist = ((self.long_history[r] << np.uint64(1)) | f.astype(np.uint64)) & long_mask
        self.long_history[r] = long_hist
        spent = (self.spent[r] << np.uint64(1)) & long_mask
        need = max(cfg.intermittent_k, cfg.persist_k)
        live = streak < cfg.clear_m               # its latest episode has not ended
        # k of the last n, while the episode lasts: clear_m clean windows end it, even when the
        # last n still hold k of its flags (a fault that ended is over in clear_m windows)
        persistent = live & (_popcount(hist) >= cfg.persist_k)
        # the long rule convicts on flags no cleared episode spent, while they keep coming ...
        fresh = live & (_popcount(long_hist & ~spent) >= need)
        # ... and holds a straggler whose slowness came back after a clearing stretch
        recurring = ((_popcount(long_hist) >= need)
                     & (_episodes(long_hist, long_mask, cfg.clear_m) >= 2))
        was = self.state[r] == STRAGGLER
        keep = was & (live | recurring)
        convicted = persistent | fresh | keep
        new = np.where(convicted, STRAGGLER, np.where(f, SUSPECT, HEALTHY))
        self.state[r] = new.astype(np.int8)
        # a cleared straggler's flags are spent: they never convict it again by themselves
        self.spent[r] = np.where(was & ~convicted, long_hist, spent)
        # intermittent: convicted by the long rule and never (or no longer) by the short one
        self.intermittent[r] = convicted & ~persistent & (fresh | recurring
                                                          | self.intermittent[r])
        self.last_sufficient[rows] = suff
        return self.verdicts(rows)

    def verdicts(self, rows: np.ndarray | None = None, no_data_after: int = 0) -> np.ndarray:
        """Verdict codes (HEALTHY..NO_DATA) of ``rows`` (all rows when None). ``no_data_after``
        > 0: a GPU without any window in that many scored epochs of its job in a row is
        ``no_data``, whatever its state (its agent stopped sending: nothing says it is slow
        now, and it is not proposed or predicted on). Its state is kept: when its windows come
        back, so does its verdict."""
        rows = np.arange(self.size) if rows is None else np.asarray(rows, dtype=np.int64)
        st = self.state[rows].astype(np.int64)
        out = np.where((st != STRAGGLER) & ~self.last_sufficient[rows], INSUFFICIENT, st)
        if no_data_after > 0:
            out = np.where(self.absent[rows] >= no_data_after, NO_DATA, out)
        return out

    def gone(self, no_data_after: int) -> np.ndarray:
        """Rows without any window in the last ``no_data_after`` scored epochs (``no_data``)."""
        return np.flatnonzero(self.absent >= no_data_after)
