"""Files a session holds open come back with every kind of image (issue 38, item 1).

Common libraries keep files open across cells: matplotlib its fonts (FreeType reads them
through Python file objects), sqlite3 its database, logging its FileHandler, zipfile its
archive, tempfile its files, a cell its reader half-way through a file. Each kind of image
(``%snapshot restore`` in place, a fork, ``resume_from`` in another kernel, a hibernated
notebook reopened) resumes the guest in a fresh instance, whose WASI descriptor table the
host fills again. The same cells run in the kernel that took the images, without one, give
what each resumed kernel must give.
"""

from __future__ import annotations

from pathlib import Path

from conftest import Kernel, ok, plain

SETUP = """
import io, logging, os, sqlite3, tempfile, zipfile
import matplotlib.pyplot as plt
import pandas as pd
from PIL import Image

def plot():
    fig, ax = plt.subplots()
    ax.set_title("Title: glyphs ÅÉß")
    ax.text(0.5, 0.5, "text 0123456789", fontfamily="serif")
    ax.plot([1, 3, 2])
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return len(out.getvalue()) > 1000

drawn = plot()
db = sqlite3.connect("/tmp/habits.db")
db.execute("create table t (x)")
db.execute("insert into t values (1)")
db.commit()
with open("/tmp/lines.txt", "w") as file:
    file.write("one\\ntwo\\nthree\\nfour\\n")
reader = open("/tmp/lines.txt")
first = reader.readline()
with zipfile.ZipFile("/tmp/habits.zip", "w") as archive:
    archive.writestr("inside.txt", "zipped text")
zipped = zipfile.ZipFile("/tmp/habits.zip")
log = logging.getLogger("habits")
log.addHandler(logging.FileHandler("/tmp/habits.log"))
log.warning("before")
named = tempfile.NamedTemporaryFile("w+", prefix="habit-")
named.write("named temporary")
spooled = tempfile.SpooledTemporaryFile(max_size=1 << 20, mode="w+")
spooled.write("spooled")
folder = tempfile.TemporaryDirectory()
appended = open(os.path.join(folder.name, "appended.txt"), "a")
appended.write("first;")
raw = os.open("/tmp/lines.txt", os.O_RDONLY)
os.lseek(raw, 4, os.SEEK_SET)
unnamed = tempfile.TemporaryFile("w+")  # removed at once: only its descriptor names it
unnamed.write("unnamed temporary")
Image.new("RGB", (8, 8), (200, 30, 60)).save("/tmp/picture.png")
picture = Image.open("/tmp/picture.png")  # reads the pixels on first use
book = pd.ExcelWriter("/tmp/book.xlsx")  # opened for writing now, written at close
pd.DataFrame({"a": [1, 2]}).to_excel(book, sheet_name="first", index=False)
going = open("/data/going.txt")  # removed on the host before the session is resumed
"""

CHECK = """
db.execute("insert into t values (2)")
db.commit()
log.warning("after")
appended.write("again;")
appended.flush()
named.seek(0)
spooled.seek(0)
unnamed.seek(0)
(
    plot(),
    db.execute("select sum(x), count(*) from t").fetchone(),
    reader.readline(),
    reader.tell(),
    zipped.read("inside.txt").decode(),
    open("/tmp/habits.log").read(),
    named.read(),
    spooled.read(),
    open(os.path.join(folder.name, "appended.txt")).read(),
    os.read(raw, 4).decode(),
    unnamed.read(),
    picture.getpixel((3, 3)),
    sorted(os.listdir("/tmp")),
)
"""
WRITE_BOOK = """
pd.DataFrame({"b": [3]}).to_excel(book, sheet_name="second", index=False)
book.close()
{name: frame.to_dict("list") for name, frame in pd.read_excel("/tmp/book.xlsx", None).items()}
"""


RESUMED = "wasm-kernel: resumed this notebook's session"  # the reopened notebook's notice


def mounted(data: Path) -> list[str]:
    return [f"--WasmKernel.mounts=['{data}:/data:rw']"]


def environment(folder: Path, notebook: str | None = None) -> dict[str, str]:
    """A notebook's kernel hibernates when it shuts down; the others only resume."""
    env = {"WASM_KERNEL_SNAPSHOT_DIR": str(folder)}
    return env if notebook is None else {**env, "JPY_SESSION_NAME": notebook}


def checked(kernel: Kernel) -> object:
    """CHECK's result, after checking the cell wrote nothing to stderr (matplotlib's
    'Exception ignored in read_from_file_callback' comes that way)."""
    run = kernel.execute(CHECK)
    told = run.stream_text("stderr").splitlines()
    assert [line for line in told if not line.startswith(RESUMED)] == [], told
    return plain(run)


def lost_file_is_named(kernel: Kernel) -> None:
    """The file removed meanwhile: the first cell names it, its object raises OSError."""
    run = kernel.execute("going.read()")
    assert run.content["status"] == "error"
    assert run.content["ename"] in ("OSError", "PermissionError"), run.content
    told = run.stream_text("stderr")
    assert "files open in the saved session are gone (/data/going.txt)" in told, told


def test_open_files_come_back_after_every_kind_of_image(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "going.txt").write_text("soon gone")
    images = tmp_path / "images"
    env, notebook = environment(images), environment(images, "habits.ipynb")
    kernel = Kernel(mounted(data), env=notebook)
    try:
        ok(kernel.execute(SETUP))
        assert plain(kernel.execute("drawn, first")) == (True, "one\n")
        ok(kernel.execute("%snapshot save habits"))
        ok(kernel.execute("%snapshot fork habits-fork"))
        forked = Kernel(["--WasmKernel.resume_from=habits-fork", *mounted(data)], env=env)
        try:
            after_fork = checked(forked), plain(forked.execute(WRITE_BOOK))
        finally:
            forked.shutdown()
        once = checked(kernel)  # the same cells, without an image
        twice = checked(kernel)
        book = plain(kernel.execute(WRITE_BOOK))
        assert book == {"first": {"a": [1, 2]}, "second": {"b": [3]}}
        assert once != twice  # CHECK moves every handle on: a stale one shows
        assert after_fork == (once, book)
        ok(kernel.execute("%snapshot restore habits"))
        assert checked(kernel) == once
    finally:
        kernel.shutdown()  # hibernates the session: the restored one, CHECK run once
    (data / "going.txt").unlink()
    resumed = Kernel(["--WasmKernel.resume_from=habits", *mounted(data)], env=env)
    try:
        lost_file_is_named(resumed)
        assert checked(resumed) == once
        assert plain(resumed.execute(WRITE_BOOK)) == book
    finally:
        resumed.shutdown()
    reopened = Kernel(mounted(data), env=notebook)  # the notebook opened again
    try:
        lost_file_is_named(reopened)
        assert checked(reopened) == twice
        assert plain(reopened.execute(WRITE_BOOK)) == book
    finally:
        reopened.shutdown()
