"""``python -m lockstep_bench.pingpong [MESSAGES]``: the floor of the shared-memory transport's wake-ups.

Two Python processes exchange 12-byte frames over a unix ``SOCK_SEQPACKET`` socketpair, as an actor and the
learner's shared-memory server do, with no other work: the client sends a frame and blocks in ``recv`` for
the answer; the server answers each frame either

    blocking   in a plain ``recv``/``send`` loop, or
    asyncio    on an event loop, the way ``transport.shm.server._Peer`` reads: a ``recv`` that would
               block, a future, a reader callback that receives the frame and sets the future's result.

Reports round trips per second and the server's CPU per message (``time.process_time``: the server process
runs only this), the second being what the learner's per-message figure of ``lockstep_bench.parts`` can be
compared with.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time

FRAME = b"\0" * 12


def measure(messages: int, mode: str) -> dict[str, float]:
    """One ping-pong of ``messages`` round trips; ``mode``: "blocking" or "asyncio"."""
    server, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # the client: send, wait for the answer
        server.close()
        try:
            for _ in range(messages):
                client.send(FRAME)
                client.recv(64)
        finally:
            os._exit(0)
    client.close()
    try:
        wall, cpu = _blocking(server, messages) if mode == "blocking" else asyncio.run(_asyncio(server, messages))
    finally:
        os.waitpid(pid, 0)
        server.close()
    return {"mode": mode, "messages": messages, "round_trips_per_s": round(messages / wall),
            "server_cpu_us_per_message": round(1e6 * cpu / messages, 1)}


def _blocking(sock: socket.socket, messages: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(messages):
        sock.recv(64)
        sock.send(FRAME)
    return time.perf_counter() - wall, time.process_time() - cpu


async def _asyncio(sock: socket.socket, messages: int) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    waiter: list[asyncio.Future] = []

    def readable() -> None:
        if waiter and not waiter[0].done():
            try:
                waiter[0].set_result(sock.recv(64))
            except BlockingIOError:
                pass

    loop.add_reader(sock.fileno(), readable)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        for _ in range(messages):
            try:
                sock.recv(64)
            except BlockingIOError:
                waiter.append(loop.create_future())
                await waiter[0]
                waiter.clear()
            sock.send(FRAME)
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        loop.remove_reader(sock.fileno())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    messages = int(argv[0]) if argv else 20_000
    for mode in ("blocking", "asyncio"):
        row = measure(messages, mode)
        print(f"{mode}: {row['round_trips_per_s']:,} round trips/s, {row['server_cpu_us_per_message']} µs of "
              "server CPU per message")
    return 0


if __name__ == "__main__":
    sys.exit(main())
