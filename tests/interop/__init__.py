"""Tests against the real TRL and verl packages (run by `make test-interop` in .venv-interop)."""
