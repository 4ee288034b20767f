"""The load generator of ``bench_scale``: simulated agents in worker processes.

Why processes: at 16,384 agents (131,072 GPUs) every agent opens a stream on its own connection
within a 2-second burst after each window end; one Python process cannot do that and also leave
the analyzer's cores alone. Each worker process owns an interleaved slice of the nodes (node
``i`` goes to worker ``i % procs``, so every worker's sends span the whole burst), runs grpc.aio
on one event loop, and can be pinned to cores of its own, away from the analyzer's.

Cheap per send: window bodies are serialized once (:class:`WindowPool`, shared with the workers
through a file) and each worker serializes the few-dozen-byte headers of its next epoch's
windows while it waits for that epoch's end; in the burst it only writes prepared bytes.

What a worker measures (wall-clock ns, per window): when it was due, when it was written, when
its ack came. The parent (``bench_scale.run_scale``) turns that into ack latency, the part of it
beyond ``epoch end + grace``, and the generator's own lag behind its schedule (a lagging
generator, not the analyzer, would then be what the figures show).
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import pickle
import resource
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import STREAM_METHOD, WIRE_VERSION

#: gRPC channel options of a simulated agent (a window is at most a few MB). Each channel gets
#: a subchannel pool of its own: with grpc's global pool every channel of a process to the same
#: target shares one TCP connection, and "a connection per agent" would be one per process.
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 16 * 1024 * 1024),
                   ("grpc.use_local_subchannel_pool", 1)]
#: seconds a worker may take to start and connect before the run gives up
READY_TIMEOUT_S = 300.0
#: times an agent sends a window again on a new stream when its stream failed before the ack
#: (the uplink keeps it in its spool and resends; an ack of a resend may say duplicate)
RESENDS = 3


def raise_fd_limit() -> int:
    """Raise this process's open-file limit (RLIMIT_NOFILE) to its hard limit, which children
    inherit: one connection per agent is one descriptor in the generator and one in the
    analyzer. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def node_name(node: int) -> str:
    return f"node-{node:04d}" if node < 10_000 else f"node-{node}"


class WindowPool:
    """Pre-serialized window bodies; a send costs one small header serialization.

    ``bodies[k][n]`` is the serialized NodeWindow of pool node ``n`` in pool window ``k`` with
    only ``processes`` set; :meth:`window` prepends the header fields (protobuf concatenation is
    field merge, so ``header + body`` is exactly the bytes of the whole window). Jobs larger
    than the pool reuse its bodies under new node names."""

    def __init__(self, bodies: list[list[bytes]]):
        self._bodies = bodies
        self.windows = len(bodies)
        self.nodes = len(bodies[0])

    def window(self, node: int, seq: int, start_ns: int, end_ns: int) -> bytes:
        name = node_name(node)
        head = pb.NodeWindow(version=WIRE_VERSION, agent_id=f"sim-{name}", node=name, seq=seq)
        head.start.FromNanoseconds(start_ns)
        head.end.FromNanoseconds(end_ns)
        return head.SerializeToString() + self._bodies[seq % self.windows][node % self.nodes]

    def save(self, path: str) -> None:
        with open(path, "wb") as fh:
            pickle.dump(self._bodies, fh, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def load(cls, path: str) -> "WindowPool":
        with open(path, "rb") as fh:
            return cls(pickle.load(fh))


@dataclass(frozen=True)
class Plan:
    """The run's schedule, sent to every worker once all are connected: epochs
    ``first .. first + paced - 1`` paced (node i at ``epoch end + delay_i``), then ``blast``
    epochs sent at once at ``blast_at_ns``. A window of plan epoch ``k`` has seq ``k + 1``."""

    first_epoch: int
    paced_epochs: int
    blast_epochs: int
    win_ns: int
    blast_at_ns: int
    ack_timeout_s: float = 60.0


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    target: str
    pool_file: str
    nodes: tuple[int, ...]            # this worker's nodes, sorted by delay
    delays_ns: tuple[int, ...]        # each node's send delay after its window's end
    agent_streams: bool
    streams: int                      # shared streams (agent_streams False)
    idle_close_s: float
    channels: int = 1                 # connections the shared streams take turns on
    cpus: tuple[int, ...] = ()        # pin the worker to these (empty: leave it)


@dataclass
class WorkerResult:
    """Per window of the worker (index = plan epoch * len(nodes) + position): plan epoch, when
    it was due, written and acked (0: never acked), whether the ack said duplicate, and how
    often it was sent again after its stream failed before the ack."""

    epoch: np.ndarray
    due_ns: np.ndarray
    sent_ns: np.ndarray
    ack_ns: np.ndarray
    duplicate: np.ndarray
    resent: np.ndarray
    errors: list[str] = field(default_factory=list)
    cpu_s: float = 0.0
    streams_opened: int = 0           # agent streams: one per agent when they are kept


class Sender:
    """One worker's sends: an agent's stream per window, or a few shared long-lived streams."""

    def __init__(self, spec: WorkerSpec, n_windows: int):
        from grpc import aio

        self._aio = aio
        self.spec = spec
        self.sent_ns = np.zeros(n_windows, np.int64)
        self.ack_ns = np.zeros(n_windows, np.int64)
        self.duplicate = np.zeros(n_windows, np.bool_)
        self.resent = np.zeros(n_windows, np.int16)
        self.errors: list[str] = []
        self.tasks: set[asyncio.Task] = set()
        if spec.agent_streams:
            self._channels = [aio.insecure_channel(spec.target, options=CHANNEL_OPTIONS)
                              for _ in spec.nodes]
        else:
            self._channels = [aio.insecure_channel(spec.target, options=CHANNEL_OPTIONS)
                              for _ in range(max(1, min(spec.channels, spec.streams)))]
        self._queues: list[asyncio.Queue] = []
        self._open: dict[int, Any] = {}           # agent streams: each node's open stream
        self._locks: dict[int, asyncio.Lock] = {}
        self._last: dict[int, int] = {}           # each node's last acked window
        self._closing = asyncio.Event()           # set by close: idle streams close now
        self.streams_opened = 0

    async def connect(self) -> None:
        await asyncio.gather(*(ch.channel_ready() for ch in self._channels))
        if not self.spec.agent_streams:
            for i in range(max(1, self.spec.streams)):
                q: asyncio.Queue = asyncio.Queue()
                self._queues.append(q)
                self._spawn(self._shared(q, self._channels[i % len(self._channels)]))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def send(self, pos: int, idx: int, payload: bytes) -> None:
        """Send window ``idx`` of the node at ``pos`` in this worker's slice; returns at once."""
        self.sent_ns[idx] = time.time_ns()
        if self.spec.agent_streams:
            self._spawn(self._agent(pos, idx, payload))
        else:
            self._queues[pos % len(self._queues)].put_nowait((idx, payload))

    def _call(self, channel: Any) -> Any:
        return channel.stream_stream(STREAM_METHOD, request_serializer=None,
                                     response_deserializer=pb.Ack.FromString)()

    def _acked(self, idx: int, ack: Any) -> None:
        if ack is self._aio.EOF:
            self.errors.append(f"window {idx}: the stream ended without its ack")
            return
        self.ack_ns[idx] = time.time_ns()
        self.duplicate[idx] = ack.duplicate

    async def _agent(self, pos: int, idx: int, payload: bytes) -> None:
        """As daemon/uplink.py sends: the window goes on the node's open stream, or on a new
        one when none is open; the stream closes ``idle_close_s`` after its last ack with
        nothing more to send (so with windows shorter than that, a node keeps one stream)."""
        import grpc

        async with self._locks.setdefault(pos, asyncio.Lock()):
            for attempt in range(RESENDS + 1):
                call = self._open.get(pos)
                if call is None:
                    call = self._open[pos] = self._call(self._channels[pos])
                    self.streams_opened += 1
                stage = "write"           # where a failure happened, in its error
                try:
                    await call.write(payload)
                    stage = "ack"
                    self._acked(idx, await call.read())
                    self._last[pos] = idx
                    break
                except grpc.RpcError as exc:
                    self._open.pop(pos, None)
                    if attempt < RESENDS:
                        self.resent[idx] += 1
                        await asyncio.sleep(0.2 * 2 ** attempt)
                        continue
                    self.errors.append(f"node {self.spec.nodes[pos]} at {stage}: "
                                       f"{exc.code().name}: {exc.details()}")
                    return
                except Exception as exc:  # noqa: BLE001 - counted, the run reports it
                    self._open.pop(pos, None)
                    self.errors.append(f"node {self.spec.nodes[pos]} at {stage}: {exc!r}")
                    return
        try:                              # idle: until idle_close_s passed or the run ends
            await asyncio.wait_for(self._closing.wait(), self.spec.idle_close_s)
        except asyncio.TimeoutError:
            pass
        async with self._locks[pos]:
            if self._last.get(pos) != idx or pos not in self._open:
                return                    # a later window uses the stream; it closes it
            call = self._open.pop(pos)
            try:
                await call.done_writing()
                code = await call.code()
                if code != grpc.StatusCode.OK:
                    self.errors.append(f"node {self.spec.nodes[pos]} at close: {code.name}: "
                                       f"{await call.details()}")
            except grpc.RpcError as exc:
                self.errors.append(f"node {self.spec.nodes[pos]} at close: "
                                   f"{exc.code().name}: {exc.details()}")

    async def _shared(self, q: asyncio.Queue, channel: Any) -> None:
        """One long-lived stream carrying many nodes' windows; acks come back in order."""
        import grpc

        call = self._call(channel)
        waiting: asyncio.Queue = asyncio.Queue()

        async def reader() -> None:
            while True:
                ack = await call.read()
                if ack is self._aio.EOF:
                    return
                self._acked(await waiting.get(), ack)

        rd = asyncio.ensure_future(reader())
        try:
            while True:
                item = await q.get()
                if item is None:
                    break
                waiting.put_nowait(item[0])
                await call.write(item[1])
            await call.done_writing()
            await rd
            code = await call.code()
            if code != grpc.StatusCode.OK:
                self.errors.append(f"shared stream: {code.name}: {await call.details()}")
        except grpc.RpcError as exc:
            self.errors.append(f"shared stream: {exc.code().name}: {exc.details()}")
        except Exception as exc:          # noqa: BLE001 - counted, the run reports it
            self.errors.append(f"shared stream: {exc!r}")

    async def wait_acked(self, lo: int, hi: int, timeout: float) -> bool:
        """Wait until windows ``lo .. hi - 1`` are acked; False on timeout, or when a stream
        failed and nothing is left in flight."""
        deadline = time.monotonic() + timeout
        while (self.ack_ns[lo:hi] == 0).any():
            if time.monotonic() > deadline or (self.errors and all(t.done() for t in self.tasks)):
                return False
            await asyncio.sleep(0.01)
        return True

    async def close(self, timeout: float) -> None:
        self._closing.set()
        for q in self._queues:
            q.put_nowait(None)
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=timeout)
            for t in pending:
                t.cancel()
            if pending:
                self.errors.append(f"{len(pending)} streams did not finish in {timeout:g} s")
        await asyncio.gather(*(ch.close() for ch in self._channels), return_exceptions=True)


async def _sleep_until(t_ns: int) -> None:
    left = (t_ns - time.time_ns()) / 1e9
    if left > 0:
        await asyncio.sleep(left)


async def _drive(spec: WorkerSpec, conn: Any) -> WorkerResult:
    pool = WindowPool.load(spec.pool_file)
    loop = asyncio.get_running_loop()
    n = len(spec.nodes)
    conn.send(("hello", None))
    plan: Plan = await loop.run_in_executor(None, conn.recv)
    epochs = plan.paced_epochs + plan.blast_epochs
    sender = Sender(spec, n * epochs)
    await sender.connect()
    conn.send(("ready", None))
    plan = await loop.run_in_executor(None, conn.recv)   # the start time, now all are connected
    delays = np.asarray(spec.delays_ns, np.int64)
    due = np.zeros(n * epochs, np.int64)
    for k in range(epochs):
        epoch = plan.first_epoch + k
        start, end = epoch * plan.win_ns, (epoch + 1) * plan.win_ns
        # serialized while waiting for the epoch's end: the burst only writes bytes
        payloads = [pool.window(node, k + 1, start, end) for node in spec.nodes]
        base = k * n
        if k < plan.paced_epochs:
            due[base:base + n] = end + delays
        else:
            due[base:base + n] = plan.blast_at_ns
        for pos in range(n):
            t = int(due[base + pos])
            if t > time.time_ns() + 500_000:      # a sleep under 0.5 ms is not worth a wake-up
                await _sleep_until(t)
            sender.send(pos, base + pos, payloads[pos])
    await sender.wait_acked(0, n * epochs, plan.ack_timeout_s)
    await sender.close(spec.idle_close_s + 30.0)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return WorkerResult(epoch=np.repeat(np.arange(epochs, dtype=np.int32), n), due_ns=due,
                        sent_ns=sender.sent_ns, ack_ns=sender.ack_ns,
                        duplicate=sender.duplicate, resent=sender.resent,
                        errors=sender.errors,
                        cpu_s=ru.ru_utime + ru.ru_stime, streams_opened=sender.streams_opened)


def worker_main(spec: WorkerSpec, conn: Any) -> None:
    """Entry of a generator process: pin, connect, run the plan, send back the result."""
    if spec.cpus:
        try:
            os.sched_setaffinity(0, spec.cpus)
        except OSError:
            pass
    raise_fd_limit()
    try:
        result: Any = asyncio.run(_drive(spec, conn))
    except BaseException as exc:          # noqa: BLE001 - the parent reports it
        result = f"generator {spec.index} failed: {exc!r}"
    conn.send(("result", result))
    conn.close()


class LoadProcesses:
    """``procs`` generator processes over the nodes; see the module docstring.

    Use: construct (workers start and load the pool), :meth:`connect` (each opens its
    connections), :meth:`start` with the plan, then :meth:`results`."""

    def __init__(self, target: str, pool_file: str, order: Sequence[int], delays_ns: np.ndarray,
                 procs: int, agent_streams: bool, streams: int, idle_close_s: float,
                 channels: int = 1, cpus: Sequence[int] = ()):
        ctx = mp.get_context("spawn")     # no grpc state inherited from this process
        self.procs = max(1, min(procs, len(order)))
        self._conns: list[Any] = []
        self._workers: list[Any] = []
        self.nodes: list[tuple[int, ...]] = []
        per_stream = max(1, streams // self.procs)
        for k in range(self.procs):
            mine = tuple(int(i) for i in order[k::self.procs])   # still sorted by delay
            self.nodes.append(mine)
            pin = (cpus[k % len(cpus)],) if len(cpus) >= self.procs else tuple(cpus)
            spec = WorkerSpec(k, target, pool_file, mine,
                              tuple(int(delays_ns[i]) for i in mine), agent_streams,
                              per_stream, idle_close_s, max(1, channels // self.procs), pin)
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(spec, child), daemon=True,
                            name=f"scale-load-{k}")
            p.start()
            child.close()
            self._conns.append(parent)
            self._workers.append(p)
        self._expect("hello")

    def _expect(self, what: str) -> None:
        for k, c in enumerate(self._conns):
            if not c.poll(READY_TIMEOUT_S):
                raise RuntimeError(f"generator {k} did not say {what} in {READY_TIMEOUT_S:g} s")
            try:
                tag, detail = c.recv()
            except EOFError:
                raise RuntimeError(f"generator {k} exited before it said {what}") from None
            if tag != what:
                raise RuntimeError(f"generator {k}: expected {what}, got {tag}: {detail}")

    def connect(self, plan: Plan) -> None:
        """Every worker opens its connections (one per agent with agent streams)."""
        for c in self._conns:
            c.send(plan)
        self._expect("ready")

    def start(self, plan: Plan) -> None:
        for c in self._conns:
            c.send(plan)

    def results(self, timeout: float) -> list[WorkerResult | str]:
        """Each worker's :class:`WorkerResult`, or why it has none."""
        out: list[WorkerResult | str] = []
        deadline = time.monotonic() + timeout
        for k, c in enumerate(self._conns):
            if c.poll(max(0.0, deadline - time.monotonic())):
                try:
                    out.append(c.recv()[1])
                except EOFError:
                    out.append(f"generator {k} exited without a result")
            else:
                out.append(f"generator {k} did not finish in {timeout:g} s")
        return out

    def close(self) -> None:
        for p in self._workers:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for c in self._conns:
            c.close()
