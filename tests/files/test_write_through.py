"""New files beside the notebook written through to the host (``notebook_writes =
"new-files"``), and the notice under ``overlay``.

Under ``new-files`` the same cells run on the native kernel (in one copy of the folder) and on
wasm-kernel (in another): every new data file on the host has the native kernel's bytes, the
files that were already there keep theirs, and what the cells show matches but for the one
notice that a change stayed private. Links planted on the host are never followed, the file
quota stops a flood, and files are private (0600), never executable.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
from pathlib import Path

import nbformat
from conftest import ok, plain
from nbclient import NotebookClient
from test_notebook_writes import NATIVE, NOTICE, make_folder, shown, without_notice

NEW_FILES = "--WasmKernel.notebook_writes=new-files"

CELLS = [
    # new files, through every path to a file: open(), pandas, numpy's text I/O, io.FileIO,
    # os.open, sqlite3 from C
    "import io, os, sqlite3, numpy as np, pandas as pd\n"
    "pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']}).to_csv('out.csv', index=False)\n"
    "open('notes.txt', 'w').write('hello\\n')",
    "np.savetxt('table.txt', np.arange(6).reshape(2, 3), fmt='%d')\n"
    "with io.FileIO('raw.bin', 'w') as f:\n    f.write(b'abc')\n"
    "fd = os.open('low.dat', os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\nos.write(fd, b'low')\n"
    "os.close(fd)",
    "db = sqlite3.connect('x.db')\ndb.execute('create table t (x)')\n"
    "db.executemany('insert into t values (?)', [(1,), (2,)])\ndb.commit()\ndb.close()",
    "os.makedirs('results/figs')\nopen('results/figs/a.json', 'w').write('{}')",
    # the folder's own files: changed in the session only (the notice, once)
    "with open('sales.csv', 'a') as f:\n    f.write('east,5\\n')\n"
    "open('sub/inner.txt', 'w').write('changed')",
    "open('notes.txt', 'a').write('more\\n')\nopen('sales.csv', 'a').write('west,1\\n')\n"
    "db = sqlite3.connect('x.db')\ndb.execute('insert into t values (3)')\ndb.commit()",
    "%%writefile helper.py\nVALUE = 1\n",
    "open('gone.txt', 'w').write('x')",
    "os.remove('gone.txt')\nos.rename('table.txt', 'results/table.txt')",
    "sorted(os.listdir()), open('sales.csv').read(), open('sub/inner.txt').read(),"
    " np.loadtxt('results/table.txt').tolist()",
]
PRIVATE_CELL = 4  # the first cell whose write stays private
ONLY_NATIVE = {"helper.py"}  # code is not written through
EXISTING = {"sales.csv", "sub/inner.txt"}


def execute(kernel: str, folder: Path, arguments: list[str]) -> nbformat.NotebookNode:
    ran = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    client = NotebookClient(
        ran, kernel_name=kernel, timeout=300, allow_errors=True, extra_arguments=arguments,
        resources={"metadata": {"path": str(folder)}},
    )  # fmt: skip
    client.execute()
    return ran


def files_of(folder: Path) -> dict[str, Path]:
    return {
        str(path.relative_to(folder)): path
        for path in folder.rglob("*")
        if path.is_file() and not path.is_symlink()
    }


def digest(paths: dict[str, Path]) -> dict[str, str]:
    return {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in paths.items()}


def dump(database: Path) -> list[str]:
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        return list(db.iterdump())


def test_new_files_reach_the_host_as_the_native_kernel_writes_them(tmp_path):
    native_folder = make_folder(tmp_path / "native" / "notebook")
    sandboxed_folder = make_folder(tmp_path / "sandboxed" / "notebook")
    existing = digest(files_of(sandboxed_folder))
    native = execute(NATIVE, native_folder, [])
    sandboxed = execute("wasm-python", sandboxed_folder, [NEW_FILES])
    notice = "".join(o.get("text", "") for o in sandboxed.cells[PRIVATE_CELL].outputs)
    notices = []
    for index, (want, got) in enumerate(zip(native.cells, sandboxed.cells, strict=True)):
        got_shown, count = without_notice(got)
        notices.append(count)
        assert got_shown == shown(want), f"cell {index}: {want.source!r}"
    assert notices == [int(i == PRIVATE_CELL) for i in range(len(CELLS))], notices
    assert "/notebook/sales.csv" in notice and "already in the folder" in notice, notice
    assert not any(o["output_type"] == "error" for c in native.cells for o in c.outputs)

    native_files, host_files = files_of(native_folder), files_of(sandboxed_folder)
    assert digest({name: host_files[name] for name in existing}) == existing  # never changed
    new = set(native_files) - set(existing) - ONLY_NATIVE
    assert set(host_files) == new | set(existing), sorted(host_files)
    assert "gone.txt" not in host_files and "results/table.txt" in host_files
    for name in sorted(new - {"x.db"}):
        assert host_files[name].read_bytes() == native_files[name].read_bytes(), name
    # a database's header names the SQLite library that wrote it last (bytes 96-99): the
    # runtime's and the host's differ; every other byte is the native kernel's
    host_db, native_db = host_files["x.db"].read_bytes(), native_files["x.db"].read_bytes()
    assert host_db[:96] + host_db[100:] == native_db[:96] + native_db[100:]
    assert dump(host_files["x.db"]) == dump(native_files["x.db"])
    for name in new:
        assert stat.S_IMODE(host_files[name].stat().st_mode) == 0o600, name
    for folder in (sandboxed_folder / "results", sandboxed_folder / "results" / "figs"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_links_planted_in_the_folder_are_never_followed(start_kernel, tmp_path):
    """Links to a file outside, dangling, and replacing a folder or a file the kernel wrote;
    and a written file the user then changed on the host is the user's: never written again."""
    folder = make_folder(tmp_path / "notebook")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.csv").write_text("secret\n")
    (folder / "link.csv").symlink_to(outside / "secret.csv")
    (folder / "dangling.csv").symlink_to(outside / "made.csv")
    kernel = start_kernel([NEW_FILES], cwd=folder)
    ok(kernel.execute("open('link.csv', 'w').write('over')\nopen('dangling.csv', 'w').write('x')"))
    ok(kernel.execute("import os; os.makedirs('d'); open('d/a.csv', 'w').write('a')"))
    ok(kernel.execute("open('w.csv', 'w').write('w')\nopen('e.csv', 'w').write('e')"))
    assert (folder / "d" / "a.csv").read_text() == "a" and (folder / "w.csv").read_text() == "w"
    with open(folder / "e.csv", "a") as edited:  # in place: same inode
        edited.write(" by the user")
    # the folder and the file the kernel wrote are replaced by links to outside
    (folder / "d" / "a.csv").unlink()
    (folder / "d").rmdir()
    (folder / "d").symlink_to(outside)
    (folder / "w.csv").unlink()
    (folder / "w.csv").symlink_to(outside / "secret.csv")
    ok(kernel.execute("open('d/b.csv', 'w').write('b')\nopen('w.csv', 'a').write('more')"))
    ok(kernel.execute("open('e.csv', 'w').write('kernel')"))
    assert (folder / "e.csv").read_text() == "e by the user"
    ok(kernel.execute("os.remove('e.csv')"))
    assert (folder / "e.csv").read_text() == "e by the user"
    assert sorted(os.listdir(outside)) == ["secret.csv"]
    assert (outside / "secret.csv").read_text() == "secret\n"
    assert (folder / "link.csv").is_symlink() and (folder / "dangling.csv").is_symlink()
    assert plain(ok(kernel.execute("open('w.csv').read(), open('link.csv').read()"))) == (
        "wmore",
        "over",
    )


def test_the_file_quota_stops_a_flood_and_the_kernel_lives(start_kernel, tmp_path):
    folder = make_folder(tmp_path / "notebook")
    kernel = start_kernel([NEW_FILES], cwd=folder)
    flood = kernel.execute(
        "import os; os.mkdir('flood')\n"
        "for i in range(1100):\n    open(f'flood/{i:04}.txt', 'w').write('x')"
    )
    ok(flood)
    told = flood.stream_text("stderr")
    assert "not written to the notebook's folder" in told and "1,000 files" in told, told
    assert len(os.listdir(folder / "flood")) == 1000
    assert plain(ok(kernel.execute("len(os.listdir('flood'))"))) == 1100  # kept in the layer
    again = kernel.execute("for i in range(200):\n    os.remove(f'flood/{i:04}.txt')")
    assert "not written" not in ok(again).stream_text("stderr")  # told once per file
    assert len(os.listdir(folder / "flood")) == 900  # 200 removed, the 100 kept back written
    assert not (folder / "flood" / "0000.txt").exists()
    # the bytes: the scratch limit stops the cell, and no more than it reaches the host
    limit = 16 << 20
    small = start_kernel([NEW_FILES, f"--WasmKernel.scratch_limit={limit}"], cwd=folder)
    stopped = small.execute("open('big.bin', 'wb').write(bytes(64 << 20))")
    assert stopped.content["ename"] == "ScratchLimitExceeded", stopped.content
    assert not (folder / "big.bin").exists() or (folder / "big.bin").stat().st_size <= limit
    assert plain(ok(small.execute("1 + 1"))) == 2
    # files written through stay on the host when a snapshot takes the layer back: they still
    # count, so the next file that would pass the limit stays in the layer, and the cell says so
    ok(small.execute("import os\nos.remove('big.bin')\n%snapshot save empty"))
    ok(small.execute("open('a.bin', 'wb').write(bytes(10 << 20))"))
    ok(small.execute("%snapshot restore empty"))
    told = ok(small.execute("open('b.bin', 'wb').write(bytes(10 << 20))")).stream_text("stderr")
    assert "/notebook/b.bin" in told and f"{limit:,} bytes (scratch_limit)" in told, told
    assert (folder / "a.bin").stat().st_size == 10 << 20 and not (folder / "b.bin").exists()


def test_code_and_hidden_files_stay_private_and_nothing_is_executable(start_kernel, tmp_path):
    folder = make_folder(tmp_path / "notebook")
    kernel = start_kernel([NEW_FILES], cwd=folder)
    cell = (
        "import os\nfor name in ('conftest.py', 'run.sh', 'jupyter_server_config.json.py',"
        " 'data.pkl', '.envrc'):\n    open(name, 'w').write('x')\n"
        "os.mkdir('.git'); open('.git/config.csv', 'w').write('x')\nopen('plot.png', 'wb')"
        ".write(b'png')"
    )
    run = ok(kernel.execute(cell))
    assert NOTICE in run.stream_text("stderr") and "never code" in run.stream_text("stderr")
    assert sorted(os.listdir(folder)) == ["plot.png", "sales.csv", "sub"]
    mode = (folder / "plot.png").stat().st_mode
    assert stat.S_IMODE(mode) == 0o600 and not mode & 0o111
    described = kernel.execute("%sandbox").stream_text()
    assert "new data files are written through" in described, described
    assert "new data files written there reach it" in kernel.banner()
    assert "stay in the sandbox" not in kernel.banner()


def test_overlay_says_once_where_a_write_went(start_kernel, tmp_path):
    folder = make_folder(tmp_path / "notebook")
    before = digest(files_of(folder))
    kernel = start_kernel(cwd=folder)  # the notebook profile's default: overlay
    assert NOTICE not in ok(kernel.execute("x = open('sales.csv').read()")).stream_text("stderr")
    first = ok(kernel.execute("open('out.csv', 'w').write('a')")).stream_text("stderr")
    assert NOTICE in first and "/notebook/out.csv" in first, first
    assert "new-files" in first and "%sandbox" in first, first
    second = ok(kernel.execute("open('out2.csv', 'w').write('b')")).stream_text("stderr")
    assert NOTICE not in second, second
    assert digest(files_of(folder)) == before and sorted(os.listdir(folder)) == ["sales.csv", "sub"]
