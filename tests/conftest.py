"""Test-wide guards: no network in any test, GPU tests skipped (with the reason) without CUDA."""

from __future__ import annotations

import logging
import os
import socket

import pytest

_LOCAL = ("127.", "::1", "localhost", "0.0.0.0")


class NetworkBlocked(RuntimeError):
    pass


def _is_local(address) -> bool:
    if isinstance(address, tuple) and address:
        address = address[0]
    return isinstance(address, (str, bytes)) and str(address).startswith(_LOCAL) or address in ("", None)


@pytest.fixture
def network_blocked() -> type[NetworkBlocked]:
    """The error a test gets for opening a network connection."""
    return NetworkBlocked


@pytest.fixture(autouse=True)
def no_network(monkeypatch, request):
    """Any connection to a non-loopback address fails the test that opened it."""
    if request.node.get_closest_marker("gpu"):
        return
    real_connect = socket.socket.connect
    real_getaddrinfo = socket.getaddrinfo

    def guarded_connect(self, address):
        if self.family == socket.AF_UNIX or _is_local(address):
            return real_connect(self, address)
        raise NetworkBlocked(f"test opened a network connection to {address!r}")

    def guarded_getaddrinfo(host, *args, **kwargs):
        if _is_local(host):
            return real_getaddrinfo(host, *args, **kwargs)
        raise NetworkBlocked(f"test resolved a network host {host!r}")

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def own_logging():
    """A command's main() run in-process configures the root logger (and transformers its own) for the
    test's captured stderr, as its process would: put back what was there, so no later test logs into
    a closed capture."""
    loggers = [logging.getLogger(), logging.getLogger("transformers")]  # transformers keeps its own handler
    saved = [(list(logger.handlers), logger.level) for logger in loggers]
    yield
    for logger, (handlers, level) in zip(loggers, saved):
        logger.handlers[:] = handlers
        logger.setLevel(level)


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if os.environ.get("RUN_GPU_TESTS") == "1" or _cuda_available():
        return
    skip = pytest.mark.skip(reason="GPU test: needs CUDA and the training stack (run on the H200 host)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
