"""Each call of multirail.Endpoint and multirail.Request, two ranks per
test (see conftest.py)."""

import threading

import multirail
import pytest

LARGE = 1 << 20  # above the size from which sends lend their buffer


def hello(ep):
    if ep.rank == 0:
        ep.send(b"hello", 1, tag=7)
        return None
    buf = bytearray(16)
    st = ep.recv(buf, source=0, tag=7)
    return (ep.size, st.source, st.tag, st.len, bytes(buf[: st.len]))


def test_send_and_recv_carry_bytes_and_status(pair):
    _, got = pair(hello)
    assert got == (2, 0, 7, 5, b"hello")


def nonblocking(ep, n):
    data = bytes(range(256)) * (n // 256)
    if ep.rank == 0:
        ep.recv(bytearray(1), source=1, tag=1)  # the receive is posted
        req = ep.isend(data, 1, tag=2)
        first = req.wait()
        return (first, req.wait(), req.test())
    buf = bytearray(n)
    req = ep.irecv(buf, source=0, tag=2)
    before = req.test()
    ep.send(b"x", 0, tag=1)
    st = req.wait()
    again = req.wait()
    return (before, st.len, again.len, req.test(), bytes(buf) == data)


@pytest.mark.parametrize("n", [256, LARGE])
def test_isend_irecv_test_and_wait(pair, n):
    sent, got = pair(nonblocking, n)
    assert sent == (None, None, True)
    assert got == (False, n, n, True, True)


def any_source_any_tag(ep):
    if ep.rank == 0:
        ep.send(b"abc", 1, tag=41)
        return None
    buf = bytearray(8)
    st = ep.recv(buf, multirail.ANY_SOURCE, multirail.ANY_TAG)
    return (st.source, st.tag, st.len)


def test_any_source_and_any_tag_match_and_report(pair):
    _, got = pair(any_source_any_tag)
    assert got == (0, 41, 3)


def by_tag(ep):
    if ep.rank == 0:
        ep.send(b"first", 1, tag=1)
        ep.send(b"second", 1, tag=2)
        return None
    a, b = bytearray(6), bytearray(6)
    sb = ep.recv(b, 0, tag=2)
    sa = ep.recv(a, 0, tag=1)
    return (bytes(a[: sa.len]), bytes(b[: sb.len]))


def test_tags_select_the_message(pair):
    _, got = pair(by_tag)
    assert got == (b"first", b"second")


def zero_size(ep):
    if ep.rank == 0:
        ep.send(b"", 1, tag=3)
        ep.isend(bytearray(), 1, tag=4).wait()
        return None
    st = ep.recv(bytearray(), 0, 3)
    st2 = ep.irecv(bytearray(8), 0, 4).wait()
    return (st.len, st.tag, st2.len, st2.tag)


def test_zero_size_messages(pair):
    _, got = pair(zero_size)
    assert got == (0, 3, 0, 4)


def wait_all(ep):
    if ep.rank == 0:
        reqs = [ep.isend(bytes([i]) * (i + 1), 1, tag=i) for i in range(4)]
        return multirail.Endpoint.wait_all(reqs)
    bufs = [bytearray(8) for _ in range(4)]
    reqs = [ep.irecv(b, 0, tag=i) for i, b in enumerate(bufs)]
    sts = ep.wait_all(reqs)
    return [(s.tag, s.len, bytes(b[: s.len])) for s, b in zip(sts, bufs)]


def test_wait_all_returns_each_result(pair):
    sent, got = pair(wait_all)
    assert sent == [None] * 4
    assert got == [(i, i + 1, bytes([i]) * (i + 1)) for i in range(4)]


def barrier(ep):
    ep.barrier()
    ep.barrier()
    return ep.rank


def test_barrier(pair):
    assert pair(barrier) == (0, 1)


def buffers_held(ep):
    """Pending requests keep their buffers exported: a bytearray cannot be
    resized until the request is waited for."""
    if ep.rank == 0:
        ep.recv(bytearray(1), 1, tag=1)
        out = []
        for n in (16, LARGE):
            b = bytearray(n)
            req = ep.isend(b, 1, tag=2)
            held = False
            if n >= LARGE:
                try:
                    b.extend(b"x")
                except BufferError:
                    held = True
            req.wait()
            b.extend(b"x")  # released after wait
            out.append(held)
        return out
    r = bytearray(16)
    req = ep.irecv(r, 0, tag=2)
    try:
        r.extend(b"x")
        held = False
    except BufferError:
        held = True
    ep.send(b"g", 0, tag=1)
    req.wait()
    r.extend(b"x")
    ep.recv(bytearray(LARGE), 0, tag=2)
    return held


def test_pending_requests_hold_their_buffers(pair):
    sent, got = pair(buffers_held)
    # A small send is copied (nothing held); a large one is lent.
    assert sent == [False, True]
    assert got is True


def gil_released(ep):
    """Rank 1 waits in recv on one thread while its main thread sends:
    without the GIL released by the wait, the send could not run and the
    pair would time out."""
    if ep.rank == 0:
        ep.recv(bytearray(2), 1, tag=1)
        ep.send(b"data", 1, tag=2)
        return None
    box = {}

    def waiter():
        buf = bytearray(4)
        box["st"] = ep.recv(buf, 0, tag=2)
        box["buf"] = bytes(buf)

    t = threading.Thread(target=waiter)
    t.start()
    ep.send(b"go", 0, tag=1)
    t.join(30)
    return (box.get("buf"), t.is_alive())


def test_waiting_releases_the_gil(pair):
    _, got = pair(gil_released)
    assert got == (b"data", False)
