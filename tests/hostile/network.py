"""Opens a TCP connection to a port on loopback that the test listens on."""

import socket

from ralph_ray import harness

harness.report(epoch=1, val_acc=0.1)
socket.create_connection(("127.0.0.1", {PORT}), timeout=5).sendall(b"scores, please")
