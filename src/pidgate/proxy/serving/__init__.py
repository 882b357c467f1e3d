"""Serving bytes: one client connection and its upstream broker connection, from the frame read
off the client socket to the response written back (connection, flow control, ordering), plus
where connections go (routing), who they are (identity) and how they are encrypted (TLS).

May import ``pidgate.proxy.operations``, ``pidgate.proxy.quota_control``, ``pidgate.proxy.logs``
and the pure packages; never the server that assembles it.
"""
