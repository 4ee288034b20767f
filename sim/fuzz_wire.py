"""``make fuzz``: a long fuzzing run of the wire boundary, beside the bounded one in ``make test``.

Inputs are mutations of real simulated windows (byte flips, truncations, insertions, splices
of two windows) plus plain random bytes. The seeds include windows padded with fields the
analyzer does not know (at the top and inside process entries), windows flooded with XID
errors, and windows with absurd counters (``sched.runq_ns`` = 2**64 - 1). Two targets:

* the analyzer's content check in-process (``analyzer.ingest.checks.check_content``: parse,
  drop unknown fields, ``accept_window``): anything but its named refusal is a crash;
* ``Ingest.Stream`` of a real analyzer over localhost gRPC (plaintext, one stream per input,
  the default per-node quotas): anything but an ack, INVALID_ARGUMENT, ALREADY_EXISTS or a
  quota's refusal (FAILED_PRECONDITION, RESOURCE_EXHAUSTED) is a failure.

At the end the analyzer must still answer a report. The process's peak RSS is printed beside
its start. Exit status 1 on any crash, unexpected status, failed report or an RSS growth over
``--max-rss-growth-mb``; the first crashing inputs are written to ``--crash-dir``.

    python -m hypertrace.sim.fuzz_wire --inputs 1000000 --grpc-inputs 20000
"""
from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def unknown_field(size: int, number: int = 1000) -> bytes:
    """An encoded length-delimited field ``number`` that no hypertrace message has."""
    def varint(v: int) -> bytes:
        out = bytearray()
        while True:
            b, v = v & 0x7F, v >> 7
            out.append(b | (0x80 if v else 0))
            if not v:
                return bytes(out)
    return varint(number << 3 | 2) + varint(size) + b"\x00" * size


def hostile_seeds(base: list) -> list[bytes]:
    """Windows of ``base`` (NodeWindow messages) made hostile: unknown fields at the top and
    inside a process's NVML context, XID floods (at the limit and past it), absurd counters."""
    from hypertrace.proto.wire import MAX_XID_ERRORS
    out = []
    for k, w in enumerate(base):
        h = type(w)()
        h.CopyFrom(w)
        p = h.processes[k % len(h.processes)]
        if k % 4 == 0:
            p.nvml.MergeFromString(unknown_field(64, number=99))
            out.append(h.SerializeToString() + unknown_field(4096))
        elif k % 4 == 1:
            p.nvml.xid_errors.extend([79] * (MAX_XID_ERRORS + 1 + k))
            out.append(h.SerializeToString())
        elif k % 4 == 2:
            p.nvml.xid_errors.extend([48] * MAX_XID_ERRORS)
            out.append(h.SerializeToString())
        else:
            p.sched.runq_ns = 2**64 - 1
            p.sched.involuntary_switches = 2**64 - 1
            out.append(h.SerializeToString())
    return out


def _seeds() -> list[bytes]:
    from hypertrace.sim.simulate import SimConfig, generate
    windows = []
    for seed, gpus in ((1, 8), (2, 16), (3, 64)):
        windows.extend(generate(SimConfig(gpus=gpus, gpus_per_node=8, windows=2, seed=seed)))
    return [w.SerializeToString() for w in windows] + hostile_seeds(windows)


def mutate(rng: np.random.Generator, seeds: list[bytes]) -> bytes:
    """One fuzz input (see the module docstring for the operators)."""
    base = bytearray(seeds[rng.integers(len(seeds))])
    op = rng.integers(6)
    if op == 0:                                        # flip a few bytes
        for pos in rng.integers(0, len(base), rng.integers(1, 9)):
            base[pos] = rng.integers(256)
    elif op == 1:                                      # truncate
        del base[rng.integers(1, len(base)):]
    elif op == 2:                                      # insert random bytes
        pos = rng.integers(len(base))
        base[pos:pos] = rng.bytes(int(rng.integers(1, 64)))
    elif op == 3:                                      # splice two windows
        other = seeds[rng.integers(len(seeds))]
        cut = rng.integers(len(base))
        base = base[:cut] + other[rng.integers(len(other)):]
    elif op == 4:                                      # varint-sized fields: set high bytes
        for pos in rng.integers(0, len(base), 3):
            base[pos] |= 0x80
    else:                                              # plain random bytes
        return rng.bytes(int(rng.integers(0, 512)))
    return bytes(base)


def fuzz_validator(n: int, rng: np.random.Generator, seeds: list[bytes],
                   crash_dir: Path) -> tuple[int, int, int, int]:
    """(inputs, not protobuf, other refusals, crashes)."""
    from hypertrace.analyzer.ingest.checks import Refused, check_content
    decode = wire = crashes = 0
    for i in range(n):
        raw = mutate(rng, seeds)
        try:
            check_content(raw)
        except Refused as refused:
            if refused.reason == "malformed":
                decode += 1
            else:
                wire += 1
        except Exception as exc:                       # noqa: BLE001 - that is the finding
            crashes += 1
            if crashes <= 20:
                crash_dir.mkdir(parents=True, exist_ok=True)
                (crash_dir / f"validator-{i}.bin").write_bytes(raw)
                print(f"CRASH validator input {i}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return n, decode, wire, crashes


def fuzz_ingest(n: int, rng: np.random.Generator, seeds: list[bytes],
                crash_dir: Path) -> tuple[dict[str, int], int, bool]:
    """(status name -> count, unexpected, report still served)."""
    import grpc

    from hypertrace.analyzer.ingest.server import Analyzer
    from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions
    from hypertrace.analyzer.store.storage import Storage
    from hypertrace.proto import hypertrace_pb2 as pb
    from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc
    from hypertrace.proto.wire import STREAM_METHOD
    codes: dict[str, int] = {}
    unexpected = 0
    with tempfile.TemporaryDirectory() as tmp:
        storage = Storage.open(Path(tmp) / "fuzz.db", synchronous="NORMAL")
        server = AnalyzerServer(Analyzer(storage), ServerOptions(
            listen="127.0.0.1:0", insecure=True, flush_interval=1.0, shutdown_grace_s=0.5))
        port = server.start()
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                call = ch.stream_stream(STREAM_METHOD, request_serializer=None,
                                        response_deserializer=pb.Ack.FromString)
                for i in range(n):
                    raw = mutate(rng, seeds)
                    try:
                        list(call(iter([raw]), timeout=30))
                        name = "OK"
                    except grpc.RpcError as exc:
                        name = exc.code().name
                    codes[name] = codes.get(name, 0) + 1
                    if name not in ("OK", "INVALID_ARGUMENT", "ALREADY_EXISTS",
                                    "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED"):
                        unexpected += 1
                        if unexpected <= 20:
                            crash_dir.mkdir(parents=True, exist_ok=True)
                            (crash_dir / f"ingest-{i}.bin").write_bytes(raw)
                served = True
                try:
                    pb_grpc.QueryStub(ch).GetReport(pb.ReportRequest(), timeout=120)
                except grpc.RpcError as exc:
                    served = False
                    print(f"report failed after fuzzing: {exc.code().name}: {exc.details()}",
                          file=sys.stderr)
        finally:
            server.stop()
            storage.close()
    return codes, unexpected, served


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.fuzz_wire",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=1_000_000, help="validator inputs")
    ap.add_argument("--grpc-inputs", type=int, default=20_000, help="Ingest.Stream inputs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--crash-dir", default="fuzz-crashes")
    ap.add_argument("--max-rss-growth-mb", type=float, default=300.0)
    args = ap.parse_args(argv)
    import logging
    logging.getLogger("hypertrace").setLevel(logging.CRITICAL)   # every refusal would log
    rng = np.random.default_rng(args.seed)
    seeds = _seeds()
    crash_dir = Path(args.crash_dir)
    rss0 = _rss_mb()
    t0 = time.monotonic()
    n, decode, wire, crashes = fuzz_validator(args.inputs, rng, seeds, crash_dir)
    t1 = time.monotonic()
    print(f"validator: {n:,} inputs in {t1 - t0:.0f} s: {decode:,} not protobuf, {wire:,} "
          f"refused (named), {n - decode - wire - crashes:,} accepted, {crashes} crashes")
    codes, unexpected, served = fuzz_ingest(args.grpc_inputs, rng, seeds, crash_dir)
    t2 = time.monotonic()
    print(f"Ingest.Stream: {args.grpc_inputs:,} inputs in {t2 - t1:.0f} s: "
          + ", ".join(f"{k} {v:,}" for k, v in sorted(codes.items()))
          + f"; unexpected {unexpected}; report after: {'served' if served else 'FAILED'}")
    growth = _rss_mb() - rss0
    print(f"peak RSS {_rss_mb():.0f} MB (start {rss0:.0f} MB, growth {growth:.0f} MB, "
          f"limit {args.max_rss_growth_mb:g})")
    ok = crashes == 0 and unexpected == 0 and served and growth <= args.max_rss_growth_mb
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
