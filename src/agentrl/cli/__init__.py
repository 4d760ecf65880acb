"""L5: the ``agentrl`` command line. One module per subcommand, each with ``register(subparsers)``."""
