"""The same-host transport's wire: one shared-memory region per actor connection, and the small
frames both ends exchange on a unix SOCK_SEQPACKET socket (one ``send`` is one ``recv``).

Used by the learner (``shm.py``) and the actor (``shm_client.py``); numpy and the standard library only.

The conversation on one connection:

    actor                                         learner
    HELLO header (magic, length), then the
    ``pb.Hello`` bytes in chunks           ──▶    checks it like the gRPC server, asks ``ActorHandler.connect``
                                           ◀──    WELCOME + ``pb.Welcome`` bytes, and the region's file
                                                  descriptor (SCM_RIGHTS); or REFUSED + code + message
    writes the step into the region,
    then a STEP frame (kind, m, e)         ──▶    copies the step out of the region, validates the copies
                                           ◀──    ACTION (actions written into the region first), RETRY,
                                                  OVER (training is over) or REFUSED; each with the version

Who writes what, when (one request in flight, strictly alternating):

* The actor writes every field but ``actions``, only between receiving a reply (or the welcome)
  and sending its next STEP frame; then the fields belong to the learner until the reply.
* The learner writes only ``actions``, only before sending an ACTION reply; the actor reads them
  after receiving it. The learner never reads ``actions``, so a client that scribbles on them
  harms only itself.
* The learner copies what it reads before validating it: a hostile client could change the
  region at any time, but not the copies.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import mmap
import os
import struct
import tempfile
from dataclasses import dataclass

import numpy as np

from lockstep.envs import SpaceSpec
from lockstep.transport.codec import ALLOWED_DTYPES, CodecError

SCHEME = "unix:"  # the address of a same-host learner: unix:/path/to/socket
HELLO_MAGIC = b"LKS1"  # the first four bytes of the first message: a lockstep actor of this wire version
HELLO = struct.Struct("<4sI")  # magic, length of the pb.Hello bytes that follow in chunks
CHUNK = 32 * 1024  # largest hello chunk: far below the smallest socket buffer a SEQPACKET message must fit in
STEP = struct.Struct("<III")  # STEP_KIND, final observations m, finished episodes e
STEP_KIND = 0x53544550  # b"STEP" read as little-endian u32: a frame that is not a step is seen at once
REPLY = struct.Struct("<Iq")  # reply kind, policy version; WELCOME and REFUSED carry bytes after it
WELCOME, ACTION, RETRY, OVER, REFUSED = range(1, 6)
MAX_REPLY = 64 * 1024  # a reply's header and bytes: the welcome, or a refusal's code and message
ALIGN = 64  # each field starts on its own cache line


def is_local(address: str) -> bool:
    """Whether ``address`` names a same-host learner (``unix:/path``) rather than a gRPC host:port."""
    return address.startswith(SCHEME)


def refusal(code: str, message: str) -> bytes:
    """A REFUSED frame: the header, then ``code`` and ``message`` (UTF-8, NUL between), bounded in size."""
    body = code.encode() + b"\0" + message.encode(errors="replace")
    return REPLY.pack(REFUSED, 0) + body[:MAX_REPLY - REPLY.size]


def parse_refusal(body: bytes) -> tuple[str, str]:
    code, _, message = body.partition(b"\0")
    return code.decode(errors="replace"), message.decode(errors="replace")


@dataclass(frozen=True)
class Field:
    offset: int
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class Layout:
    """Where each field of one actor's region lives; both ends compute it from (k, spaces).

    Capacities are per step: k observations, k final observations (at most one per env) and k
    finished episodes (an env finishes at most one episode per step). A Dict or Tuple observation has a
    field per leaf (``obs/PATH`` [k, *leaf] and ``final_obs/PATH``, in the leaves' order) instead of
    ``obs`` and ``final_obs``: each leaf in its own dtype, as on the gRPC wire.
    """

    def __init__(self, num_envs: int, observation: SpaceSpec, action: SpaceSpec) -> None:
        for path, leaf in observation.leaf_specs():
            if leaf.dtype not in ALLOWED_DTYPES:
                where = f" leaf {path!r}" if path else ""
                raise CodecError(f"hello.observation_space{where}: dtype {leaf.dtype!r} is not one of "
                                 f"{sorted(ALLOWED_DTYPES)}")
        k = num_envs
        self.observation = observation
        obs = [(f"obs/{path}" if path else "obs", np.dtype(leaf.dtype), (k, *leaf.shape))
               for path, leaf in observation.leaf_specs()]
        wanted = [
            ("actions", action.action_dtype, (k, *action.element_shape)),  # the learner's, all others the actor's
            *obs,
            ("reward", np.dtype(np.float32), (k,)),
            ("terminated", np.dtype(np.bool_), (k,)),
            ("truncated", np.dtype(np.bool_), (k,)),
            ("final_index", np.dtype(np.int64), (k,)),
            *((f"final_{name}", dtype, shape) for name, dtype, shape in obs),
            ("episode_return", np.dtype(np.float64), (k,)),
            ("episode_length", np.dtype(np.int64), (k,)),
        ]
        self.num_envs = k
        self.fields: dict[str, Field] = {}
        offset = 0
        for name, dtype, shape in wanted:
            self.fields[name] = field = Field(offset, dtype, shape)
            offset += -(-field.nbytes // ALIGN) * ALIGN
        self.size = max(offset, ALIGN)


def create_memory(size: int) -> int:
    """A file descriptor of ``size`` bytes of anonymous shared memory that nothing names.

    Linux: a memfd sealed against shrinking and growing, so a client holding it cannot truncate it
    under the learner's mapping (a read past the end of a mapped file is SIGBUS). Elsewhere: an
    unlinked temporary file, without that protection.
    """
    try:
        fd = os.memfd_create("lockstep-actor", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError):
        with tempfile.TemporaryFile() as f:  # unlinked at once; the dup keeps it alive
            fd = os.dup(f.fileno())
        os.ftruncate(fd, size)
        return fd
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except OSError:
        os.close(fd)
        raise
    return fd


class Region:
    """A mapping of one actor's shared memory with a numpy view per field of its ``Layout``."""

    actions: np.ndarray  # [k, *act]: written by the learner
    obs: np.ndarray  # [k, *obs]: this and the rest written by the actor
    reward: np.ndarray  # [k]
    terminated: np.ndarray  # [k]
    truncated: np.ndarray  # [k]
    final_index: np.ndarray  # [k], the first m used
    final_obs: np.ndarray  # [k, *obs], the first m used
    episode_return: np.ndarray  # [k], the first e used
    episode_length: np.ndarray  # [k], the first e used

    def __init__(self, fd: int, layout: Layout) -> None:
        size = os.fstat(fd).st_size
        if size != layout.size:
            raise ValueError(f"the shared memory has {size} bytes, the layout needs {layout.size}; "
                             "run the same lockstep version on the learner and the actor")
        self.layout = layout
        self._map = mmap.mmap(fd, layout.size)  # MAP_SHARED: both processes see the same pages
        self.views = {name: np.ndarray(f.shape, f.dtype, buffer=self._map, offset=f.offset)
                      for name, f in layout.fields.items()}
        self.__dict__.update(self.views)  # region.obs, region.actions, ...

    def leaves(self, name: str) -> list[np.ndarray]:
        """The views of field ``name`` (``obs`` or ``final_obs``) of each observation leaf, in the leaves' order."""
        return [self.views[f"{name}/{path}" if path else name] for path, _ in self.layout.observation.leaf_specs()]

    def close(self) -> None:
        for name in self.views:
            del self.__dict__[name]
        self.views = {}
        with contextlib.suppress(BufferError):  # a view someone still holds: the mapping goes with it
            self._map.close()
