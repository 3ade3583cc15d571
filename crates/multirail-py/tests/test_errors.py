"""Errors become exceptions of the multirail.Error hierarchy with the Rust
message; truncation is its own exception."""

import multirail
import pytest


def truncated(ep):
    if ep.rank == 0:
        ep.send(b"0123456789", 1, tag=9)
        ep.send(b"after", 1, tag=10)
        ep.send(bytes(1 << 20), 1, tag=11)
        return None
    out = []
    buf = bytearray(b"untouched")[:4]
    try:
        ep.recv(buf, 0, 9)
    except multirail.TruncatedError as e:
        out.append((e.source, e.tag, e.length, e.buffer_len, str(e), bytes(buf)))
    # The endpoint goes on working.
    ok = bytearray(8)
    st = ep.recv(ok, 0, 10)
    out.append(bytes(ok[: st.len]))
    req = ep.irecv(bytearray(100), 0, 11)
    with_req = []
    for _ in range(2):  # raised again by a second wait
        try:
            req.wait()
        except multirail.TruncatedError as e:
            with_req.append((e.length, isinstance(e, multirail.Error)))
    out.append(with_req)
    return out


def test_truncation_raises_truncated_error_and_writes_nothing(pair):
    _, got = pair(truncated)
    (src, tag, length, buf_len, msg, buf), after, with_req = got
    assert (src, tag, length, buf_len) == (0, 9, 10, 4)
    assert "10 bytes" in msg and "4-byte buffer" in msg
    assert buf == b"unto"
    assert after == b"after"
    assert with_req == [(1 << 20, True), (1 << 20, True)]


def bad_calls(ep):
    out = {}

    def catch(name, f):
        try:
            f()
            out[name] = None
        except Exception as e:  # the test looks at type and message
            out[name] = (type(e).__name__, str(e))

    catch("no-such-peer", lambda: ep.send(b"x", 5))
    catch("to-self", lambda: ep.send(b"x", ep.rank))
    catch("negative-dest", lambda: ep.send(b"x", -3))
    catch("negative-tag", lambda: ep.send(b"x", 1 - ep.rank, tag=-2))
    catch("tag-too-big", lambda: ep.isend(b"x", 1 - ep.rank, tag=2**63))
    catch("bad-source", lambda: ep.irecv(bytearray(1), source=-7))
    catch("read-only-recv", lambda: ep.recv(b"immutable", 1 - ep.rank))
    catch("not-a-buffer", lambda: ep.send("text", 1 - ep.rank))
    ep.barrier()
    pending = ep.irecv(bytearray(1), 1 - ep.rank, tag=99)
    catch("close-pending", ep.close)
    ep.send(b"!", 1 - ep.rank, tag=99)
    pending.wait()
    return out


def test_misuse_raises_clear_exceptions(pair):
    for out in pair(bad_calls):
        assert out["no-such-peer"] == ("NoSuchPeerError", "no such peer: rank 5")
        assert out["to-self"][0] == "NoSuchPeerError"
        assert out["negative-dest"][0] == "ValueError" and "-3" in out["negative-dest"][1]
        assert out["negative-tag"][0] == "ValueError" and "-2" in out["negative-tag"][1]
        assert out["tag-too-big"][0] == "OverflowError"
        assert out["bad-source"][0] == "ValueError" and "-7" in out["bad-source"][1]
        assert out["read-only-recv"][0] == "BufferError"
        assert out["not-a-buffer"][0] == "TypeError"
        assert out["close-pending"][0] == "Error" and "pending" in out["close-pending"][1]


def test_a_closed_endpoint_raises_shutdown_error():
    ep = multirail.Endpoint("tcp:127.0.0.1")
    assert (ep.rank, ep.size) == (0, 1)
    ep.close()
    ep.close()  # twice is fine
    with pytest.raises(multirail.ShutdownError, match="closed"):
        ep.send(b"x", 0)
    with pytest.raises(multirail.ShutdownError):
        _ = ep.rank


def test_context_manager_closes():
    with multirail.Endpoint("tcp:127.0.0.1") as ep:
        assert ep.size == 1
    assert "closed" in repr(ep)


def test_a_job_without_root_is_a_config_error():
    with pytest.raises(multirail.ConfigError, match="needs root"):
        multirail.Endpoint("tcp:127.0.0.1", 0, 2)


def test_a_bad_rail_names_what_was_typed():
    with pytest.raises(multirail.ConfigError, match="bogus"):
        multirail.Endpoint("bogus:thing")


def test_from_env_outside_a_job_says_how_to_start_one(monkeypatch):
    for v in ("MULTIRAIL_RANK", "MULTIRAIL_SIZE", "MULTIRAIL_ROOT", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(multirail.ConfigError, match="MULTIRAIL_RANK"):
        multirail.Endpoint.from_env()


def test_the_hierarchy():
    for name in ("ConfigError", "SetupError", "PeerFailedError", "PeerClosedError", "TruncatedError",
                 "NoSuchPeerError", "ShutdownError"):
        assert issubclass(getattr(multirail, name), multirail.Error)
    assert issubclass(multirail.Error, Exception)
