"""The healer's leader election: the generic Lease election of ``hcs_bus.leases``
on the Lease named by settings.healer (``lease_name``, ``lease_namespace`` and
the term lengths)."""

from __future__ import annotations

from hcs_bus.leases import Leader, Observed, expired, lease_body

__all__ = ["Leader", "Observed", "expired", "lease_body"]
