"""The operator's network allowlist: which URLs a cell may reach, and which addresses it may
never reach unless the operator names them.

An entry is ``http://HOST`` or ``https://HOST``, with an optional ``:PORT`` (without one, the
scheme's own port only). HOST is a name (``api.example.com``), a wildcard over the names below
one (``*.example.com``: ``a.example.com`` and ``a.b.example.com``, not ``example.com`` itself),
or an address (``127.0.0.1``, ``[::1]``). Nothing else: no path, no user, no bare ``*``, no
wildcard over a single label (``*.com``), so that one entry can never grant the whole web.

A request passes two checks. Its URL's scheme, host and port must match an entry. Then the
name is resolved on the host and every address is judged: an address that is not public
(loopback, private, link-local, cloud metadata, shared, reserved) is refused unless the
allowlist names that very address, with the scheme and port; listing a *name* grants only
the public addresses it resolves to. So an allowed name whose DNS answer is changed to
127.0.0.1 or 169.254.169.254 (DNS rebinding, SSRF) is refused, and the connection is then made
to the address checked, never to a second lookup.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_ENTRY = re.compile(
    r"^(?P<scheme>[A-Za-z]+)://(?P<host>\[[^\]]*\]|[^/:?#@\[\]]*)(?::(?P<port>[0-9]{1,5}))?/?$"
)
# well-known metadata services, named in refusals (each is also refused as non-public)
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(text)
    for text in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class RuleError(ValueError):
    """An allowlist entry the kernel refuses, or a URL that cannot be checked."""


@dataclass(frozen=True)
class Rule:
    """One allowlist entry: ``host`` is a lowercase ASCII name (without the ``*.`` of a
    wildcard) or an address's text."""

    scheme: str
    host: str
    port: int
    wildcard: bool = False
    address: IPAddress | None = None

    def __str__(self) -> str:
        host = (
            f"[{self.host}]"
            if self.address is not None and self.address.version == 6
            else self.host
        )
        shown = f"{self.scheme}://{'*.' if self.wildcard else ''}{host}"
        return shown if self.port == DEFAULT_PORTS[self.scheme] else f"{shown}:{self.port}"

    def matches(self, scheme: str, host: str, port: int) -> bool:
        if (scheme, port) != (self.scheme, self.port):
            return False
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host


def as_address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def canonical_host(raw: str) -> str:
    """A URL's host as rules compare it: an address's canonical text, or a lowercase ASCII
    (IDNA) name without a trailing dot. Raises RuleError for anything else."""
    text = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw
    address = as_address(text)
    if address is not None:
        return str(address)
    name = text.rstrip(".")
    try:
        name = name.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise RuleError(f"{raw!r} is not a valid host name") from None
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise RuleError(f"{raw!r} is not a valid host name")
    return name


def parse_rule(entry: str) -> Rule:
    """One allowlist entry, checked; raises RuleError saying what is wrong with it."""
    match = _ENTRY.match(entry.strip()) if isinstance(entry, str) else None
    if match is None:
        raise RuleError(
            f"{entry!r} is not SCHEME://HOST[:PORT] (http or https, a host name, *.domain or"
            " an address, an optional port, nothing after it)"
        )
    scheme = match["scheme"].lower()
    if scheme not in DEFAULT_PORTS:
        raise RuleError(f"{entry!r}: only http:// and https:// can be allowed")
    port = int(match["port"]) if match["port"] else DEFAULT_PORTS[scheme]
    if not 0 < port < 65536:
        raise RuleError(f"{entry!r}: the port must be from 1 to 65535")
    host = match["host"]
    wildcard = host.startswith("*.")
    if wildcard:
        host = host[2:]
    if "*" in host:
        raise RuleError(f"{entry!r}: a wildcard may only stand first, as in *.example.com")
    host = canonical_host(host)
    address = as_address(host)
    if wildcard and (address is not None or "." not in host):
        raise RuleError(
            f"{entry!r}: a wildcard must cover the names below a domain of two labels or more"
            " (*.example.com), never a top-level domain or an address"
        )
    return Rule(scheme, host, port, wildcard, address)


def parse_rules(entries: list[str] | tuple[str, ...]) -> tuple[Rule, ...]:
    return tuple(parse_rule(entry) for entry in entries)


def non_public(address: IPAddress) -> str | None:
    """What makes ``address`` one a cell must not reach unless it is listed, or None for a
    public address. IPv4 addresses carried inside IPv6 ones are judged as themselves."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        elif address in _NAT64:
            address = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in METADATA_ADDRESSES:
        return "a cloud metadata service's address"
    if address.is_loopback:
        return "a loopback address (this machine)"
    if address.is_unspecified:
        return "the unspecified address (which reaches this machine)"
    if address.is_link_local:
        return "a link-local address (where cloud metadata services answer)"
    if address.is_multicast or address.is_reserved:
        return "a reserved address"
    if address.is_private:
        return "a private-network address"
    if not address.is_global:
        return "a non-public address"
    return None


@dataclass(frozen=True)
class Target:
    """A checked request URL: what to connect to and what to ask for."""

    scheme: str
    host: str  # canonical (see canonical_host)
    port: int
    path: str  # path and query, as sent in the request line
    rule: Rule

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


class Allowlist:
    """The operator's entries, and the checks every request passes."""

    def __init__(self, entries: list[str] | tuple[str, ...]):
        self.rules = parse_rules(entries)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def __str__(self) -> str:
        return ", ".join(map(str, self.rules))

    def target(self, url: str) -> Target:
        """The URL's target if an entry allows it; raises RuleError saying why not."""
        try:
            parts: SplitResult = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise RuleError(f"{url!r} is not a valid URL ({exc})") from None
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS:
            raise RuleError(f"only http:// and https:// URLs can be fetched, not {url!r}")
        if "@" in parts.netloc:
            raise RuleError("a URL with credentials in it (user@host) is not sent")
        if not parts.hostname:
            raise RuleError(f"{url!r} names no host")
        host = canonical_host(parts.hostname)
        port = port if port is not None else DEFAULT_PORTS[scheme]
        for rule in self.rules:
            if rule.matches(scheme, host, port):
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                return Target(scheme, host, port, path, rule)
        origin = f"{scheme}://{host if ':' not in host else f'[{host}]'}:{port}"
        raise RuleError(f"{origin} is not on this kernel's network allowlist")

    def names_address(self, target: Target, address: IPAddress) -> bool:
        """Whether an entry names this very address, with the target's scheme and port."""
        return any(
            rule.address == address and (rule.scheme, rule.port) == (target.scheme, target.port)
            for rule in self.rules
        )

    def address_refusal(self, target: Target, address: IPAddress) -> str | None:
        """Why the request must not go to ``address``, or None."""
        kind = non_public(address)
        if kind is None or self.names_address(target, address):
            return None
        listed = f"{target.scheme}://{address if address.version == 4 else f'[{address}]'}"
        if target.port != DEFAULT_PORTS[target.scheme]:
            listed += f":{target.port}"
        return (
            f"{target.host} resolves to {address}, {kind}, which the allowlist does not name"
            f" (only an entry {listed} would allow it)"
        )
