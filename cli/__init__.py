"""The ``hypertrace`` command line: one module per subcommand, each a thin layer over the
packages that do the work (argument parsing and output formatting only)."""
