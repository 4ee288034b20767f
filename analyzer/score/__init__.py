"""Scoring, pure: windows in, epoch results out. No I/O, no processes, no report code; what
may be imported here is checked by tests/test_layering.py."""
