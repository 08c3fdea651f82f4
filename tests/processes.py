"""What Linux's /proc says of a test's processes: the children a command started, the signals waiting on one."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:  # the command's name, in parentheses, may hold spaces and ")": the fields follow its last ")"
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` was sent to process ``pid`` and waits to be delivered (a stopped process keeps it)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("ShdPnd:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False
