"""Shared test setup: quiet MuJoCo logs and keep run output out of the repository."""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
