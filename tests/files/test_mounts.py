"""Host folders mounted into the sandbox (``WasmKernel.mounts``, profiles), probed from kernels.

Each scenario builds its own folder tree under pytest's tmp_path::

    parent/
        secret.txt              a unique secret one level above the notebook folder
        outside/secret.txt      a unique secret in a sibling of the notebook folder
        notebook/               the kernel's working folder (Jupyter starts kernels there)
            sales.csv, sub/inner.txt, empty/
            inside_link -> sub/inner.txt            (stays inside: must work)
            rel_out -> ../outside/secret.txt        (symlinks leading out: must fail)
            abs_out -> <absolute path of outside/secret.txt>
            up_secret -> ../secret.txt
            dir_out -> ../outside
            chain_a -> sub/chain_b -> ../rel_out -> ../outside/secret.txt
            "new\\nline"/, "\\x1b[31mred"/, "\\u202eevil"/   folders with odd names
            undecodable/fine.txt and undecodable/odd-\\xff.txt (a name that is not UTF-8)
        out/                    the read-write mount of the rw scenario

Every cell goes through ``run``, which fails the test if either secret shows up in anything
the kernel sent back (output, results, tracebacks). Escape attempts must fail with the
specific exception and errno (WASI numbering, compared by name through ``errno.errorcode``
inside the guest), and the host tree must be unchanged afterwards (names, sizes, mtimes,
modes, link counts, content hashes, link targets).

Not tested because it is documented behaviour rather than an escape: a hard link that the
*host* places inside a mounted folder, pointing at a file outside it, is readable from the
guest. It is the same inode, reached through a name inside the granted folder, and nothing
at the path level can tell it apart. The guest itself cannot create such links (see
``test_hard_link_creation_is_refused`` and the rw mount's hard-link tests).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import CellRun, Kernel, ok, plain

from wasm_kernel.files.mounts import MountError, guest_cwd, parse_mounts
from wasm_kernel.runtime.runtime import load_runtime

SIBLING_SECRET = f"sibling-secret-{uuid.uuid4().hex}"
PARENT_SECRET = f"parent-secret-{uuid.uuid4().hex}"
SECRETS = (SIBLING_SECRET, PARENT_SECRET)
SALES_CSV = "region,amount\nnorth,10\nsouth,32\n"
ODD_FOLDERS = ("new\nline", "\x1b[31mred", "\u202eevil")
FUEL = 3_000_000_000  # the rw kernel's per-cell fuel: plenty for these cells, quick to exhaust

DENIED = ("PermissionError", "EPERM")
MISSING = ("FileNotFoundError", "ENOENT")
TOO_LONG = ("OSError", "ENAMETOOLONG")
NOT_UTF8 = ("OSError", "EILSEQ")
NUL_BYTE = ("ValueError", "embedded null byte")

# Defined in every kernel once; each probe is then one expression whose value is its outcome.
GUEST_HELPERS = '''
import errno as _errno, os

def attempt(action, *args, **kwargs):
    """("ok", value), or (exception class, errno name) for an OSError, else (class, message)."""
    try:
        value = action(*args, **kwargs)
    except OSError as exc:
        return (type(exc).__name__, _errno.errorcode.get(exc.errno, exc.errno))
    except Exception as exc:
        return (type(exc).__name__, str(exc))
    return ("ok", value)

def read(path):
    with open(path) as file:
        return file.read()

def write(path, text="written by the guest", mode="w"):
    with open(path, mode) as file:
        file.write(text)

def folder_fd(path):
    return os.open(path, os.O_RDONLY)

def scratch_file():
    write("/tmp/scratch.txt", "scratch")
    return "/tmp/scratch.txt"
'''


@dataclass(frozen=True)
class Tree:
    parent: Path
    notebook: Path
    out: Path
    sibling_secret: Path
    parent_secret: Path


def build_tree(base: Path) -> Tree:
    parent = base / "parent"
    notebook, outside, out = parent / "notebook", parent / "outside", parent / "out"
    for folder in (notebook / "sub", notebook / "empty", notebook / "undecodable", outside, out):
        folder.mkdir(parents=True)
    tree = Tree(parent, notebook, out, outside / "secret.txt", parent / "secret.txt")
    tree.sibling_secret.write_text(SIBLING_SECRET)
    tree.parent_secret.write_text(PARENT_SECRET)
    (notebook / "sales.csv").write_text(SALES_CSV)
    (notebook / "sub" / "inner.txt").write_text("inner text")
    (notebook / "inside_link").symlink_to("sub/inner.txt")
    (notebook / "rel_out").symlink_to("../outside/secret.txt")
    (notebook / "abs_out").symlink_to(tree.sibling_secret)
    (notebook / "up_secret").symlink_to("../secret.txt")
    (notebook / "dir_out").symlink_to("../outside")
    (notebook / "chain_a").symlink_to("sub/chain_b")
    (notebook / "sub" / "chain_b").symlink_to("../rel_out")
    for name in ODD_FOLDERS:
        (notebook / name).mkdir()
        (notebook / name / "f.txt").write_text(f"inside {name!r}")
    (notebook / "undecodable" / "fine.txt").write_text("fine")
    with open(os.fsencode(notebook / "undecodable") + b"/odd-\xff.txt", "wb") as file:
        file.write(b"not utf-8 named")
    return tree


def snapshot(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
    """Everything about the files under ``root`` that a write could change (not atimes)."""
    state: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):  # does not follow symlinks
        dirs[:] = [name for name in dirs if os.path.join(folder, name) not in skip]
        for name in [".", *dirs, *files]:
            path = os.path.normpath(os.path.join(folder, name))
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                detail: Any = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            elif stat.S_ISLNK(info.st_mode):
                detail = os.readlink(path)
            else:
                detail = None
            state[os.path.relpath(path, root)] = (
                info.st_mode,
                info.st_size,
                info.st_mtime_ns,
                info.st_nlink,
                info.st_ino,
                detail,
            )
    return state


def run(kernel: Kernel, code: str) -> CellRun:
    """Run a cell; nothing the kernel sends back may contain a secret."""
    result = kernel.execute(code)
    shown = repr([message["content"] for message in result.messages]) + repr(result.content)
    for secret in SECRETS:
        assert secret not in shown, f"secret leaked by {code!r}"
    return result


def outcome(kernel: Kernel, expression: str) -> Any:
    return plain(ok(run(kernel, expression)))


def start_with_helpers(kernel: Kernel) -> Kernel:
    ok(run(kernel, GUEST_HELPERS))
    return kernel


# -- notebook profile: the kernel's folder read-only at /notebook ---------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Tree:
    return build_tree(tmp_path_factory.mktemp("notebook-profile"))


@pytest.fixture(scope="module")
def notebook_kernel(tree: Tree) -> Iterator[Kernel]:
    """The read-only mount as it is: writes refused (``TestOverlay``: the profile's layer)."""
    refusing = ["--WasmKernel.notebook_writes=refuse"]
    started = Kernel(refusing, cwd=tree.notebook, kernel_name="wasm-python")
    yield start_with_helpers(started)
    started.shutdown()


@pytest.fixture
def host_unchanged(tree: Tree, notebook_kernel: Kernel) -> Iterator[None]:
    """The whole tree (notebook folder, secrets, siblings) is the same after the test; the
    guest is back in /notebook for the next one."""
    before = snapshot(tree.parent)
    yield
    ok(run(notebook_kernel, "os.chdir('/notebook')"))
    assert snapshot(tree.parent) == before


@pytest.mark.usefixtures("host_unchanged")
class TestNotebookProfile:
    def test_starts_in_the_notebook_folder(self, notebook_kernel: Kernel, tree: Tree) -> None:
        assert outcome(notebook_kernel, "os.getcwd()") == "/notebook"
        assert outcome(notebook_kernel, "%pwd") == "/notebook"
        assert outcome(notebook_kernel, "sorted(os.listdir('.'))") == sorted(
            os.listdir(tree.notebook)
        )

    def test_pandas_reads_a_csv_by_relative_name(self, notebook_kernel: Kernel) -> None:
        result = outcome(
            notebook_kernel, "import pandas as pd\npd.read_csv('sales.csv').to_dict('list')"
        )
        assert result == {"region": ["north", "south"], "amount": [10, 32]}

    @pytest.mark.parametrize(
        "path, expected",
        [
            ("sub/inner.txt", "inner text"),
            ("./sub/../sub/inner.txt", "inner text"),
            ("inside_link", "inner text"),  # a symlink that stays inside the mount
            ("/notebook/sub/../sales.csv", SALES_CSV),
            ("new\nline/f.txt", "inside 'new\\nline'"),
            ("\u202eevil/f.txt", "inside '\\u202eevil'"),
        ],
    )
    def test_reads_inside_the_mount_work(
        self, notebook_kernel: Kernel, path: str, expected: str
    ) -> None:
        assert outcome(notebook_kernel, f"attempt(read, {path!r})") == ("ok", expected)

    def test_banner_and_sandbox_magic_name_the_mount(
        self, notebook_kernel: Kernel, tree: Tree
    ) -> None:
        mount_line = f"/notebook <- {tree.notebook} (read-only)"
        text = notebook_kernel.banner()  # the short form (writes refused: read-only, no more)
        assert "profile notebook" in text
        assert mount_line in text
        printed = ok(run(notebook_kernel, "%sandbox")).stream_text()
        assert "Profile: notebook" in printed and mount_line in printed
        assert "Starting folder: /notebook" in printed

    def test_a_host_name_that_is_not_utf8_breaks_only_its_folder_listing(
        self, notebook_kernel: Kernel
    ) -> None:
        """wasmtime hands the guest UTF-8 names only: listing a folder holding a file whose
        host name is not UTF-8 fails as a whole (EILSEQ); its other files stay readable."""
        assert outcome(notebook_kernel, "attempt(os.listdir, 'undecodable')") == NOT_UTF8
        assert outcome(notebook_kernel, "attempt(read, 'undecodable/fine.txt')") == ("ok", "fine")


READ_ONLY_ATTEMPTS = {
    "create": "attempt(open, 'new.txt', 'x')",
    "create-by-absolute-path": "attempt(os.open, '/notebook/new.txt', os.O_WRONLY | os.O_CREAT)",
    "create-in-subfolder": "attempt(write, 'sub/new.txt')",
    "overwrite": "attempt(open, 'sales.csv', 'w')",
    "open-read-write": "attempt(open, 'sales.csv', 'r+')",
    "append": "attempt(write, 'sales.csv', 'more', 'a')",
    "write-through-inside-symlink": "attempt(write, 'inside_link')",
    "truncate": "attempt(os.truncate, 'sales.csv', 0)",
    "remove": "attempt(os.remove, 'sales.csv')",
    "remove-in-subfolder": "attempt(os.remove, 'sub/inner.txt')",
    "remove-symlink": "attempt(os.remove, 'inside_link')",
    "rename": "attempt(os.rename, 'sales.csv', 'renamed.csv')",
    "rename-to-tmp": "attempt(os.rename, 'sales.csv', '/tmp/sales.csv')",
    "replace-from-tmp": "attempt(os.replace, scratch_file(), 'sales.csv')",
    "mkdir": "attempt(os.mkdir, 'newdir')",
    "mkdir-in-subfolder": "attempt(os.mkdir, 'sub/newdir')",
    "rmdir": "attempt(os.rmdir, 'empty')",
    "set-times": "attempt(os.utime, 'sales.csv', (0, 0))",
    "touch": "attempt(os.utime, 'sales.csv')",
    "hard-link-inside": "attempt(os.link, 'sales.csv', 'linked.csv')",
    "hard-link-to-tmp": "attempt(os.link, 'sales.csv', '/tmp/linked.csv')",
    "symlink": "attempt(os.symlink, 'sales.csv', 'symlinked.csv')",
}


@pytest.mark.usefixtures("host_unchanged")
class TestReadOnlyMount:
    @pytest.mark.parametrize("expression", READ_ONLY_ATTEMPTS.values(), ids=READ_ONLY_ATTEMPTS)
    def test_changes_are_refused(self, notebook_kernel: Kernel, expression: str) -> None:
        assert outcome(notebook_kernel, expression) == DENIED
        # the host folder is compared by the fixture; the private /tmp is checked here
        in_tmp = "[attempt(os.lstat, '/tmp/' + name) for name in ('sales.csv', 'linked.csv')]"
        assert outcome(notebook_kernel, in_tmp) == [MISSING, MISSING]

    def test_chmod_is_a_no_op(self, notebook_kernel: Kernel) -> None:
        """WASI has no permission bits: CPython's chmod succeeds without touching the host
        (the fixture's snapshot compares the host file's mode)."""
        assert outcome(notebook_kernel, "attempt(os.chmod, 'sales.csv', 0o777)") == ("ok", None)


# Under the profile's default (notebook_writes=overlay) the same attempts succeed in the private
# layer, except links, which are refused everywhere; writes through links leading out fail.
REFUSED_UNDER_OVERLAY = {"hard-link-inside", "hard-link-to-tmp", "symlink"}
WRITES_THROUGH_LINKS_OUT = (
    "attempt(write, 'rel_out', 'x', 'a')",
    "attempt(open, 'abs_out', 'r+')",
    "attempt(os.truncate, 'up_secret', 0)",
    "attempt(os.truncate, 'dir_out/secret.txt', 0)",
    "attempt(os.rename, 'chain_a', 'renamed')",
    "attempt(os.rename, 'dir_out', 'renamed')",
)
NEW_LAYER = (  # between attempts: an empty layer, as a new kernel has
    "import shutil, _wasm_kernel_layer as _layer\nos.chdir('/notebook')\n"
    "shutil.rmtree('/tmp/.wasm-kernel-writes', ignore_errors=True)\n"
    "_layer.activate(['/notebook'], '/tmp/.wasm-kernel-writes')"
)


class TestOverlay:
    def test_changes_land_in_the_private_layer_and_the_host_is_unchanged(self, tree: Tree) -> None:
        kernel = start_with_helpers(Kernel(cwd=tree.notebook, kernel_name="wasm-python"))
        before = snapshot(tree.parent)
        try:
            for name, expression in READ_ONLY_ATTEMPTS.items():
                got = outcome(kernel, f"(lambda got: (got[0], str(got[1])))({expression})")
                if name in REFUSED_UNDER_OVERLAY:
                    assert got == DENIED, (name, got)
                else:
                    assert got[0] == "ok", (name, got)
                ok(run(kernel, NEW_LAYER))
            for expression in WRITES_THROUGH_LINKS_OUT:
                got = outcome(kernel, expression)
                assert got[0] != "ok", (expression, got)
            assert outcome(kernel, "attempt(read, 'rel_out')") == DENIED
        finally:
            kernel.shutdown()
        assert snapshot(tree.parent) == before


def _from_tmp(path: Path) -> str:
    """The guest path that would reach ``path`` if '..' could leave the private /tmp, which
    is a folder in the host's temporary folder."""
    return "/tmp/../" + os.path.relpath(path, tempfile.gettempdir())


def _many_levels_up(path: Path, start: str = "") -> str:
    return start + "../" * 40 + str(path).lstrip("/")


ESCAPE_READS: dict[str, tuple[Callable[[Tree], str | bytes], tuple]] = {
    "up-to-sibling": (lambda t: "../outside/secret.txt", DENIED),
    "up-to-parent": (lambda t: "../secret.txt", DENIED),
    "up-from-subfolder": (lambda t: "sub/../../outside/secret.txt", DENIED),
    "up-many-levels": (lambda t: _many_levels_up(t.sibling_secret), DENIED),
    "up-many-levels-to-parent": (lambda t: _many_levels_up(t.parent_secret), DENIED),
    "mount-path-then-up": (lambda t: "/notebook/../outside/secret.txt", DENIED),
    "from-tmp-up": (lambda t: _from_tmp(t.sibling_secret), DENIED),
    "from-tmp-many-levels": (lambda t: _many_levels_up(t.parent_secret, "/tmp/"), DENIED),
    "absolute-host-path": (lambda t: str(t.sibling_secret), MISSING),
    "absolute-host-path-of-parent": (lambda t: str(t.parent_secret), MISSING),
    "symlink-relative": (lambda t: "rel_out", DENIED),
    "symlink-absolute": (lambda t: "abs_out", DENIED),
    "symlink-to-parent": (lambda t: "up_secret", DENIED),
    "directory-symlink": (lambda t: "dir_out/secret.txt", DENIED),
    "chained-symlinks": (lambda t: "chain_a", DENIED),
    "bytes-path": (lambda t: b"../outside/secret.txt", DENIED),
    "newline-folder-then-up": (lambda t: "new\nline/../../outside/secret.txt", DENIED),
    "escape-sequence-folder-then-up": (lambda t: "\x1b[31mred/../../outside/secret.txt", DENIED),
    "rtl-override-folder-then-up": (lambda t: "\u202eevil/../../outside/secret.txt", DENIED),
    "surrogateescape-byte": (lambda t: "\udcff/../../outside/secret.txt", NOT_UTF8),
    "nul-byte-suffix": (lambda t: "../outside/secret.txt\x00", NUL_BYTE),
    "nul-byte-truncation": (lambda t: "sales.csv\x00/../../outside/secret.txt", NUL_BYTE),
    "long-path-under-path-max": (
        lambda t: "sub/" + "./" * 1900 + "../../outside/secret.txt",
        DENIED,
    ),
    "long-path-over-path-max": (lambda t: "../" * 1400 + "outside/secret.txt", TOO_LONG),
    "dot-padded-path": (lambda t: "/notebook/" + "./" * 3000 + "../outside/secret.txt", TOO_LONG),
    "long-name-then-up": (lambda t: "x" * 300 + "/../../outside/secret.txt", TOO_LONG),
    "long-name": (lambda t: "a" * 256, TOO_LONG),
}

ESCAPE_LOOKUPS = {
    "stat-up": ("attempt(os.stat, '../outside/secret.txt')", DENIED),
    "stat-through-symlink": ("attempt(os.stat, 'rel_out')", DENIED),
    "exists-up": ("os.path.exists('../outside/secret.txt')", False),
    "listdir-up": ("attempt(os.listdir, '..')", DENIED),
    "listdir-mount-then-up": ("attempt(os.listdir, '/notebook/..')", DENIED),
    "listdir-tmp-then-up": ("attempt(os.listdir, '/tmp/..')", DENIED),
    "listdir-directory-symlink": ("attempt(os.listdir, 'dir_out')", DENIED),
    "listdir-root": ("attempt(os.listdir, '/')", MISSING),
    "scandir-up": ("attempt(lambda: [e.name for e in os.scandir('..')])", DENIED),
    "open-relative-to-dir-fd": (
        "attempt(os.open, '../outside/secret.txt', os.O_RDONLY, dir_fd=folder_fd('/notebook'))",
        DENIED,
    ),
}


@pytest.mark.usefixtures("host_unchanged")
class TestEscapes:
    @pytest.mark.parametrize("make_path, expected", ESCAPE_READS.values(), ids=ESCAPE_READS.keys())
    def test_read_outside_fails(
        self, notebook_kernel: Kernel, tree: Tree, make_path: Callable, expected: tuple
    ) -> None:
        path = make_path(tree)
        assert outcome(notebook_kernel, f"attempt(read, {path!r})") == expected

    def test_escape_paths_really_lead_to_the_secrets(
        self, tree: Tree, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The escapes are real: run by the host from the notebook folder, they reach the
        secrets (so a guest that failed to refuse them would read the secret)."""
        monkeypatch.chdir(tree.notebook)
        for name in (
            "up-to-sibling",
            "up-from-subfolder",
            "up-many-levels",
            "symlink-relative",
            "symlink-absolute",
            "directory-symlink",
            "chained-symlinks",
            "bytes-path",
            "newline-folder-then-up",
            "escape-sequence-folder-then-up",
            "rtl-override-folder-then-up",
            "long-path-under-path-max",
        ):
            assert Path(os.fsdecode(ESCAPE_READS[name][0](tree))).read_text() == SIBLING_SECRET
        for name in ("up-to-parent", "up-many-levels-to-parent", "symlink-to-parent"):
            assert Path(ESCAPE_READS[name][0](tree)).read_text() == PARENT_SECRET
        private_tmp = tempfile.mkdtemp(prefix="wasm-kernel-tmp-")  # as the kernel makes its /tmp
        try:
            for secret, name in (
                (SIBLING_SECRET, "from-tmp-up"),
                (PARENT_SECRET, "from-tmp-many-levels"),
            ):
                host_path = private_tmp + ESCAPE_READS[name][0](tree).removeprefix("/tmp")
                assert Path(host_path).read_text() == secret
        finally:
            os.rmdir(private_tmp)

    @pytest.mark.parametrize(
        "expression, expected", ESCAPE_LOOKUPS.values(), ids=ESCAPE_LOOKUPS.keys()
    )
    def test_lookups_outside_fail(
        self, notebook_kernel: Kernel, expression: str, expected: Any
    ) -> None:
        assert outcome(notebook_kernel, expression) == expected

    def test_chdir_up_is_refused(self, notebook_kernel: Kernel) -> None:
        assert outcome(notebook_kernel, "attempt(os.chdir, '..')") == DENIED
        assert outcome(notebook_kernel, "attempt(os.chdir, '/notebook/..')") == DENIED
        assert outcome(notebook_kernel, "attempt(os.chdir, 'dir_out')") == DENIED
        assert outcome(notebook_kernel, "attempt(os.chdir, '/')") == MISSING
        magic = run(notebook_kernel, "%cd ..")  # IPython prints why and stays put
        assert magic.content["status"] == "ok"
        assert "Operation not permitted" in magic.stream_text()
        assert outcome(notebook_kernel, "os.getcwd()") == "/notebook"

    def test_from_a_subfolder_dotdot_stops_at_the_mount(self, notebook_kernel: Kernel) -> None:
        assert outcome(notebook_kernel, "attempt(os.chdir, 'sub')") == ("ok", None)
        assert outcome(notebook_kernel, "attempt(read, '../sales.csv')") == ("ok", SALES_CSV)
        assert outcome(notebook_kernel, "attempt(read, '../../outside/secret.txt')") == DENIED
        assert outcome(notebook_kernel, "attempt(read, '../../secret.txt')") == DENIED

    def test_from_tmp_dotdot_reaches_nothing(self, notebook_kernel: Kernel, tree: Tree) -> None:
        """'..' never leaves a preopen, not even towards another mounted folder."""
        assert outcome(notebook_kernel, "attempt(os.chdir, '/tmp')") == ("ok", None)
        relative = _from_tmp(tree.sibling_secret).removeprefix("/tmp/")
        assert outcome(notebook_kernel, f"attempt(read, {relative!r})") == DENIED
        assert outcome(notebook_kernel, "attempt(read, '../notebook/sales.csv')") == DENIED

    @pytest.mark.parametrize(
        "source",
        [
            "../outside/secret.txt",
            "rel_out",
            "abs_out",
            "dir_out/secret.txt",
            "chain_a",
            "/tmp/../outside/secret.txt",
        ],
    )
    def test_hard_link_creation_is_refused(self, notebook_kernel: Kernel, source: str) -> None:
        assert outcome(notebook_kernel, f"attempt(os.link, {source!r}, '/tmp/stolen')") == DENIED
        assert outcome(notebook_kernel, "attempt(os.stat, '/tmp/stolen')") == MISSING

    def test_hard_link_following_symlinks_is_unavailable(self, notebook_kernel: Kernel) -> None:
        result = outcome(
            notebook_kernel, "attempt(os.link, 'abs_out', '/tmp/stolen', follow_symlinks=True)"
        )
        assert result[0] == "NotImplementedError"
        assert outcome(notebook_kernel, "attempt(os.stat, '/tmp/stolen')") == MISSING

    @pytest.mark.parametrize(
        "target, link",
        [
            ("../outside/secret.txt", "/tmp/link"),
            ("/etc/passwd", "/tmp/link"),
            ("sales.csv", "/tmp/link"),
            ("inner.txt", "/tmp/link"),
            ("x", "sub/link"),
        ],
    )
    def test_symlink_creation_is_refused(
        self, notebook_kernel: Kernel, target: str, link: str
    ) -> None:
        assert outcome(notebook_kernel, f"attempt(os.symlink, {target!r}, {link!r})") == DENIED
        assert outcome(notebook_kernel, f"attempt(os.lstat, {link!r})") == MISSING


# -- a read-write mount next to the read-only notebook folder -------------------------------------


@pytest.fixture(scope="module")
def rw_tree(tmp_path_factory: pytest.TempPathFactory) -> Tree:
    tree = build_tree(tmp_path_factory.mktemp("rw-mount"))
    # Symlinks the host put in the writable folder, leading out: writes through them must fail.
    (tree.out / "evil").symlink_to("../outside/secret.txt")
    (tree.out / "evil_dir").symlink_to("../outside")
    (tree.out / "dangling").symlink_to("../outside/created.txt")
    (tree.out / "dangling_abs").symlink_to(tree.parent / "outside" / "created-abs.txt")
    (tree.out / "d").mkdir()
    return tree


@pytest.fixture(scope="module")
def rw_kernel(rw_tree: Tree) -> Iterator[Kernel]:
    started = Kernel(
        [
            "--WasmKernel.mounts=.:/notebook:ro",
            "--WasmKernel.mounts=../out:/out:rw",
            f"--WasmKernel.fuel={FUEL}",
            "--WasmKernel.notebook_writes=refuse",  # the read-only mount as it is
        ],
        cwd=rw_tree.notebook,
        kernel_name="wasm-python",
    )
    yield start_with_helpers(started)
    started.shutdown()


@pytest.fixture
def rw_outside_unchanged(rw_tree: Tree, rw_kernel: Kernel) -> Iterator[None]:
    """Whatever the guest does in /out, nothing else under parent/ changes."""
    before = snapshot(rw_tree.parent, skip=(str(rw_tree.out),))
    yield
    ok(run(rw_kernel, "os.chdir('/notebook')"))
    assert snapshot(rw_tree.parent, skip=(str(rw_tree.out),)) == before


def _host_names(folder: Path) -> set[bytes]:
    return set(os.listdir(os.fsencode(folder)))


ODD_NAMES = [
    "a\nb",
    "tab\tname",
    "\x1b[31mred",
    "\u202eevil.txt",
    "caf\u00e9",
    "\u65e5\u672c\u8a9e",
    "..x",
    ".hidden",
    "-rf",
    " lead",
    "trail ",
    "back\\slash",
    "x" * 255,
    "\u00e9" * 127,
]
BAD_NAMES = {
    "surrogateescape-byte": ("odd-\udcff", NOT_UTF8),
    "nul-byte": ("nul\x00name", NUL_BYTE),
    "256-bytes": ("y" * 256, TOO_LONG),
    "256-bytes-multibyte": ("\u00e9" * 128, TOO_LONG),
}


@pytest.mark.usefixtures("rw_outside_unchanged")
class TestReadWriteMount:
    def test_banner_lists_both_mounts(self, rw_kernel: Kernel, rw_tree: Tree) -> None:
        text = rw_kernel.banner()
        assert f"/notebook <- {rw_tree.notebook} (read-only" in text
        assert f"/out <- {rw_tree.out} (read-write)" in text
        assert outcome(rw_kernel, "os.getcwd()") == "/notebook"

    def test_writes_land_in_the_host_folder(self, rw_kernel: Kernel, rw_tree: Tree) -> None:
        ok(run(rw_kernel, "write('/out/hello.txt', 'hello from the guest')"))
        assert (rw_tree.out / "hello.txt").read_text() == "hello from the guest"
        ok(run(rw_kernel, "os.makedirs('/out/made/deeper')\nwrite('/out/made/deeper/f.txt', 'x')"))
        assert (rw_tree.out / "made" / "deeper" / "f.txt").read_text() == "x"
        ok(run(rw_kernel, "write('/out/hello.txt', ' again', 'a')"))
        assert (rw_tree.out / "hello.txt").read_text() == "hello from the guest again"
        ok(run(rw_kernel, "os.rename('/out/hello.txt', '/out/made/moved.txt')"))
        assert not (rw_tree.out / "hello.txt").exists()
        assert (rw_tree.out / "made" / "moved.txt").read_text() == "hello from the guest again"
        ok(run(rw_kernel, "os.remove('/out/made/moved.txt')"))
        assert not (rw_tree.out / "made" / "moved.txt").exists()
        assert outcome(rw_kernel, "sorted(os.listdir('/out'))") == sorted(os.listdir(rw_tree.out))

    def test_the_notebook_folder_stays_read_only(self, rw_kernel: Kernel) -> None:
        assert outcome(rw_kernel, "attempt(write, 'new.txt')") == DENIED
        assert outcome(rw_kernel, "attempt(read, 'sales.csv')") == ("ok", SALES_CSV)

    @pytest.mark.parametrize("name", ODD_NAMES, ids=[repr(name)[:24] for name in ODD_NAMES])
    def test_odd_names_stay_inside(self, rw_kernel: Kernel, rw_tree: Tree, name: str) -> None:
        assert outcome(rw_kernel, f"attempt(write, '/out/' + {name!r}, {name!r})") == ("ok", None)
        assert (rw_tree.out / name).read_text() == name
        assert name in os.listdir(rw_tree.out)

    @pytest.mark.parametrize("name, expected", BAD_NAMES.values(), ids=BAD_NAMES.keys())
    def test_unrepresentable_names_are_refused(
        self, rw_kernel: Kernel, rw_tree: Tree, name: str, expected: tuple
    ) -> None:
        before = _host_names(rw_tree.out)
        assert outcome(rw_kernel, f"attempt(write, '/out/' + {name!r})") == expected
        assert _host_names(rw_tree.out) == before

    @pytest.mark.parametrize(
        "path",
        [
            "/out/../escaped.txt",
            "/out/d/../../escaped.txt",
            "/out/../notebook/escaped.txt",
            "/out/../outside/secret.txt",
            "/out/../secret.txt",
            "../out/escaped.txt",
            "/notebook/../out/escaped.txt",
            "/tmp/../out/escaped.txt",
            "/out/" + "../" * 40 + "escaped.txt",
        ],
    )
    def test_writes_cannot_leave_through_dotdot(
        self, rw_kernel: Kernel, rw_tree: Tree, path: str
    ) -> None:
        before = _host_names(rw_tree.out)
        assert outcome(rw_kernel, f"attempt(write, {path!r})") == DENIED
        assert _host_names(rw_tree.out) == before

    def test_dotdot_from_inside_the_rw_mount(self, rw_kernel: Kernel, rw_tree: Tree) -> None:
        assert outcome(rw_kernel, "attempt(os.chdir, '/out/d')") == ("ok", None)
        assert outcome(rw_kernel, "attempt(write, '../inside.txt', 'up one')") == ("ok", None)
        assert (rw_tree.out / "inside.txt").read_text() == "up one"
        assert outcome(rw_kernel, "attempt(write, '../../escaped.txt')") == DENIED
        assert (
            outcome(rw_kernel, "attempt(os.rename, '../inside.txt', '../../moved.txt')") == DENIED
        )
        assert outcome(rw_kernel, "attempt(os.mkdir, '../../newdir')") == DENIED

    @pytest.mark.parametrize(
        "expression",
        [
            "attempt(write, '/out/evil', 'overwritten')",
            "attempt(write, '/out/evil', 'appended', 'a')",
            "attempt(open, '/out/evil', 'r+')",
            "attempt(os.truncate, '/out/evil', 0)",
            "attempt(write, '/out/evil_dir/new.txt')",
            "attempt(os.mkdir, '/out/evil_dir/newdir')",
            "attempt(write, '/out/dangling')",
            "attempt(write, '/out/dangling_abs')",
            "attempt(read, '/out/evil')",
        ],
    )
    def test_host_symlinks_leading_out_cannot_be_used(
        self, rw_kernel: Kernel, rw_tree: Tree, expression: str
    ) -> None:
        assert outcome(rw_kernel, expression) == DENIED
        assert rw_tree.sibling_secret.read_text() == SIBLING_SECRET
        assert sorted(os.listdir(rw_tree.parent / "outside")) == ["secret.txt"]

    @pytest.mark.parametrize(
        "target",
        ["hello.txt", "../outside/secret.txt", "/etc/passwd", ".", "d", "/notebook/sales.csv"],
    )
    def test_symlink_creation_is_refused(
        self, rw_kernel: Kernel, rw_tree: Tree, target: str
    ) -> None:
        assert outcome(rw_kernel, f"attempt(os.symlink, {target!r}, '/out/made_link')") == DENIED
        assert not os.path.lexists(rw_tree.out / "made_link")

    def test_hard_links_inside_the_rw_mount_work(self, rw_kernel: Kernel, rw_tree: Tree) -> None:
        ok(run(rw_kernel, "write('/out/original.txt', 'shared')"))
        assert outcome(rw_kernel, "attempt(os.link, '/out/original.txt', '/out/d/linked.txt')") == (
            "ok",
            None,
        )
        original, linked = rw_tree.out / "original.txt", rw_tree.out / "d" / "linked.txt"
        assert original.stat().st_ino == linked.stat().st_ino
        assert original.stat().st_nlink == 2
        assert linked.read_text() == "shared"

    def test_links_and_moves_from_tmp_into_the_rw_mount(
        self, rw_kernel: Kernel, rw_tree: Tree
    ) -> None:
        """Both folders are granted, so the file stays within the grant. The private /tmp is a
        folder in the host's temporary folder: on another file system than the mount, the
        host refuses with EXDEV."""
        ok(run(rw_kernel, "write('/tmp/made_in_tmp.txt', 'from tmp')"))
        same_fs = os.stat(tempfile.gettempdir()).st_dev == os.stat(rw_tree.out).st_dev
        expected = ("ok", None) if same_fs else ("OSError", "EXDEV")
        link = outcome(rw_kernel, "attempt(os.link, '/tmp/made_in_tmp.txt', '/out/from_tmp.txt')")
        moved = outcome(rw_kernel, "attempt(os.rename, '/tmp/made_in_tmp.txt', '/out/moved.txt')")
        assert (link, moved) == (expected, expected)
        if same_fs:
            assert (rw_tree.out / "from_tmp.txt").read_text() == "from tmp"
            assert (rw_tree.out / "moved.txt").stat().st_ino == (
                rw_tree.out / "from_tmp.txt"
            ).stat().st_ino

    @pytest.mark.parametrize(
        "source",
        [
            "/notebook/sales.csv",
            "/notebook/rel_out",
            "/out/../outside/secret.txt",
            "/out/evil_dir/secret.txt",
            "/tmp/../outside/secret.txt",
        ],
    )
    def test_hard_links_from_outside_the_rw_mount_are_refused(
        self, rw_kernel: Kernel, rw_tree: Tree, source: str
    ) -> None:
        nlink = rw_tree.sibling_secret.stat().st_nlink
        assert outcome(rw_kernel, f"attempt(os.link, {source!r}, '/out/stolen')") == DENIED
        assert not os.path.lexists(rw_tree.out / "stolen")
        assert rw_tree.sibling_secret.stat().st_nlink == nlink

    def test_a_file_written_before_a_trap_stays_written(
        self, rw_kernel: Kernel, rw_tree: Tree
    ) -> None:
        """Rollback restores the interpreter's memory, not the host's files: a file a cell
        wrote and closed before running out of fuel is still there, with its content, and the
        rolled-back guest sees it too."""
        ok(run(rw_kernel, "survivor_seen = False"))
        trapped = run(
            rw_kernel,
            "write('/out/survivor.txt', 'written before the trap')\n"
            "survivor_seen = True\n"
            "while True:\n    pass",
        )
        assert trapped.content["ename"] == "FuelExhausted"
        assert "rolled back" in trapped.content["evalue"]
        assert (rw_tree.out / "survivor.txt").read_text() == "written before the trap"
        assert outcome(rw_kernel, "survivor_seen") is False  # the variable was rolled back
        assert outcome(rw_kernel, "attempt(read, '/out/survivor.txt')") == (
            "ok",
            "written before the trap",
        )

    def test_file_closed_in_a_rolled_back_cell_cannot_write_elsewhere(
        self, rw_kernel: Kernel, rw_tree: Tree
    ) -> None:
        """The rollback restores ``kept`` as open, but the host closed its descriptor and gave
        the number to ``other.txt``: the kernel closes ``kept`` rather than let it write there.
        A file the cell did not touch stays open and usable."""
        ok(run(rw_kernel, "kept = open('/out/kept.txt', 'w')\nuntouched = open('/out/u.txt', 'w')"))
        trapped = run(
            rw_kernel,
            "kept.close()\nother = open('/out/other.txt', 'w')\nwhile True:\n    pass",
        )
        assert trapped.content["ename"] == "FuelExhausted"
        write = run(rw_kernel, "kept.write('meant for kept.txt')\nkept.flush()")
        assert write.content["ename"] == "ValueError"
        assert "closed file" in write.content["evalue"]
        assert "meant for kept.txt" not in (rw_tree.out / "other.txt").read_text()
        ok(run(rw_kernel, "untouched.write('still fine')\nuntouched.close()"))
        assert (rw_tree.out / "u.txt").read_text() == "still fine"


# -- strict profile: nothing mounted -------------------------------------------------------------


@pytest.fixture(scope="module")
def strict_tree(tmp_path_factory: pytest.TempPathFactory) -> Tree:
    return build_tree(tmp_path_factory.mktemp("strict-profile"))


@pytest.fixture(scope="module")
def strict_kernel(strict_tree: Tree) -> Iterator[Kernel]:
    started = Kernel(cwd=strict_tree.notebook, kernel_name="wasm-python-strict")
    yield start_with_helpers(started)
    started.shutdown()


class TestStrictProfile:
    def test_starts_in_tmp(self, strict_kernel: Kernel) -> None:
        assert outcome(strict_kernel, "os.getcwd()") == "/tmp"
        assert outcome(strict_kernel, "%pwd") == "/tmp"

    @pytest.mark.parametrize(
        "make_path, expected",
        [
            (lambda t: "sales.csv", MISSING),
            (lambda t: "/notebook/sales.csv", MISSING),
            (lambda t: str(t.notebook / "sales.csv"), MISSING),
            (lambda t: str(t.sibling_secret), MISSING),
            (lambda t: _from_tmp(t.notebook / "sales.csv"), DENIED),
            (lambda t: _from_tmp(t.sibling_secret), DENIED),
        ],
        ids=[
            "relative",
            "notebook-mount-path",
            "absolute-host-path",
            "absolute-secret",
            "from-tmp-up",
            "from-tmp-up-to-secret",
        ],
    )
    def test_the_folder_is_not_visible(
        self, strict_kernel: Kernel, strict_tree: Tree, make_path: Callable, expected: tuple
    ) -> None:
        assert outcome(strict_kernel, f"attempt(read, {make_path(strict_tree)!r})") == expected

    def test_no_mount_shows(self, strict_kernel: Kernel) -> None:
        assert outcome(strict_kernel, "os.path.exists('/notebook')") is False
        listing = outcome(strict_kernel, "attempt(os.listdir, '/')")
        assert listing == MISSING or (listing[0] == "ok" and "notebook" not in listing[1])

    def test_tmp_is_writable(self, strict_kernel: Kernel) -> None:
        assert outcome(strict_kernel, "attempt(write, 'scratch.txt', 'x')") == ("ok", None)
        assert outcome(strict_kernel, "attempt(read, '/tmp/scratch.txt')") == ("ok", "x")

    def test_banner_and_sandbox_magic_say_strict(
        self, strict_kernel: Kernel, strict_tree: Tree
    ) -> None:
        banner = strict_kernel.banner()
        assert "profile strict" in banner and "Host folders: none\n" in banner
        assert str(strict_tree.notebook) not in banner
        text = ok(run(strict_kernel, "%sandbox")).stream_text()
        assert "Profile: strict" in text
        assert "Host folders:\n  none\n" in text
        assert "Starting folder: /tmp" in text
        assert str(strict_tree.notebook) not in text


# -- mount errors: every cell fails with SandboxUnavailable, the kernel stays up -----------------


@pytest.mark.parametrize(
    "arguments, named",
    [
        (["--WasmKernel.mounts=missing:/data"], ["'missing:/data'", "is missing"]),
        (["--WasmKernel.mounts=.:/tmp"], ["'.:/tmp'", "/tmp belongs to the sandbox itself"]),
        (
            ["--WasmKernel.mounts=.:/a", "--WasmKernel.mounts=sub:/a/b"],
            ["'sub:/a/b'", "overlaps the mount at /a"],
        ),
    ],
    ids=["missing-host-folder", "guest-tmp", "overlapping-mounts"],
)
def test_bad_mount_makes_cells_fail_but_kernel_stays_up(
    start_kernel: Callable[..., Kernel], tmp_path: Path, arguments: list[str], named: list[str]
) -> None:
    (tmp_path / "sub").mkdir()
    kernel = start_kernel(arguments, cwd=tmp_path)
    for code in ("1 + 1", "%sandbox"):
        reply = kernel.execute(code).content
        assert reply["status"] == "error"
        assert reply["ename"] == "SandboxUnavailable"
        for words in named:
            assert words in reply["evalue"]
    text = kernel.banner()
    assert "Host folders: none: mount " in text
    assert all(words in text for words in named)


RESERVED = (load_runtime().lib_guest_dir,)


@pytest.fixture
def base(tmp_path: Path) -> Path:
    for name in ("data", "other", "a:b"):
        (tmp_path / name).mkdir()
    (tmp_path / "file.txt").write_text("not a folder")
    return tmp_path


@pytest.mark.parametrize(
    "spec, guest, writable, host",
    [
        ("data:/data", "/data", False, "data"),
        ("data:/data:ro", "/data", False, "data"),
        ("data:/data:rw", "/data", True, "data"),
        ("./data/../data:/x/y", "/x/y", False, "data"),
        ("a:b:/ab:rw", "/ab", True, "a:b"),
        (".:/notebook:ro", "/notebook", False, "."),
        ("data:/usr/local/libx", "/usr/local/libx", False, "data"),
        ("data:/tmpx", "/tmpx", False, "data"),
    ],
)
def test_parse_good_mounts(base: Path, spec: str, guest: str, writable: bool, host: str) -> None:
    (mount,) = parse_mounts([spec], base, RESERVED)
    assert (mount.guest, mount.writable, mount.host) == (guest, writable, (base / host).resolve())


def test_parse_absolute_host_folder(base: Path) -> None:
    (mount,) = parse_mounts([f"{base / 'data'}:/data:rw"], Path("/"), RESERVED)
    assert mount.host == (base / "data").resolve()


@pytest.mark.parametrize(
    "specs, message",
    [
        ([""], "an empty mount spec"),
        (["data"], "write HOST:GUEST"),
        (["data:"], "write HOST:GUEST"),
        ([":/data"], "write HOST:GUEST"),
        (["data:rw"], "write HOST:GUEST"),
        (["missing:/data"], "is missing"),
        (["file.txt:/data"], "is not a folder"),
        (["\udcff:/data"], "not valid UTF-8"),
        (["data:data"], "clean absolute folder"),
        (["data:/"], "clean absolute folder"),
        (["data:/data/"], "clean absolute folder"),
        (["data:/a/../b"], "clean absolute folder"),
        (["data:/a/./b"], "clean absolute folder"),
        (["data://data"], "clean absolute folder"),
        (["data:/da\nta"], "clean absolute folder"),
        (["data:/data:rx"], "the mode must be ro or rw, not 'rx'"),
        (["/:/host"], "the whole host file system"),
        (["data/../..//" + "../" * 64 + ":/host:ro"], "the whole host file system"),
        (["data:/tmp"], "/tmp belongs to the sandbox itself"),
        (["data:/tmp/x"], "/tmp belongs to the sandbox itself"),
        (["data:/usr/local/lib"], "/usr/local/lib belongs to the sandbox itself"),
        (["data:/usr/local/lib/x"], "/usr/local/lib belongs to the sandbox itself"),
        (["data:/usr"], "/usr/local/lib belongs to the sandbox itself"),
        (["data:/d", "other:/d"], "overlaps the mount at /d"),
        (["data:/d", "other:/d/e"], "overlaps the mount at /d"),
        (["data:/d/e", "other:/d"], "overlaps the mount at /d/e"),
        ([".:/nb:rw", "data:/data"], "shares host folders with the mount at /nb"),
        (["data:/a", "data:/b:rw"], "shares host folders with the mount at /a"),
    ],
)
def test_parse_bad_mounts(base: Path, specs: list[str], message: str) -> None:
    with pytest.raises(MountError) as raised:
        parse_mounts(specs, base, RESERVED)
    assert message in str(raised.value)
    if specs[-1]:
        assert f"mount {specs[-1]!r}" in str(raised.value)  # names the spec at fault


def test_guest_cwd(base: Path) -> None:
    mounts = parse_mounts(["data:/data", ".:/notebook"], base, RESERVED)
    assert guest_cwd(mounts, base) == "/notebook"  # the mount of the kernel's own folder
    assert guest_cwd(mounts, base / "data") == "/data"
    assert guest_cwd(mounts, base / "other") == "/tmp"
    assert guest_cwd(mounts, base, "/data") == "/data"
    assert guest_cwd(mounts, base, "/tmp") == "/tmp"
    with pytest.raises(MountError, match="must be one of the mounted folders"):
        guest_cwd(mounts, base, "/elsewhere")


# -- the environment route ------------------------------------------------------------------------


def test_mounts_from_the_environment(start_kernel: Callable[..., Kernel], tmp_path: Path) -> None:
    """WASM_KERNEL_MOUNTS (';'-separated) replaces the profile's mounts; relative host
    folders are taken from the kernel's working folder."""
    (tmp_path / "data").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "data" / "in.txt").write_text("from the host")
    kernel = start_with_helpers(
        start_kernel(env={"WASM_KERNEL_MOUNTS": " data:/data ; out:/out:rw "}, cwd=tmp_path)
    )
    assert outcome(kernel, "os.getcwd()") == "/tmp"  # the working folder itself is not mounted
    assert outcome(kernel, "attempt(read, '/data/in.txt')") == ("ok", "from the host")
    assert outcome(kernel, "attempt(write, '/data/new.txt')") == DENIED
    assert outcome(kernel, "attempt(write, '/out/new.txt', 'from the guest')") == ("ok", None)
    assert (tmp_path / "out" / "new.txt").read_text() == "from the guest"
    assert outcome(kernel, "os.path.exists('/notebook')") is False
    text = kernel.banner()
    assert f"/data <- {tmp_path / 'data'} (read-only)" in text
    assert f"/out <- {tmp_path / 'out'} (read-write)" in text
