"""The product tests' guards (no network, in-process logging put back) for the lab's tests too."""

from tests.conftest import network_blocked, no_network, own_logging  # noqa: F401
