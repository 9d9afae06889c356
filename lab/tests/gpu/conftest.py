"""The GPU suite's fixtures (tests/gpu/conftest.py), shared with the lab's GPU evidence runs."""

from tests.gpu.conftest import *  # noqa: F403
