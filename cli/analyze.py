"""`hypertrace analyze` (placeholder: registered so the CLI table is complete)."""
from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser("analyze", help="(not built yet)")
    p.set_defaults(func=lambda args: 1)
