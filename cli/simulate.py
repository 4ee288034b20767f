"""`hypertrace simulate` (placeholder: registered so the CLI table is complete)."""
from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="(not built yet)")
    p.set_defaults(func=lambda args: 1)
