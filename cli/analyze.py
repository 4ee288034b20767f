"""`hypertrace analyze FILE`: score recorded windows offline through the server's Engine.

Every window is validated exactly as the server validates it; the first bad one stops the run with
exit status 2 and a message naming the line and field. Then all windows are ingested, every epoch
is scored (``flush(None)``) and the report is printed. Exit status: 0 no straggler, 3 stragglers,
2 bad input or settings.
"""
from __future__ import annotations

import argparse
import functools
import sys

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.cli.report import add_output_flags

#: Scoring settings exposed as flags (the rest via --config); names match ScoringConfig fields.
FLAG_SETTINGS = (
    ("window_seconds", float, "window length: windows of all nodes are aligned on it (default 10)"),
    ("z_threshold", float, "robust z cut (default 3.5)"),
    ("min_effect", float, "smallest slowdown worth flagging, relative to the job median "
                          "(default 0.05)"),
    ("host_effect_sigmas", float, "robust sigmas of the hosts' spread a host's median GPU may "
                                  "fall short of min_effect (default 2.5; 0 = plain gate)"),
    ("min_samples", int, "calls per GPU per API per window needed to score it (default 50)"),
    ("persist_k", int, "flagged windows (of persist_n) that make a straggler (default 3)"),
    ("persist_n", int, "windows remembered for persistence (default 5)"),
    ("clear_m", int, "clean windows that clear a straggler, and windows without data after "
                     "which a GPU is no_data (default 3)"),
    ("intermittent_k", int, "flagged windows (of intermittent_n) that make an intermittent "
                            "straggler: slow in some windows only (default 6)"),
    ("intermittent_n", int, "windows remembered for intermittent slowness (default 20)"),
    ("job_mode", str, "how ranks are read: auto (inferred from step times), collective (ranks "
                      "meet every step) or independent (default auto)"),
)


def add_scoring_flags(p: argparse.ArgumentParser) -> None:
    """Add --config and the common scoring flags (shared with other commands that score)."""
    p.add_argument("--config", metavar="TOML",
                   help="scoring settings (keys as ScoringConfig fields, top level or [scoring])")
    for name, typ, text in FLAG_SETTINGS:
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, default=None, help=text)


def scoring_config_from_args(args: argparse.Namespace):
    """ScoringConfig from --config plus flag overrides (flags win)."""
    from hypertrace.analyzer.score.config import ScoringConfig
    from hypertrace.proto.settings import load_settings

    overrides = {name: getattr(args, name) for name, _, _ in FLAG_SETTINGS
                 if getattr(args, name, None) is not None}
    if getattr(args, "config", None):
        return load_settings(ScoringConfig, args.config, overrides)
    return ScoringConfig.from_mapping(overrides)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "analyze", help="score recorded windows (.pb records or JSON lines) offline",
        description="Score recorded hypertrace.v1 NodeWindows with the same Engine as the "
                    "analyzer server and print the report. Exit 0: no straggler, 3: "
                    "stragglers, 2: bad input.",
        epilog="Example: hypertrace simulate --gpus 512 --output w.pb && hypertrace analyze w.pb")
    p.add_argument("file", metavar="FILE",
                   help="recorded windows: binary records (.pb, as `simulate --output` and "
                        "`export -o` write them; about 200x faster to read) or JSON lines, one "
                        "window a line; either may be gzipped; the format is read from the bytes; "
                        "- is stdin")
    add_output_flags(p)
    p.add_argument("--job", default=None, help="report only this job id")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="processes reading a large binary (.pb) file's windows ahead of "
                        "this one: they validate them and take their measurements out; 0: all "
                        "in this process (default: the usable cores less one, at most 8)")
    add_scoring_flags(p)
    p.set_defaults(func=run)


#: The module of the Engine's half of ingest that the workers run (``prepare_windows``): their
#: fork server imports it, named here so that it starts before this process imports it.
PREPARE_MODULE = "hypertrace.analyzer.score.engine"


def run(args: argparse.Namespace) -> int:
    from hypertrace.analyzer.scale import worker_start

    workers = worker_start.default_workers() if args.workers is None else max(args.workers, 0)
    # the workers' fork server imports their modules on another core while this one does
    worker_start.start_early(args.file, workers, PREPARE_MODULE)
    from hypertrace.analyzer.scale import validate_ahead
    from hypertrace.analyzer.score.config import ConfigError
    from hypertrace.analyzer.score.engine import Engine, UnknownJobError, prepare_windows
    from hypertrace.cli.report import emit
    from hypertrace.proto import wire

    try:
        cfg = scoring_config_from_args(args)
    except ConfigError as exc:
        print(f"hypertrace analyze: bad scoring setting: {exc}", file=sys.stderr)
        return 2
    from hypertrace.cli.progress import Progress

    engine = Engine(cfg)
    n = 0
    progress = Progress("analyze: read", "windows")
    try:
        # the workers also take each valid chunk's measurements out of its windows
        prepare = functools.partial(prepare_windows, window_ns=cfg.window_ns)
        for item in validate_ahead.validated_windows(args.file, workers,
                                                     prepare=prepare):
            if isinstance(item, validate_ahead.Prepared):
                engine.ingest_prepared(item.value)
                n += item.windows
                progress.add(item.windows)
                if item.later_midpoint_ns is not None:
                    # the epochs before the first one a later window belongs to (midpoint //
                    # window length): scored now, while the workers read on
                    first_open = item.later_midpoint_ns // cfg.window_ns
                    engine.flush(first_open * cfg.window_ns + cfg.grace_ns)
                continue
            window, size, problem = item
            n += 1
            if problem is not None:
                raise wire.WireError(f"{args.file}: window {n}: {problem.field}",
                                     problem.problem) from problem
            engine.ingest(window)
            progress.add()
    except OSError as exc:
        print(f"hypertrace analyze: cannot read {args.file}: {exc.strerror or exc}; pass a "
              "JSON-lines file written by `hypertrace simulate --output` or the analyzer",
              file=sys.stderr)
        return 2
    except wire.WireError as exc:
        print(f"hypertrace analyze: {exc}", file=sys.stderr)
        return 2
    progress.close()
    if n == 0:
        print(f"hypertrace analyze: {args.file} holds no windows", file=sys.stderr)
        return 2
    engine.flush(None)
    try:
        report = build_report(engine, args.job)
    except UnknownJobError as exc:
        print(f"hypertrace analyze: {exc}", file=sys.stderr)
        return 2
    return emit(report, args, "analyze")
