"""Entry point of the ``hypertrace`` console script.

Each subcommand lives in ``hypertrace.cli.<name>`` and exposes ``register(subparsers)``, which
adds its parser and sets ``func``. Modules import their heavy dependencies inside ``run`` so
``hypertrace --help`` stays fast on a node.

Exit status convention (all subcommands): 0 success / nothing found, 2 usage or input error,
3 stragglers reported (report, analyze), 1 any other failure.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# One BLAS thread unless the user says otherwise, set before anything imports numpy. numpy's
# OpenBLAS otherwise starts a thread per core that spins between calls; hypertrace's only BLAS
# calls are small matrix-vector products, so those threads take CPU from the analyzer's ingest
# (and from the training on an agent's node) and win nothing.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

SUBCOMMANDS = ("agent", "analyzer", "analyzer_edge", "analyzer_worker", "report", "jobs",
               "nodes", "analyze", "predict", "probe", "cupti", "simulate", "export", "certs", "evict")

EPILOG = """\
typical use (mutual TLS: `hypertrace certs --help` makes the files, a folder per certificate;
TLS=--tls-ca ca.crt --tls-cert ROLE.crt --tls-key ROLE.key of that folder):
  hypertrace analyzer --listen 0.0.0.0:50051 --db /var/lib/hypertrace/analyzer.db TLS
  hypertrace agent --analyzer analyzer-host:50051 TLS      (on every GPU node, as a service)
  hypertrace report --analyzer analyzer-host:50051 --job 1234 TLS
  hypertrace nodes --analyzer analyzer-host:50051 TLS      (which agents are down)
  hypertrace predict --p 0.01,0.005 --nodes 64,512          (how spikes scale with job size)

exit status: 0 ok / no straggler, 2 bad usage or input, 3 stragglers reported, 1 other error.
"""


def version() -> str:
    """The installed package's version (the source tree's when it is not installed)."""
    from importlib import metadata
    try:
        return metadata.version("hypertrace")
    except metadata.PackageNotFoundError:
        return "0.1.0 (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: the version is looked up only when asked for (``importlib.metadata``
    reads the installed distributions, a noticeable part of every command's start)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show program's version number and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser._print_message(f"hypertrace {version()}\n", sys.stdout)
        parser.exit()


VERBOSE_HELP = ("more detail: report and analyze tables show one row per GPU; more logging "
                "(-v info, -vv debug)")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; ``command`` (a name in SUBCOMMANDS): with that subcommand only.
    Why: each subcommand's module imports what its flags need (settings files, socket paths,
    cluster keys), about 60 ms in all, and a run needs one of them; its help, usage and errors
    are the same either way (the subcommands are listed under the COMMAND metavar)."""
    parser = argparse.ArgumentParser(
        prog="hypertrace",
        description="Find slow GPUs and nodes in training jobs from CUDA API latency.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help=VERBOSE_HELP)
    parser.add_argument("--version", action=_VersionAction)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS if command is None else (command,):
        importlib.import_module(f"hypertrace.cli.{name}").register(subparsers)
    for sub in subparsers.choices.values():     # -v after the subcommand works too
        sub.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                         help=VERBOSE_HELP)
    return parser


def requested_command(argv: list[str]) -> str | None:
    """The subcommand module ``argv`` names (its first word that is not an option; the
    top-level options take no value), or None: none, or not one of SUBCOMMANDS."""
    word = next((a for a in argv if not a.startswith("-")), "").replace("-", "_")
    return word if word in SUBCOMMANDS else None


def unrecognized(parser: argparse.ArgumentParser, args: argparse.Namespace,
                 extra: list[str]) -> None:
    """Exit 2 for arguments no parser took, with the usage of the (sub)command they were given
    to, not the top level's, and the option meant where one is close (``--fromat``)."""
    import difflib
    target = parser
    while True:
        sub = next((a for a in target._actions
                    if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(args, sub.dest, None) if sub is not None and sub.dest else None
        if sub is None or chosen not in sub.choices:
            break
        target = sub.choices[chosen]
    options = [o for a in target._actions if a.help != argparse.SUPPRESS
               for o in a.option_strings if o.startswith("--")]
    hints = []
    for word in extra:
        if word.startswith("-"):
            close = difflib.get_close_matches(word.split("=", 1)[0], options, n=1, cutoff=0.75)
            if close:
                hints.append(f"{word.split('=', 1)[0]}: did you mean {close[0]}?")
    target.error(f"unrecognized arguments: {' '.join(extra)}"
                 + (f" ({'; '.join(hints)})" if hints else ""))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(requested_command(argv))
    args, extra = parser.parse_known_args(argv)
    if extra:
        unrecognized(parser, args, extra)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and closed early: not an error. Point stdout at devnull so the
        # interpreter's final flush does not raise again.
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
