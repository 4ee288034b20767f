"""Cross-sections of several epochs built in threads ahead of the scoring that takes them in order.

Why: ``EpochAccumulator.build`` depends on its accumulator alone and spends its time in numpy
(decoding the histograms' varints, scattering counts into the bucket x GPU matrices), which
releases the GIL, while the scoring of the epoch before it runs. ``hypertrace analyze`` scores
every epoch of a file in one ``flush``: at 16,384 GPUs the builds are about two thirds of it.
Each cross-section is the one ``build`` makes in order (the same function on the same data), and
they come out in order; at most ``ahead`` of them wait built beyond the one being scored.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator

from hypertrace.analyzer.cross_section import CrossSection, EpochAccumulator


def built_in_order(accs: list[EpochAccumulator], ahead: int) -> Iterator[CrossSection]:
    """``acc.build()`` of each of ``accs``, in order; up to ``ahead`` threads build the next
    ones meanwhile (0, or a single accumulator: each is built when its turn comes)."""
    ahead = min(ahead, len(accs) - 1)
    if ahead <= 0:
        for acc in accs:
            yield acc.build()
        return
    pool = ThreadPoolExecutor(ahead, thread_name_prefix="build-ahead")
    try:
        futures: list[Future] = [pool.submit(acc.build) for acc in accs[:ahead + 1]]
        for i in range(len(accs)):
            cs = futures[i].result()
            futures[i] = None                         # type: ignore[call-overload]
            if i + ahead + 1 < len(accs):
                futures.append(pool.submit(accs[i + ahead + 1].build))
            yield cs
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["built_in_order"]
