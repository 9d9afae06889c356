"""The product tests' guards (no network, in-process logging put back) and shared fixtures, for the
lab's tests too."""

from tests.conftest import network_blocked, no_network, own_logging  # noqa: F401
from tests.unit.conftest import tiny_vl_toy  # noqa: F401
