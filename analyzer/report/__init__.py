"""What the scoring found, for people and programs: the job report, probable causes, the table,
JSON and HTML forms, and the Prometheus series."""
