"""The sandbox boundary, probed from cells: no host files, environment, network or processes.

Each probe must fail as an ordinary Python exception (never a crash of the kernel), and
the kernel must answer the next cell. Where possible the host side is checked too: the
secret really is in the kernel process's environment, a server really listens on the port
the guest tries, the host file the guest would create really is absent.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Kernel

from wasm_kernel.runtime.runtime import load_runtime
from wasm_kernel.server.provisioner import ServedKernel

SECRET_NAME = "WASM_KERNEL_TEST_SECRET"
SECRET_VALUE = f"secret-{uuid.uuid4().hex}"
HOST_ONLY_ROOT_ENTRIES = {"etc", "home", "proc"}


@pytest.fixture(scope="module")
def sandboxed() -> Iterator[Kernel]:
    """One kernel for the module, whose host process carries a secret environment variable."""
    started = Kernel(env={SECRET_NAME: SECRET_VALUE})
    yield started
    started.shutdown()


@pytest.fixture(autouse=True)
def kernel_answers_afterwards(sandboxed: Kernel) -> Iterator[None]:
    yield
    run = sandboxed.execute("6 * 7")
    assert run.content["status"] == "ok", run.content
    assert run.result_text() == "42"


def guest_json(kernel: Kernel, code: str):
    """Run ``code``, which must end by printing one JSON document, and decode it."""
    run = kernel.execute(code)
    assert run.content["status"] == "ok", run.content
    return json.loads(run.stream_text())


def test_reading_host_file_fails_with_python_exception(sandboxed: Kernel) -> None:
    assert Path("/etc/passwd").is_file()
    run = sandboxed.execute("open('/etc/passwd').read()")
    assert run.content["status"] == "error"
    assert run.content["ename"] in ("FileNotFoundError", "PermissionError", "OSError")


def test_root_listing_shows_nothing_of_the_host(sandboxed: Kernel) -> None:
    host_entries = set(os.listdir("/"))
    assert host_entries >= HOST_ONLY_ROOT_ENTRIES
    listing = guest_json(
        sandboxed,
        "import os, json\n"
        "try:\n    entries = os.listdir('/')\nexcept OSError:\n    entries = []\n"
        "print(json.dumps(entries))",
    )
    assert not set(listing) & HOST_ONLY_ROOT_ENTRIES
    # the guest's own mount points (/usr/local/lib, /tmp) may show; nothing else may
    assert not set(listing) & (host_entries - {"usr", "tmp"})


def test_host_environment_is_absent(sandboxed: Kernel) -> None:
    process = sandboxed.manager.provisioner.process
    host_environ = Path(f"/proc/{process.pid}/environ")
    # the secret did reach the kernel's host process; /proc shows the environment a process
    # was executed with, which for a kernel forked by the kernel server is the server's (the
    # request's is set after the fork)
    if host_environ.exists() and not isinstance(process, ServedKernel):
        assert f"{SECRET_NAME}={SECRET_VALUE}".encode() in host_environ.read_bytes()
    assert "PATH" in os.environ
    environ = guest_json(sandboxed, "import os, json\nprint(json.dumps(dict(os.environ)))")
    assert SECRET_NAME not in environ
    assert not any(SECRET_VALUE in value for value in environ.values())
    assert "PATH" not in environ


def test_socket_to_localhost_fails(sandboxed: Kernel) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        outcome = guest_json(
            sandboxed,
            "import json, socket\n"
            "try:\n"
            "    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
            f"    s.connect(('127.0.0.1', {port}))\n"
            "    outcome = 'connected'\n"
            "except OSError as exc:\n"
            "    outcome = 'OSError'\n"
            "print(json.dumps(outcome))",
        )
        assert outcome == "OSError"
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody knocked


def test_subprocess_fails(sandboxed: Kernel) -> None:
    marker = Path(f"/tmp/wasm-kernel-subprocess-{uuid.uuid4().hex}")
    outcome = guest_json(
        sandboxed,
        "import json, subprocess\n"
        "try:\n"
        f"    subprocess.run(['touch', {str(marker)!r}])\n"
        "    outcome = 'ran'\n"
        "except OSError:\n"
        "    outcome = 'OSError'\n"
        "print(json.dumps(outcome))",
    )
    assert outcome == "OSError"
    assert not marker.exists()


def test_os_system_is_absent_or_fails(sandboxed: Kernel) -> None:
    marker = Path(f"/tmp/wasm-kernel-system-{uuid.uuid4().hex}")
    outcome = guest_json(
        sandboxed,
        "import json, os\n"
        "if not hasattr(os, 'system'):\n"
        "    outcome = 'absent'\n"
        "else:\n"
        "    try:\n"
        f"        outcome = 'status %d' % os.system('touch {marker}')\n"
        "    except OSError:\n"
        "        outcome = 'OSError'\n"
        "print(json.dumps(outcome))",
    )
    assert outcome in ("absent", "OSError") or (
        outcome.startswith("status ") and outcome != "status 0"
    )
    assert not marker.exists()


def test_tmp_is_private_to_the_guest(sandboxed: Kernel) -> None:
    name = f"wasm-kernel-private-{uuid.uuid4().hex}"
    contents = guest_json(
        sandboxed,
        "import json\n"
        f"with open('/tmp/{name}', 'w') as f:\n    f.write('guest data')\n"
        f"print(json.dumps(open('/tmp/{name}').read()))",
    )
    assert contents == "guest data"
    assert not (Path("/tmp") / name).exists()


def test_stdlib_zip_is_read_only(sandboxed: Kernel) -> None:
    zip_path = load_runtime().stdlib_guest_path
    lib_dir = zip_path.rsplit("/", 1)[0]
    outcome = guest_json(
        sandboxed,
        "import json, os\n"
        "outcome = {}\n"
        f"outcome['zip visible'] = os.path.isfile({zip_path!r})\n"
        f"for label, path, mode in [('new file', {lib_dir + '/added.py'!r}, 'w'),"
        f" ('append to zip', {zip_path!r}, 'ab')]:\n"
        "    try:\n"
        "        with open(path, mode) as f:\n"
        "            f.write(b'x' if 'b' in mode else 'x')\n"
        "        outcome[label] = 'written'\n"
        "    except OSError:\n"
        "        outcome[label] = 'OSError'\n"
        "print(json.dumps(outcome))",
    )
    assert outcome == {"zip visible": True, "new file": "OSError", "append to zip": "OSError"}
