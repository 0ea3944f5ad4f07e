"""Writes beside the notebook (``WasmKernel.notebook_writes``): under ``overlay`` cells write in
the notebook's folder as under ipykernel, into a private layer, and the host's folder never
changes; under ``refuse`` (the strict profile's default) they get PermissionError as before.

The parity notebook runs on the native kernel (in a copy of the folder, which it changes) and
on wasm-kernel (in a folder hashed before and after) in the same test, compared cell by cell.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import nbformat
import pytest
from conftest import Kernel, ok, plain
from nbclient import NotebookClient

from wasm_kernel.client import Session

NATIVE = "python3"
ERRNO = re.compile(r"\[Errno \d+\] ")  # WASI numbers errors differently from Linux
SALES = "region,amount\nnorth,10\nsouth,32\n"
NOTICE = "(Said once.)"  # the end of the notice that a write stays private

CELLS = [
    # a cell writing beside the notebook, and the next reading it back
    "import os, numpy as np, pandas as pd\n"
    "np.save('data.npy', np.arange(6).reshape(2, 3))\n"
    "pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']}).to_csv('out.csv', index=False)\n"
    "sorted(os.listdir())",
    "print(np.load('data.npy'))\npd.read_csv('out.csv')",
    "%%writefile notes.txt\nhello\n",
    "%%writefile -a notes.txt\nmore\n",
    "print(open('notes.txt').read())\nos.path.exists('notes.txt'), os.path.getsize('out.csv')",
    # changing, renaming and deleting the host's files, and folders
    "with open('sales.csv', 'a') as f:\n    f.write('east,5\\n')\npd.read_csv('sales.csv')",
    "os.mkdir('results')\nos.rename('out.csv', 'results/out.csv')\nos.remove('notes.txt')\n"
    "sorted(os.listdir()), os.listdir('results'), os.path.exists('out.csv')",
    "os.replace('sales.csv', 'results/sales.csv')\n"
    "sorted(os.listdir()), sorted(os.listdir('results'))",
    "with open('sub/inner.txt', 'r+') as f:\n    f.truncate(3)\nopen('sub/inner.txt').read()",
    "from pathlib import Path\nPath('results/new.txt').write_text('p')\n"
    "sorted(p.name for p in Path('results').iterdir()), sorted(map(str, Path('.').rglob('*.txt')))",
    "os.makedirs('deep/er', exist_ok=True)\nopen('deep/er/x.bin', 'wb').write(bytes(10))\n"
    "[(top, sorted(dirs), sorted(files)) for top, dirs, files in sorted(os.walk('deep'))]",
    "%%writefile helper_mod.py\nVALUE = 42\n",
    "import helper_mod\nhelper_mod.VALUE",
    "%%writefile script.py\nprint('ran', 6 * 7)\n",
    "%run script.py",
    "open('missing/x.txt', 'w')",
    "os.rmdir('sub')",
    "open('results', 'w')",
]


# every path to a file, not only Python's open(): numpy's text I/O (it keeps the open it saw at
# import), io.FileIO, os.open, and C code (sqlite3), each reading back what it wrote
EVERY_PATH = [
    "import io, os, sqlite3, numpy as np\n"
    "np.savetxt('table.txt', np.arange(6).reshape(2, 3), fmt='%d')\n"
    "np.loadtxt('table.txt').tolist(), np.genfromtxt('table.txt').tolist()",
    "amounts = np.loadtxt('sales.csv', delimiter=',', skiprows=1, usecols=1)\n"
    "np.savetxt('sales.csv', amounts * 2, fmt='%d')\n"
    "open('sales.csv').read(), np.fromregex('sales.csv', r'(\\d+)', [('n', np.int64)]).tolist()",
    "with io.FileIO('raw.bin', 'w') as f:\n    f.write(b'abc')\n"
    "with io.FileIO('sub/inner.txt', 'a') as f:\n    f.write(b'+')\n"
    "io.FileIO('raw.bin').read(), open('sub/inner.txt').read()",
    "fd = os.open('low.txt', os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\nos.write(fd, b'low')\n"
    "os.close(fd)\nfd = os.open('low.txt', os.O_RDONLY)\nos.read(fd, 10)",
    "db = sqlite3.connect('x.db')\ndb.execute('create table t (x)')\n"
    "db.executemany('insert into t values (?)', [(1,), (2,)])\ndb.commit()\ndb.close()\n"
    "again = sqlite3.connect('x.db')\n"
    "again.execute('insert into t values (3)')\nagain.commit()\n"
    "again.execute('select sum(x), count(*) from t').fetchone()",
    "sorted(os.listdir()), os.path.getsize('x.db') > 0",
]


def notebook(cells: list[str] = CELLS) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])


def make_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "sales.csv").write_text(SALES)
    (folder / "sub").mkdir()
    (folder / "sub" / "inner.txt").write_text("inner text")
    return folder


def folder_hash(folder: Path) -> str:
    """Names, kinds, sizes, modes, mtimes and contents of everything under ``folder``."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        status = path.lstat()
        digest.update(f"{path.relative_to(folder)}|{status.st_mode}|{status.st_size}|".encode())
        digest.update(f"{status.st_mtime_ns}|".encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def shown(cell: nbformat.NotebookNode) -> list[tuple]:
    """What a cell showed: streams merged, results' text, errors' names and messages."""
    out: list[tuple] = []
    for output in cell.outputs:
        kind = output["output_type"]
        if kind == "stream":
            if out and out[-1][:2] == ("stream", output["name"]):
                out[-1] = ("stream", output["name"], out[-1][2] + output["text"])
            else:
                out.append(("stream", output["name"], output["text"]))
        elif kind == "error":
            out.append(("error", output["ename"], ERRNO.sub("", output["evalue"])))
        else:
            out.append((kind, output["data"].get("text/plain"), output["data"].get("text/html")))
    return out


def without_notice(cell: nbformat.NotebookNode) -> tuple[list[tuple], int]:
    """What a cell showed less the notice, and how many notices it showed."""
    notices = 0
    for output in cell.outputs:
        if output["output_type"] == "stream" and NOTICE in output["text"]:
            notices += output["text"].count(NOTICE)
            kept = [line for line in output["text"].splitlines(True) if NOTICE not in line]
            output["text"] = "".join(kept)
    cell.outputs = [o for o in cell.outputs if o["output_type"] != "stream" or o["text"]]
    return shown(cell), notices


def execute(kernel: str, folder: Path, cells: list[str] = CELLS) -> nbformat.NotebookNode:
    ran = notebook(cells)
    client = NotebookClient(
        ran, kernel_name=kernel, timeout=300, allow_errors=True,
        resources={"metadata": {"path": str(folder)}},
    )  # fmt: skip
    client.execute()
    return ran


@pytest.mark.slow
def test_writes_beside_the_notebook_match_the_native_kernel_and_leave_the_host_alone(tmp_path):
    native_folder = make_folder(tmp_path / "native" / "notebook")
    sandboxed_folder = make_folder(tmp_path / "sandboxed" / "notebook")
    before = folder_hash(sandboxed_folder)
    native = execute(NATIVE, native_folder)
    sandboxed = execute("wasm-python", sandboxed_folder)
    assert folder_hash(sandboxed_folder) == before
    notices = []
    for index, (want, got) in enumerate(zip(native.cells, sandboxed.cells, strict=True)):
        got_shown, count = without_notice(got)
        notices.append(count)
        assert got_shown == shown(want), f"cell {index}: {want.source!r}"
    assert notices == [1] + [0] * (len(CELLS) - 1), notices  # the first write says it, once
    # the native kernel really changed its folder: the cells did what they say
    assert (native_folder / "results" / "sales.csv").read_text() == SALES + "east,5\n"
    assert not (native_folder / "sales.csv").exists()


def test_every_path_to_a_file_goes_through_the_layer(tmp_path):
    native_folder = make_folder(tmp_path / "native" / "notebook")
    sandboxed_folder = make_folder(tmp_path / "sandboxed" / "notebook")
    before = folder_hash(sandboxed_folder)
    native = execute(NATIVE, native_folder, EVERY_PATH)
    sandboxed = execute("wasm-python", sandboxed_folder, EVERY_PATH)
    assert folder_hash(sandboxed_folder) == before
    notices = []
    for index, (want, got) in enumerate(zip(native.cells, sandboxed.cells, strict=True)):
        got_shown, count = without_notice(got)
        notices.append(count)
        assert got_shown == shown(want), f"cell {index}: {want.source!r}"
    assert notices == [1] + [0] * (len(EVERY_PATH) - 1), notices
    assert not any(
        output["output_type"] == "error" for cell in native.cells for output in cell.outputs
    )
    assert (native_folder / "x.db").exists()  # the cells wrote natively


LAYERED_CELL = (
    "import numpy as np\nnp.save('data.npy', np.arange(4))\n"
    "open('sales.csv', 'a').write('east,5\\n')\nimport os; os.remove('sub/inner.txt')"
)
READ_BACK = (
    "(np.load('data.npy').tolist(), open('sales.csv').read(),"
    " os.path.exists('sub/inner.txt'), sorted(os.listdir('sub')))"
)
AFTER = ([0, 1, 2, 3], SALES + "east,5\n", False, [])


@pytest.mark.slow
def test_the_layer_survives_a_snapshot_restore_and_a_hibernation(tmp_path):
    folder = make_folder(tmp_path / "notebook")
    before = folder_hash(folder)
    env = {"WASM_KERNEL_SNAPSHOT_DIR": str(tmp_path / "images"), "JPY_SESSION_NAME": "n.ipynb"}
    kernel = Kernel(env=env, cwd=folder)
    try:
        ok(kernel.execute(LAYERED_CELL))
        ok(kernel.execute("%snapshot save layered"))
        ok(kernel.execute("open('data.npy', 'wb').write(b'x'); os.remove('sales.csv')"))
        ok(kernel.execute("%snapshot restore layered"))
        assert plain(ok(kernel.execute(READ_BACK))) == AFTER
        listing = ok(kernel.execute("%sandbox")).stream_text()
        size = plain(ok(kernel.execute("os.path.getsize('data.npy')")))
        assert f"/notebook/data.npy ({size:,} bytes)" in listing, listing
        assert "/notebook/sales.csv (" in listing
        assert "hidden (deleted or renamed by cells): /notebook/sub/inner.txt" in listing
    finally:
        kernel.shutdown()  # hibernates: the next kernel for n.ipynb resumes the session
    resumed = Kernel(env=env, cwd=folder)
    try:
        assert plain(ok(resumed.execute(READ_BACK))) == AFTER
    finally:
        resumed.shutdown()
    assert folder_hash(folder) == before


@pytest.mark.slow
def test_writes_past_the_scratch_quota_stop_with_a_clear_error(start_kernel, tmp_path):
    folder = make_folder(tmp_path / "notebook")
    kernel = start_kernel(["--WasmKernel.scratch_limit=16777216"], cwd=folder)
    stopped = kernel.execute("open('big.bin', 'wb').write(bytes(64 << 20))")
    assert stopped.content["status"] == "error"
    assert stopped.content["ename"] == "ScratchLimitExceeded", stopped.content
    assert "16 MiB" in stopped.content["evalue"], stopped.content["evalue"]
    ok(kernel.execute("import os; os.remove('big.bin')"))
    assert not (folder / "big.bin").exists()
    assert plain(ok(kernel.execute("open('small.txt', 'w').write('ok')"))) == 2
    # a huge host file is copied up like any write, so the limit stops that too, and the
    # cut copy never stands for the host's file
    with open(folder / "huge.bin", "wb") as huge:
        huge.truncate(1 << 30)  # sparse: nothing on the host's disk
    before = folder_hash(folder)
    stopped = kernel.execute("open('huge.bin', 'a').write('more')")
    assert stopped.content["ename"] == "ScratchLimitExceeded", stopped.content
    assert plain(ok(kernel.execute("os.path.getsize('huge.bin')"))) == 1 << 30
    assert plain(ok(kernel.execute("open('small.txt', 'a').write('!')"))) == 1
    assert folder_hash(folder) == before


@pytest.mark.slow
def test_refuse_and_the_strict_profile_keep_the_folder_read_only(start_kernel, tmp_path):
    folder = make_folder(tmp_path / "notebook")
    refusing = start_kernel(["--WasmKernel.notebook_writes=refuse"], cwd=folder)
    run = refusing.execute("open('out.csv', 'w')")
    assert run.content["ename"] == "PermissionError", run.content
    assert "Writes beside the notebook: refused" in refusing.execute("%sandbox").stream_text()
    assert "stay in the sandbox" not in refusing.banner()  # the banner's short form
    # the strict kernelspec pins no mounts at all; its profile, given a mount, refuses too
    strict_spec = start_kernel(cwd=folder, kernel_name="wasm-python-strict")
    assert "Writes beside the notebook: refused" in strict_spec.execute("%sandbox").stream_text()
    strict = start_kernel(
        ["--WasmKernel.profile=strict", "--WasmKernel.mounts=['.:/notebook:ro']"], cwd=folder
    )
    run = strict.execute("open('/notebook/out.csv', 'w')")
    assert run.content["ename"] == "PermissionError", run.content
    assert not (folder / "out.csv").exists()


def test_hostile_files_in_the_folder_are_not_copied_up(start_kernel, tmp_path):
    folder = make_folder(tmp_path / "notebook")
    os.mkfifo(folder / "pipe")
    kernel = start_kernel(cwd=folder)
    run = kernel.execute("open('pipe', 'a')")
    assert run.content["ename"] == "PermissionError", run.content
    assert "only regular files" in run.content["evalue"]
    assert plain(ok(kernel.execute("import os; os.path.exists('pipe')"))) is True


@pytest.mark.slow
def test_the_client_downloads_a_file_written_beside_the_notebook(tmp_path):
    folder = make_folder(tmp_path / "notebook")
    before = folder_hash(folder)
    with Session(cwd=str(folder)) as session:  # started in the folder, as Jupyter does
        session.run("import pandas as pd\npd.DataFrame({'a': [1]}).to_csv('out.csv')")
        assert session.download("/notebook/out.csv") == b",a\n0,1\n"
        names = [entry["name"] for entry in session.files("/notebook")]
        assert "out.csv" in names and "sales.csv" in names
    assert folder_hash(folder) == before


@pytest.mark.slow
def test_folders_only_the_layer_has_and_a_rolled_back_cell(start_kernel, tmp_path):
    """A folder made by a cell can be entered; a cell rolled back after deleting a host file
    leaves it deleted, as files written in /tmp by a rolled-back cell stay written."""
    folder = make_folder(tmp_path / "notebook")
    before = folder_hash(folder)
    kernel = start_kernel(
        ["--WasmKernel.time_limit=1", "--WasmKernel.interrupt_grace=0.2"], cwd=folder
    )
    entered = "import os; os.makedirs('new/x'); os.chdir('new'); open('f.txt', 'w').write('1')"
    ok(kernel.execute(entered))
    assert plain(ok(kernel.execute("os.getcwd(), sorted(os.listdir())"))) == (
        "/notebook/new",
        ["f.txt", "x"],
    )
    ok(kernel.execute("os.chdir('..'); kept = 1"))
    assert plain(ok(kernel.execute("os.getcwd(), open('new/f.txt').read()"))) == ("/notebook", "1")
    stuck = "os.remove('sales.csv')\nwhile True:\n    try:\n        while True: pass\n"
    stuck += "    except BaseException: pass"
    run = kernel.execute(stuck)
    assert "rolled back" in run.content["evalue"], run.content
    assert plain(ok(kernel.execute("kept, os.path.exists('sales.csv')"))) == (1, False)
    assert folder_hash(folder) == before


def test_the_layer_takes_nothing_until_a_cell_writes(kernel):
    """/tmp of a kernel that never wrote beside the notebook holds nothing of the layer, and a
    module written there later imports (the import system looks at its folder again)."""
    assert plain(ok(kernel.execute("import os; os.listdir('/tmp')"))) == []
    missing = kernel.execute("import layer_probe_module")  # import looks, finds no folder
    assert missing.content["ename"] == "ModuleNotFoundError", missing.content
    ok(kernel.execute("%%writefile layer_probe_module.py\nFOUND = True\n"))
    assert plain(ok(kernel.execute("import layer_probe_module; layer_probe_module.FOUND")))
    assert plain(ok(kernel.execute("os.listdir('/tmp')"))) == [".wasm-kernel-writes"]
