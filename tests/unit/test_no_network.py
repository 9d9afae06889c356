import socket

import pytest


def test_outbound_connection_is_blocked(network_blocked):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with pytest.raises(network_blocked):
        s.connect(("93.184.216.34", 443))
    s.close()


def test_name_resolution_is_blocked(network_blocked):
    with pytest.raises(network_blocked):
        socket.getaddrinfo("huggingface.co", 443)
