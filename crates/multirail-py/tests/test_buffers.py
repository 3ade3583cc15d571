"""Every kind of buffer on both sides, small (copied) and large (lent)."""

import multirail
import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed (pip install numpy)")

SIZES = [1, 1000, 3 << 20]


def pattern(n):
    return (np.arange(n, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)


def make_send(kind, n):
    p = pattern(n)
    if kind == "bytes":
        return p.tobytes()
    if kind == "bytearray":
        return bytearray(p.tobytes())
    if kind == "memoryview":
        return memoryview(p.tobytes())
    if kind == "memoryview-slice":
        # A view into the middle of a larger buffer.
        big = bytearray(b"\xff" * 8 + p.tobytes() + b"\xff" * 8)
        return memoryview(big)[8 : 8 + n]
    if kind == "numpy-u8":
        return p
    if kind == "numpy-2d-f32":
        assert n % 4 == 0
        return p.view(np.float32).reshape(-1, 1)
    raise AssertionError(kind)


def make_recv(kind, n):
    if kind == "bytearray":
        return bytearray(n)
    if kind == "memoryview":
        return memoryview(bytearray(n))
    if kind == "numpy-u8":
        return np.zeros(n, dtype=np.uint8)
    if kind == "numpy-f64":
        assert n % 8 == 0
        return np.zeros(n // 8, dtype=np.float64)
    raise AssertionError(kind)


def as_bytes(buf):
    return bytes(memoryview(buf).cast("B"))


def exchange(ep, send_kind, recv_kind, n):
    if ep.rank == 0:
        ep.send(make_send(send_kind, n), 1, tag=5)
        return None
    buf = make_recv(recv_kind, n)
    st = ep.recv(buf, 0, 5)
    return (st.len, as_bytes(buf) == pattern(n).tobytes())


SEND_KINDS = ["bytes", "bytearray", "memoryview", "memoryview-slice", "numpy-u8", "numpy-2d-f32"]
RECV_KINDS = ["bytearray", "memoryview", "numpy-u8", "numpy-f64"]


# float32 needs a multiple of 4 bytes.
SEND_CASES = [(k, n) for k in SEND_KINDS for n in SIZES if k != "numpy-2d-f32" or n % 4 == 0]


@pytest.mark.parametrize("kind,n", SEND_CASES)
def test_send_kinds(pair, kind, n):
    _, got = pair(exchange, kind, "bytearray", n)
    assert got == (n, True)


@pytest.mark.parametrize("n", [8, 3 << 20])
@pytest.mark.parametrize("kind", RECV_KINDS)
def test_recv_kinds(pair, kind, n):
    _, got = pair(exchange, "numpy-u8", kind, n)
    assert got == (n, True)


@pytest.mark.parametrize("shm", ["off", "auto"])
def test_numpy_array_of_16_mib_over_rails_and_shared_memory(pair, shm):
    n = 16 << 20
    _, got = pair(exchange, "numpy-u8", "numpy-f64", n, env={"MULTIRAIL_SHM": shm})
    assert got == (n, True)


def recv_into_a_strided_view(ep):
    if ep.rank == 0:
        return None
    a = np.zeros((4, 4), dtype=np.uint8)
    try:
        ep.irecv(a[:, 0], 0, 1)
    except (BufferError, ValueError) as e:  # numpy raises ValueError
        return str(e)
    return "accepted"


def test_a_non_contiguous_array_is_refused(pair):
    _, got = pair(recv_into_a_strided_view)
    assert "contiguous" in got


def in_place(ep, n):
    """Receives into all of a multirail.Buffer land in place; a second
    receive into the same memory while the first is pending, a part of it,
    or a bytearray, are copied."""
    if ep.rank == 0:
        ep.recv(bytearray(1), 1, tag=1)
        for i in range(3):
            ep.send(pattern(n) + i, 1, tag=10 + i)
        ep.send(pattern(n // 2), 1, tag=13)
        ep.send(pattern(n), 1, tag=14)
        return None
    buf = multirail.Buffer(n)
    a = np.asarray(buf)
    f = a.view(np.float64)
    other = bytearray(n)
    reqs = [ep.irecv(a, 0, 10), ep.irecv(f, 0, 11), ep.irecv(other, 0, 12)]
    flags = [r.in_place for r in reqs]
    ep.send(b"g", 0, tag=1)
    ok = []
    for i, (r, view) in enumerate(zip(reqs, [a, f, other])):
        r.wait()
        ok.append(as_bytes(view) == (pattern(n) + i).tobytes())
    part = ep.irecv(a[: n // 2], 0, 13)
    part.wait()
    ok.append(as_bytes(a[: n // 2]) == pattern(n // 2).tobytes())
    # In place again once its receive finished.
    again = ep.irecv(a, 0, 14)
    again.wait()
    ok.append(as_bytes(a) == pattern(n).tobytes())
    return (len(buf), flags + [part.in_place, again.in_place], ok)


def test_a_multirail_buffer_is_received_into_in_place(pair):
    n = 1 << 20
    _, got = pair(in_place, n)
    assert got == (n, [True, False, False, False, True], [True] * 5)
