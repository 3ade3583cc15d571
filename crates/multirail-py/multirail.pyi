"""multirail: several network links as one ordered, reliable message channel.

Type stubs of the compiled module (docs/python.md has the guide).
"""

from types import TracebackType
from typing import Any, Dict, List, Optional, Sequence, Type

from typing_extensions import Buffer

__version__: str

ANY_SOURCE: int
"""Matches a message from any source (`source` of a receive): -1."""
ANY_TAG: int
"""Matches a message with any tag (`tag` of a receive): -1."""

class Error(Exception):
    """Any failure of multirail (the message says what and why)."""

class ConfigError(Error):
    """A setting or argument is invalid (the message names it)."""

class SetupError(Error):
    """The ranks could not meet or a rail could not be connected."""

class PeerFailedError(Error):
    """Every rail to the peer is down."""

class PeerClosedError(Error):
    """The peer closed its endpoint."""

class TruncatedError(Error):
    """The message was longer than the buffer; nothing was written to it."""

    source: int
    tag: int
    length: int
    """The message's full length in bytes."""
    buffer_len: int

class NoSuchPeerError(Error):
    """No such rank (or this rank itself)."""

class ShutdownError(Error):
    """The endpoint is closed."""

class Status:
    """Who sent a received message, its tag and its length in bytes."""

    @property
    def source(self) -> int: ...
    @property
    def tag(self) -> int: ...
    @property
    def len(self) -> int: ...

class Buffer:
    """Memory of multirail's that receives fill in place (no copy).

    Use it through numpy: a = np.asarray(multirail.Buffer(nbytes)) (uint8;
    a.view(np.float64) for another type), then receive into a (or a view
    of all of it)."""

    def __init__(self, nbytes: int) -> None: ...
    def __len__(self) -> int: ...
    @property
    def __array_interface__(self) -> Dict[str, Any]: ...

class Request:
    """A send or receive in progress (from Endpoint.isend / irecv)."""

    @property
    def in_place(self) -> bool:
        """A receive that lands in a Buffer's memory without a copy."""

    def test(self) -> bool:
        """True once the request finished (then wait() returns at once)."""
    def wait(self) -> Optional[Status]:
        """Waits (the GIL released): None for a send, the Status of a
        receive. A failure raises, again on every later call."""

class Endpoint:
    """One process's endpoint of a job of `size` ranks."""

    def __init__(
        self,
        rails: Optional[str] = None,
        rank: int = 0,
        size: int = 1,
        root: Optional[str] = None,
        key: Optional[str] = None,
    ) -> None:
        """Explicit rails ("tcp:127.0.0.1,tcp:127.0.0.2"; None: default),
        rank of size, and root ("host:port": rank 0 listens there, the
        others connect; needed when size > 1). Other settings come from
        MULTIRAIL_* variables."""
    @staticmethod
    def from_env() -> Endpoint:
        """Under `multirail run`, mpirun or srun: everything from the
        environment, as the multirail command does."""
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def rail_names(self) -> List[str]: ...
    def send(self, buf: Buffer, dest: int, tag: int = 0) -> None:
        """Sends any contiguous buffer; returns once it may be reused."""
    def recv(self, buf: Buffer, source: int = ..., tag: int = ...) -> Status:
        """Receives into a writable contiguous buffer."""
    def isend(self, buf: Buffer, dest: int, tag: int = 0) -> Request:
        """Starts a send; don't change buf until the request is waited for."""
    def irecv(self, buf: Buffer, source: int = ..., tag: int = ...) -> Request:
        """Posts a receive; don't touch buf until the request is waited for."""
    @staticmethod
    def wait_all(requests: Sequence[Request]) -> List[Optional[Status]]:
        """Waits for every request; raises the first failure at the end."""
    def barrier(self) -> None: ...
    def close(self) -> None:
        """Waits until everything sent was delivered, closes the rails.
        Refused while requests are pending; closing twice is fine."""
    def __enter__(self) -> Endpoint: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None: ...
