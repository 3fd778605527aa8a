"""What the JetStream probes share: a nats-server with JetStream on a free
port and a store directory, started again on the same store."""
import socket
import subprocess
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port, store):
    server = subprocess.Popen(
        ["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(250):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return server
        except OSError:
            time.sleep(0.02)
    raise SystemExit("nats-server did not start")
