"""L5: jobs: the work behind each command (rollout, check ...), callable without the CLI."""
