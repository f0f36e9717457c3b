"""A TCPStore client in plain Python, no torch: what another user needs to read, overwrite or delete the keys of a
job's rendezvous store (torch 2.x's wire protocol: a validation word, then one query byte and length-prefixed
strings; the Python client prefixes every key with "/").

    python3 storewire.py poison PORT_FILE STOP_FILE KEY...   # wait for a port in PORT_FILE, then overwrite KEYs
                                                             # with junk every 2 ms until STOP_FILE exists
                                                             # or the store closes
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time

VALIDATE, SET, GET, PING = 0, 1, 3, 13
MAGIC = 0x3C85F7CE


class Client:
    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.sendall(struct.pack("=BI", VALIDATE, MAGIC) + struct.pack("=BI", PING, 1234))
        if struct.unpack("=I", self._read(4))[0] != 1234:
            raise ConnectionError("not a TCPStore")

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    @staticmethod
    def _string(data: bytes) -> bytes:
        return struct.pack("=Q", len(data)) + data

    def set(self, key: str, value: bytes) -> None:
        self.sock.sendall(struct.pack("=B", SET) + self._string(key.encode()) + self._string(value))

    def get(self, key: str) -> bytes:
        self.sock.sendall(struct.pack("=B", GET) + self._string(key.encode()))
        return self._read(struct.unpack("=Q", self._read(8))[0])


def poison(port_file: str, stop_file: str, keys: list[str]) -> int:
    deadline = time.monotonic() + 300
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if time.monotonic() > deadline:
            return 1
        time.sleep(0.005)
    client = Client("127.0.0.1", int(open(port_file).read()))
    sets = 0
    try:
        while not os.path.exists(stop_file) and time.monotonic() < deadline:
            for key in keys:
                client.set(key, b"\0" * 16)
                sets += 1
            time.sleep(0.002)
    except OSError as exc:  # the store closed (its attempt is over)
        print(f"store gone: {exc}", file=sys.stderr)
    print(sets, flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["poison"] or len(sys.argv) < 5:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(poison(sys.argv[2], sys.argv[3], sys.argv[4:]))
