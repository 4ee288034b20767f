"""Acting on stragglers, safely: the eviction policy, its audit trail, and the scheduler
backends (README "Acting on stragglers"). Dry-run by default."""
