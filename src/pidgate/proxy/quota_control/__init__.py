"""Quota control: which producer IDs are new, who pays for them, and what happens when a
principal is out of tokens (admission, the waiting room, observe mode); which quotas are in force
and how they change live (KIP-546 administration, the state file, the shared store); and what
the rest of the cluster already knows (the PID frontier, fleet sync). ``room`` assembles these
for one proxy (the server builds it); ``cluster_clients`` holds the settings of the clients the
fleet and the shared store open on the cluster.

May import ``pidgate.proxy.logs``, ``pidgate.proxy.upstream_check`` and the pure packages; never
``serving``, ``operations`` or the server, which call it.
"""
