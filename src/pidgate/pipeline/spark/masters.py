"""What a ``--master`` URL needs before a JVM starts: its kind, a reachability check, the
configuration its kind requires, and the address the driver should advertise.

* :func:`is_local`: ``local``, ``local[N]``, ``local-cluster[...]``: embedded Spark.
* :func:`check_master`: a ``spark://`` master must accept a TCP connection within
  ``connect_timeout_s`` (one line instead of a minute of registration retries and Java traces);
  ``yarn`` needs ``HADOOP_CONF_DIR`` or ``YARN_CONF_DIR``; ``k8s://`` needs a container image
  (``spark.kubernetes.container.image``). Raises :class:`InputError`.
* :func:`driver_host_for`: the local address that routes to the master's host (a UDP
  ``connect`` sends nothing; it only asks the kernel for the route), the address executors on
  other hosts can connect back to.
* :func:`connect_address` / :func:`check_remote`: the same for a Spark Connect server
  (``--remote sc://HOST:PORT``, port 15002 by default): its TCP port must answer.
* :func:`is_this_host`: whether an address is this machine's (a server there sees its files).

Must not import pyspark.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from urllib.parse import urlparse

from pidgate.pipeline.reading.inputs import InputError

__all__ = [
    "bindable",
    "check_master",
    "check_remote",
    "connect_address",
    "driver_host_for",
    "is_local",
    "is_loopback",
    "is_this_host",
    "spark_master_addresses",
]

_STANDALONE_PORT = 7077
_CONNECT_PORT = 15002


def is_local(master: str) -> bool:
    """True for the embedded masters (``local``, ``local[*]``, ``local-cluster[...]``)."""
    return master == "local" or master.startswith(("local[", "local-"))


def spark_master_addresses(master: str) -> list[tuple[str, int]]:
    """(host, port) of each master in ``spark://h1:p1,h2:p2`` (HA lists several)."""
    addresses = []
    for part in master.removeprefix("spark://").split(","):
        parsed = urlparse(f"spark://{part.strip()}")
        if parsed.hostname:
            addresses.append((parsed.hostname, parsed.port or _STANDALONE_PORT))
    return addresses


def bindable(address: str) -> bool:
    """True when a socket can bind ``address`` (an address of one of this host's interfaces)."""
    try:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def is_this_host(host: str) -> bool:
    """True when ``host`` is this machine (loopback, or an address of one of its interfaces)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    addresses = {str(info[4][0]) for info in infos}
    return bool(addresses) and all(is_loopback(a) or bindable(a) for a in addresses)


def _reachable(host: str, port: int, timeout_s: float) -> str | None:
    """None when ``host:port`` accepts a connection, else the reason."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as error:
        return error.strerror or str(error)


def connect_address(remote: str) -> tuple[str, int] | None:
    """(host, port) of a Spark Connect URL ``sc://HOST[:PORT][/;param=value...]``; None when
    it is not one."""
    if not remote.startswith("sc://"):
        return None
    try:
        parsed = urlparse(remote.split(";", 1)[0])
        port = parsed.port or _CONNECT_PORT
    except ValueError:
        return None
    return (parsed.hostname, port) if parsed.hostname else None


def check_remote(remote: str, connect_timeout_s: float = 5.0) -> tuple[str, int]:
    """The (host, port) of the Spark Connect server ``remote``; raise :class:`InputError` when
    the URL is not one or nothing answers there."""
    address = connect_address(remote)
    if address is None:
        raise InputError(f"--remote {remote}: not a Spark Connect URL (sc://HOST:15002)")
    reason = _reachable(*address, connect_timeout_s)
    if reason:
        raise InputError(
            f"--remote {remote}: no Spark Connect server answers at {address[0]}:{address[1]} "
            f"({reason}); is the server running, and is the host and port right?"
        )
    return address


def check_master(
    master: str, conf: Mapping[str, str], env: Mapping[str, str], connect_timeout_s: float = 5.0
) -> None:
    """Raise :class:`InputError` when ``master`` cannot work as configured (see module doc)."""
    if master.startswith("spark://"):
        addresses = spark_master_addresses(master)
        if not addresses:
            raise InputError(f"--master {master}: no host in the URL (spark://HOST:7077)")
        reasons = [_reachable(host, port, connect_timeout_s) for host, port in addresses]
        if all(reasons):
            raise InputError(
                f"--master {master}: no Spark master answers there ({reasons[0]}); "
                "is the master running, and is the host and port right?"
            )
    elif master == "yarn" or master.startswith("yarn-"):
        if not (env.get("HADOOP_CONF_DIR") or env.get("YARN_CONF_DIR")):
            raise InputError(
                f"--master {master}: set HADOOP_CONF_DIR or YARN_CONF_DIR to the directory "
                "holding the cluster's yarn-site.xml and core-site.xml"
            )
    elif master.startswith("k8s://") and not conf.get("spark.kubernetes.container.image"):
        raise InputError(
            f"--master {master}: name the executors' image with --conf "
            "spark.kubernetes.container.image=IMAGE (Spark with Python 3.11)"
        )


def driver_host_for(master: str) -> str | None:
    """The local address that routes to the (first) standalone master's host; None for other
    masters or when there is no route."""
    addresses = spark_master_addresses(master) if master.startswith("spark://") else []
    for host, port in addresses:
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(sockaddr)
                return str(probe.getsockname()[0])
        except OSError:
            continue
    return None
