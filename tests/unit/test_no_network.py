import socket

import pytest

from tests.conftest import NetworkBlocked


def test_outbound_connection_is_blocked():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with pytest.raises(NetworkBlocked):
        s.connect(("93.184.216.34", 443))
    s.close()


def test_name_resolution_is_blocked():
    with pytest.raises(NetworkBlocked):
        socket.getaddrinfo("huggingface.co", 443)
