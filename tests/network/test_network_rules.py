"""The network allowlist's grammar and checks, without a kernel: which entries the setting
refuses, which URLs an entry allows, and which addresses are refused unless listed."""

from __future__ import annotations

import ipaddress

import pytest
from traitlets import TraitError

from wasm_kernel.guest.modules import _wasm_kernel_sandbox
from wasm_kernel.network import network
from wasm_kernel.network.network_rules import Allowlist, RuleError, non_public, parse_rule
from wasm_kernel.settings.kernel_settings import KernelSettings

pytestmark = pytest.mark.nokernel


@pytest.mark.parametrize(
    ("entry", "shown"),
    [
        ("https://api.example.com", "https://api.example.com"),
        ("HTTPS://API.Example.COM/", "https://api.example.com"),
        ("http://api.example.com:80", "http://api.example.com"),
        ("http://api.example.com:8080", "http://api.example.com:8080"),
        ("https://*.example.com", "https://*.example.com"),
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://[::1]:8000", "http://[::1]:8000"),
        ("https://bücher.example", "https://xn--bcher-kva.example"),
    ],
)
def test_entries_accepted_and_normalised(entry, shown):
    assert str(parse_rule(entry)) == shown


@pytest.mark.parametrize(
    "entry",
    [
        "*",
        "example.com",  # no scheme
        "ftp://example.com",
        "https://*",
        "https://*.com",  # a whole top-level domain
        "https://a.*.example.com",
        "https://*.127.0.0.1",
        "https://example.com/path",
        "https://example.com?q=1",
        "https://user@example.com",
        "https://example.com:0",
        "https://example.com:65536",
        "https://example.com:http",
        "https://exa mple.com",
        "https://-bad-.example.com",
        "https://",
        "https://[::1",
        "",
    ],
)
def test_entries_refused(entry):
    with pytest.raises(RuleError):
        parse_rule(entry)


def test_the_setting_refuses_a_bad_entry_and_names_it():
    settings = KernelSettings()
    assert settings.network_allow == []  # empty by default: no network
    with pytest.raises(TraitError, match=r"network_allow: '\*'"):
        settings.network_allow = ["https://example.com", "*"]
    settings.network_allow = ["https://example.com", "http://127.0.0.1:8000"]
    assert settings.network_allow == ["https://example.com", "http://127.0.0.1:8000"]


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://api.example.com/v1?q=1", True),
        ("https://API.EXAMPLE.COM./v1", True),
        ("http://api.example.com/v1", False),  # another scheme
        ("https://api.example.com:8443/", False),  # another port
        ("https://a.cdn.example.com/x", True),
        ("https://a.b.cdn.example.com/x", True),
        ("https://cdn.example.com/x", False),  # the wildcard covers the names below only
        ("https://evilcdn.example.com/x", False),
        ("https://cdn.example.com.evil.org/x", False),
        ("http://127.0.0.1:8000/", True),
        ("http://127.0.0.1:8001/", False),
        ("http://localhost:8000/", False),  # a name is not its address
        ("https://user:pw@api.example.com/", False),
        ("file:///etc/passwd", False),
        ("https://api.example.com:99999/", False),
    ],
)
def test_urls_against_the_list(url, allowed):
    allowlist = Allowlist(
        ["https://api.example.com", "https://*.cdn.example.com", "http://127.0.0.1:8000"]
    )
    if allowed:
        assert allowlist.target(url).rule is not None
    else:
        with pytest.raises(RuleError):
            allowlist.target(url)


def test_target_keeps_path_and_query_and_names_its_host():
    target = Allowlist(["http://[::1]:8000"]).target("http://[::1]:8000/a/b?x=1#frag")
    assert (target.host, target.port, target.path) == ("::1", 8000, "/a/b?x=1")
    assert target.host_header == "[::1]:8000"


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd12::1", "private"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.100.100.200", "metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("224.0.0.1", "reserved"),
        ("100.64.0.1", "non-public"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4 inside IPv6 is judged as itself
        ("64:ff9b::a9fe:a9fe", "metadata"),  # NAT64 of 169.254.169.254
        ("93.184.215.14", None),
        ("2606:4700::1111", None),
    ],
)
def test_non_public_addresses(address, kind):
    found = non_public(ipaddress.ip_address(address))
    if kind is None:
        assert found is None
    else:
        assert found is not None and kind in found


def test_a_non_public_address_passes_only_when_listed_itself():
    allowlist = Allowlist(["http://localhost:8000", "http://127.0.0.1:9000"])
    loopback = ipaddress.ip_address("127.0.0.1")
    by_name = allowlist.target("http://localhost:8000/")
    refusal = allowlist.address_refusal(by_name, loopback)
    assert refusal is not None
    assert "localhost resolves to 127.0.0.1" in refusal and "http://127.0.0.1:8000" in refusal
    listed = allowlist.target("http://127.0.0.1:9000/")
    assert allowlist.address_refusal(listed, loopback) is None
    public = ipaddress.ip_address("93.184.215.14")
    assert allowlist.address_refusal(by_name, public) is None


def test_the_hosts_no_network_text_is_the_guests():
    """Refused with an empty list, a request says what the guest's own refusals say, so the
    shell's hint (how data gets in) follows it too."""
    assert network.NO_NETWORK == _wasm_kernel_sandbox.NO_NETWORK


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # traitlets prefers repeated options
def test_the_client_passes_the_list_as_one_literal():
    """Session(network_allow=[...]) reaches the kernel as one JSON list on its command line."""
    from wasm_kernel.client import kernel_arguments

    given = ["https://api.example.com", "http://127.0.0.1:8000"]
    [argument] = kernel_arguments("strict", {"network_allow": given})
    name, _, value = argument.partition("=")
    assert name == "--WasmKernel.network_allow"
    assert KernelSettings(config=_config(value)).network_allow == given


def _config(value: str):  # type: ignore[no-untyped-def]
    from traitlets.config import KVArgParseConfigLoader

    argv = [f"--KernelSettings.network_allow={value}"]
    loader = KVArgParseConfigLoader(argv, classes=[KernelSettings])  # as the kernel's app reads
    return loader.load_config()
