"""Room for a simulated fleet's connections: the process's open-file limit.

Every simulated device holds one socket to the broker, and the embedded broker one per device:
both processes need an open-file limit above the fleet's size. The soft limit is raised as far as
the hard limit allows before the broker starts (it inherits the limit); a hard limit too low for
the fleet is a one-line error that says how to raise it.
"""

from __future__ import annotations

import resource

__all__ = ["OTHER_FILES", "ensure_open_files"]

#: Files a process needs besides the devices' sockets (the coordinator's, logs, torch, the dataset).
OTHER_FILES = 512


def ensure_open_files(connections: int) -> int:
    """Raise the soft open-file limit to hold ``connections`` sockets besides `OTHER_FILES`;
    returns the limit now in force. ValueError when the hard limit is below what is needed."""
    need = connections + OTHER_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ValueError(f"{connections} simulated devices need about {need} open files in this process and in the "
                         f"broker's; this machine allows {hard} (ulimit -Hn): raise it (e.g. LimitNOFILE= in a "
                         f"systemd unit, nofile in /etc/security/limits.conf), or use --backend ray, which spreads "
                         f"the devices over processes")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return need
