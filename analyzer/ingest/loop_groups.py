"""Work handed from the gRPC event loop to a thread in groups: one hop per group, not per item.

Why: a hop to a thread and back per window (``run_in_executor`` per window, each thread then
waiting for its own answer) cost more than the work itself. Here each stream's item joins a
waiting list and the stream awaits a future; one call at a time takes the whole list (up to
``max_group`` items) to the pool, and comes back once, resolving every future of the group.
Items that arrive meanwhile form the next group. The store's group commit
(``analyzer.server._StoreQueue``) and the window checkers' pipes (analyzer/scale/check_process.py)
are both this.
"""
from __future__ import annotations

import asyncio
from concurrent import futures
from typing import Any, Callable


class LoopGroups:
    """``run(items) -> one answer per item``, called in ``pool`` for the items submitted on the
    loop; when it raises, ``refuse(exc, items)`` gives the answers instead (never raised into
    the streams)."""

    def __init__(self, pool: futures.Executor, run: Callable[[list], list],
                 refuse: Callable[[BaseException, list], list], max_group: int | None = None):
        self._pool = pool
        self._call = run
        self._refuse = refuse
        self._max = max_group
        self._waiting: list[tuple[Any, asyncio.Future]] = []
        self._task: asyncio.Task | None = None

    def submit(self, item: Any) -> asyncio.Future:
        """A future of ``item``'s answer (on the running loop)."""
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append((item, fut))
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        return fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                await asyncio.sleep(0)      # items read in this turn of the loop join too
                cut = len(self._waiting) if self._max is None else self._max
                group, self._waiting = self._waiting[:cut], self._waiting[cut:]
                items = [item for item, _ in group]
                try:
                    answers = await loop.run_in_executor(self._pool, self._call, items)
                except Exception as exc:    # e.g. the pool shut down: refuse, never crash
                    answers = self._refuse(exc, items)
                for (_, fut), answer in zip(group, answers):
                    if not fut.done():      # a stream cancelled meanwhile takes no answer
                        fut.set_result(answer)
        finally:
            self._task = None


__all__ = ["LoopGroups"]
