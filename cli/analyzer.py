"""`hypertrace analyzer` (placeholder: registered so the CLI table is complete)."""
from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser("analyzer", help="(not built yet)")
    p.set_defaults(func=lambda args: 1)
