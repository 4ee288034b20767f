"""Windows and results at rest: the SQLite store, its compressed blocks, the retention
summaries, the Engine's snapshots and the replay that rebuilds it after a restart."""
