"""Persistence: turn per-epoch flags into verdicts with k-of-n onset and m-clean hysteresis.

Why: a single bad window is a spike, not a straggler. A GPU flagged in the current epoch is
``suspect``; flagged in ``persist_k`` of its last ``persist_n`` *scored* epochs it is a
``straggler``; a straggler stays one until it has ``clear_m`` consecutive clean epochs *and* its
window of the last n no longer holds k flags.

**Intermittent slowness.** A node slow in 30% of the windows (a flapping link, a periodic
neighbour) rarely shows 3 flags in 5 windows. So a second, longer rule: flagged in
``intermittent_k`` of the last ``intermittent_n`` scored epochs (6 of 20), in at least two
separate episodes, also makes a straggler, marked *intermittent*
(:attr:`PersistenceState.intermittent`), never on fewer flags than ``persist_k`` (a stricter short
rule stays stricter). It stays one while that holds or until ``clear_m`` clean epochs. Why two
episodes: one slow minute that ended (a CPU hog that was killed) is a straggler that recovered,
and clears like one; on a real H200 the 6-of-20 rule alone kept such a rank convicted for two
minutes after it was fine again. Slowness that comes back is what the long rule is for. A healthy GPU would need 6 chance flags in 20 windows: with a
per-window false flag rate p that is about C(20,6) p^6, 4e-8 per GPU-window at p = 1%. Epochs in which a GPU had no data or too few samples
do not count either way (its history does not move), so a sparse or absent agent neither convicts
nor clears a node.

State is kept as numpy arrays indexed by the job's GPU row, so one update touches 16,384 GPUs
without a Python loop. The last ``persist_n`` flags are bits of one integer per GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hypertrace.analyzer.config import ScoringConfig

HEALTHY, SUSPECT, STRAGGLER, INSUFFICIENT = 0, 1, 2, 3
VERDICT_NAMES = ("healthy", "suspect", "straggler", "insufficient_data")


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


def _episodes(bits: np.ndarray, mask: np.uint64) -> np.ndarray:
    """Separate runs of flags in each flag history (bit 0 the newest), a single clean window
    inside a run not counting as a break (a slow episode may miss one flag)."""
    x = bits.astype(np.uint64)
    one = np.uint64(1)
    x = (x | ((x << one) & (x >> one))) & mask           # fill single-window holes
    return _popcount(x & ~(x << one) & mask)             # each run counted at its newest end


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

    def reset(self, rows: np.ndarray) -> None:
        """Forget ``rows`` (a retired GPU's row, reused for a new GPU that starts healthy)."""
        for arr in (self.history, self.clean_streak, self.state, self.windows_flagged,
                    self.windows_seen, self.last_sufficient, self.long_history,
                    self.intermittent):
            arr[rows] = 0

    def update(self, rows: np.ndarray, sufficient: np.ndarray, flagged: np.ndarray,
               cfg: ScoringConfig) -> np.ndarray:
        """Apply one epoch to GPU ``rows``; returns their verdict codes after it.

        ``sufficient[i]``: row i had enough data to be scored this epoch; ``flagged[i]``: it was
        flagged (only meaningful where sufficient). Insufficient rows keep their state; their
        verdict is ``insufficient_data`` unless they are already stragglers.
        """
        rows = np.asarray(rows, dtype=np.int64)
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
        persistent = _popcount(hist) >= cfg.persist_k
        recurring = ((_popcount(long_hist) >= max(cfg.intermittent_k, cfg.persist_k))
                     & (_episodes(long_hist, long_mask) >= 2))
        was = self.state[r] == STRAGGLER
        keep = was & ((streak < cfg.clear_m) | persistent | recurring)
        convicted = persistent | recurring | keep
        new = np.where(convicted, STRAGGLER, np.where(f, SUSPECT, HEALTHY))
        self.state[r] = new.astype(np.int8)
        # intermittent: convicted by the long rule and never (or no longer) by the short one
        self.intermittent[r] = convicted & ~persistent & (recurring | self.intermittent[r])
        self.last_sufficient[rows] = suff
        return self.verdicts(rows)

    def verdicts(self, rows: np.ndarray | None = None) -> np.ndarray:
        """Verdict codes (HEALTHY..INSUFFICIENT) of ``rows`` (all rows when None)."""
        rows = np.arange(self.size) if rows is None else np.asarray(rows, dtype=np.int64)
        st = self.state[rows].astype(np.int64)
        return np.where((st != STRAGGLER) & ~self.last_sufficient[rows], INSUFFICIENT, st)
