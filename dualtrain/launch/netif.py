"""Which local network interface reaches an address (framework-free, Linux first).

Gloo picks the interface a worker listens on by resolving the machine's hostname unless
``GLOO_SOCKET_IFNAME`` names one. On many hosts (containers, VMs, network namespaces) the hostname
resolves to 127.0.0.1, and every peer is then told to connect to its own loopback: the ranks of a
multi-host run time out in "connectFullMesh ... remote=[127.0.0.1]". dualtrain instead picks the
interface the kernel routes ``MASTER_ADDR`` through, which is the network the peers share with the
rendezvous host. An explicit ``GLOO_SOCKET_IFNAME`` always wins.
"""

from __future__ import annotations

import socket
import struct

_SIOCGIFADDR = 0x8915


def route_source(addr: str, port: int = 9) -> str | None:
    """The local IPv4 address the kernel would send from to reach ``addr`` (no packet is sent:
    connecting a UDP socket only chooses a route). None if ``addr`` does not resolve or has no
    route."""
    try:
        infos = socket.getaddrinfo(addr, port, socket.AF_INET, socket.SOCK_DGRAM)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(infos[0][4])
            return s.getsockname()[0]
    except (OSError, IndexError):
        return None


def interface_addresses() -> dict[str, str]:
    """{interface name: its IPv4 address} for the interfaces that have one (Linux ioctl)."""
    try:
        import fcntl  # lazy: optional (Unix only)
    except ImportError:  # not Unix
        return {}
    out: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(
                    s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode())
                )
            except OSError:  # no IPv4 address on this interface
                continue
            out[name] = socket.inet_ntoa(packed[20:24])
    return out


def route_interface(addr: str) -> tuple[str, str] | None:
    """(interface name, local address) through which this host reaches ``addr``; None if unknown."""
    source = route_source(addr)
    if source is None:
        return None
    for name, address in interface_addresses().items():
        if address == source:
            return name, source
    return None


def listen_address(master_addr: str) -> str | None:
    """The one address the rendezvous host should listen on for ``master_addr``: the address the
    user named when it is this host's (a loopback address, or an address of one of its interfaces).
    None when the name does not resolve to one of them unambiguously (a host name that resolves to
    127.0.1.1 on its own host, as Debian's /etc/hosts does): then listen on every interface, as
    torch and TF do by default, so the peers can still connect."""
    try:
        infos = socket.getaddrinfo(master_addr, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    addresses = {str(info[4][0]) for info in infos}  # AF_INET: (host, port), the host a str
    if len(addresses) != 1:
        return None
    (address,) = addresses
    named_loopback = master_addr == "localhost" or master_addr.startswith("127.")
    if address.startswith("127."):
        return address if named_loopback else None
    return address if address in interface_addresses().values() else None
