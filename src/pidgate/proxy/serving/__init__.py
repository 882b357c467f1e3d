"""Serving bytes: one client connection and its upstream broker connection, from the frame read
off the client socket to the response written back, plus where connections go (routing), who
they are (identity) and how they are encrypted (TLS).

Modules, each importing only those listed after it (``connection`` assembles the rest):

- ``connection``: ``ClientConnection``, its lifecycle and the request path, top to bottom;
- ``express`` (and the compiled ``_express``): the express lane, ``ClientConnection``'s base on
  the compiled path: a busy producer's steady state read and answered in C, everything else
  handed to the Python path as it came;
- ``produce_gate``: a Produce the quota rejected: held for tokens, or answered and muted;
- ``responses``: the response path: broker frames matched to their slots, read when pidgate
  must, written back in request order;
- ``upstream``: the broker side (``UpstreamConnection``) and connecting to it;
- ``records``: per-request records (``Slot``, ``HeldProduce``) and the API keys told apart;
- ``flow_control``: pausing reads (``ReadGate``), connection limits, idle timeout, hang-up probe;
- ``ordering``: an idempotent producer's batches kept in order around a rejection;
- ``context``: what every connection of one proxy shares (``ProxyContext``);
- ``routing``, ``identity``, ``tls``: broker addresses, principals, TLS contexts.

The path of one request: the client's bytes -> ``ClientConnection.buffer_updated`` (frames cut)
-> ``process_inbox`` -> ``_handle_request``: most frames forwarded untouched, a slot owed in
``responses``; a Produce walked and put through the ``Gatekeeper`` (``_produce``), and when
rejected handed to ``produce_gate`` (held, or answered into its slot) -> ``upstream``
``write_frames`` -> the broker. Its answer: ``UpstreamConnection.data_received`` ->
``ResponsePath.on_upstream_frames`` (matched to the oldest slot the broker owes, transformed if
need be) -> ``flush``: every response now first in line, written to the client in one call.
On the compiled path the lane reads first: a read made only of Produce requests of a known PID
with the connection's usual header, while the Python path owes nothing, is forwarded in one
write and its answers written back as they came (``_express.pyx``).

May import ``pidgate.proxy.operations``, ``pidgate.proxy.quota_control``, ``pidgate.proxy.logs``
and the pure packages; never the server that assembles it.
"""
