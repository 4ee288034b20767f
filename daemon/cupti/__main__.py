"""``python -m hypertrace.daemon.cupti [--socket PATH] -- CMD ...``: run CMD with the CUPTI
backend started in each of its Python processes (through a sitecustomize put first on
PYTHONPATH; the user's own sitecustomize still runs after it)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

AUTOSTART_DIR = Path(__file__).with_name("autostart")


def child_env(env: dict[str, str], socket: str | None = None,
              analyzer: str | None = None) -> dict[str, str]:
    """The environment that makes CMD's Python processes start the backend."""
    out = dict(env)
    paths = [str(AUTOSTART_DIR)]          # hypertrace itself resolves as it does here
    if out.get("PYTHONPATH"):
        paths.append(out["PYTHONPATH"])
    out["PYTHONPATH"] = os.pathsep.join(paths)
    out["HYPERTRACE_CUPTI_AUTOSTART"] = "1"
    if socket:
        out["HYPERTRACE_CUPTI_SOCKET"] = socket
    if analyzer:
        out["HYPERTRACE_ANALYZER"] = analyzer
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.daemon.cupti",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", help="the node agent's socket (default "
                    "$HYPERTRACE_CUPTI_SOCKET or /run/hypertrace/cupti.sock)")
    ap.add_argument("--analyzer", metavar="HOST:PORT",
                    help="with no agent on the node, send to this analyzer directly")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command to run after --, e.g. -- python train.py")
    env = child_env(dict(os.environ), args.socket, args.analyzer)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as exc:
        print(f"cannot run {cmd[0]}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
