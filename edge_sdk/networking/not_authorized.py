"""The broker's "Not authorized": its ACL will not let this client publish where it must, so
retrying cannot help (the command exits 3, which the systemd units do not restart). Apart from
transport.py so that the command line catches it without importing paho."""

from __future__ import annotations

__all__ = ["NotAuthorized"]


class NotAuthorized(PermissionError):
    """Raised where a refused publish stops the work (the coordinator's fleet)."""
