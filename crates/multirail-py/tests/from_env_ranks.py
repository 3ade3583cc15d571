"""A rank under `multirail run -n 2`: Endpoint.from_env(), one exchange
each way, then prints what it saw (test_launch.py reads it)."""

import os

import multirail

with multirail.Endpoint.from_env() as ep:
    peer = 1 - ep.rank
    ep.send(f"from {ep.rank}".encode(), peer, tag=1)
    buf = bytearray(16)
    st = ep.recv(buf, peer, tag=1)
    line = f"rank {ep.rank} of {ep.size} got {bytes(buf[: st.len]).decode()!r}\n"
    os.write(1, line.encode())  # one write: the ranks share stdout
