"""The command line as a newcomer meets it: help, install's ipykernel-style flags, ``run``
from any folder, and the README's papermill and ``jupyter execute`` lines run as written.

Everything goes through a subprocess of ``python -m wasm_kernel`` (or the tool the README
names), so what is tested is what a user types.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from wasm_kernel.settings.profiles import PROFILES

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def cli(
    *arguments: str, cwd: Path | None = None, env: dict | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wasm_kernel", *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        check=check,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def kernel_jsons(kernels: Path) -> dict[str, dict]:
    return {
        path.parent.name: json.loads(path.read_text()) for path in kernels.glob("*/kernel.json")
    }


# -- help ------------------------------------------------------------------------------------


def test_help_lists_our_commands_and_where_the_settings_are() -> None:
    shown = cli("--help").stdout
    for command in ("install", "precompile", "run", "kernel"):
        assert re.search(rf"^\s+{command}\b", shown, re.MULTILINE), command
    assert "python -m wasm_kernel --help-all" in " ".join(shown.split())  # however wrapped
    assert "IPython kernel" not in shown  # ipykernel's own `install` is not offered


def test_help_shows_each_command_s_line_as_written() -> None:
    """Subcommand help lines are argparse format strings too: '%snapshot' in one was read as
    a format code and printed argparse's dictionary in its place."""
    shown = " ".join(cli("--help").stdout.split())
    assert "(%snapshot, hibernation)" in shown
    assert "option_strings" not in shown and "{'" not in shown


@pytest.mark.parametrize("command", ["install", "precompile", "run", "mcp", "snapshot"])
def test_every_command_has_help(command: str) -> None:
    """Help texts are argparse format strings: a bare % in one (from a profile's summary,
    '%pip') made --help crash."""
    shown = cli(command, "--help").stdout
    assert shown.startswith(f"usage: python -m wasm_kernel {command}")


def test_help_all_shows_our_settings_first_with_real_defaults() -> None:
    """traitlets alone printed them last, with 0, [] and Undefined for dynamic defaults and
    private settings among them."""
    shown = cli("--help-all", env={"WASM_KERNEL_TIME_LIMIT": "45"}).stdout
    ours_end = shown.index("ipykernel settings")
    ours, theirs = shown[:ours_end], shown[ours_end:]
    assert shown.index("--WasmKernel.fuel=") < ours_end < shown.index("--Session.")
    notebook, strict = PROFILES["notebook"], PROFILES["strict"]
    flat = " ".join(ours.split())  # help text is wrapped at 80 columns
    assert f"Default: {notebook.fuel:,} units (notebook profile); {strict.fuel:,} units" in flat
    assert "Default: ['.:/notebook:ro'] (notebook profile); [] (strict profile)" in flat
    assert "Default: '/notebook' (notebook profile); '/tmp' (strict profile)" in flat
    assert "Default: 'block' (every profile)" in flat
    assert "here WASM_KERNEL_TIME_LIMIT='45' sets it" in flat
    for wrong in ("Undefined", "Default: 0\n", "Default: []", "Default: ''"):
        assert wrong not in ours, wrong
    assert "._" not in shown  # no private setting, ours or ipykernel's
    assert "--Kernel.stop_on_error_timeout=" in theirs  # ipykernel's settings follow
    assert "--ZMQInteractiveShell." not in theirs  # no IPython shell runs here


# -- extras ----------------------------------------------------------------------------------

WITHOUT = (  # a Python where a package cannot be imported, as in an environment without it
    "import sys; sys.modules[{module!r}] = None\n{code}"
)


def test_a_missing_extra_is_named_with_a_command_that_works_from_here() -> None:
    """The MCP server without mcp, and a host tool without pydantic, say how to add the agents
    extra as pip takes it from where this package was installed (a clone: its folder, which
    pip resolves; the package index has no clone's code)."""
    from wasm_kernel.install_hints import installed_from

    mcp = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT.format(
                module="mcp", code="from wasm_kernel.__main__ import main; sys.exit(main(['mcp']))"
            ),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert mcp.returncode == 2, mcp.stderr
    tools = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT.format(
                module="pydantic",
                code="from wasm_kernel.agents.tools import python_tool\npython_tool(print)",
            ),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "ToolDeclarationError" in tools.stderr, tools.stderr
    source, editable = installed_from()
    expected = f"{source}[agents]" if source else "wasm-kernel[agents]"
    [command] = re.findall(r"agents extra installs: (.*)$", mcp.stderr, re.MULTILINE)
    assert command in tools.stderr and expected in command, (command, tools.stderr)
    assert (" -e " in command) == editable
    if source is not None:  # pip accepts it as given
        dry_run = subprocess.run(
            [*shlex.split(command), "--dry-run", "--quiet"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert dry_run.returncode == 0, dry_run.stderr[-3000:]


# -- install ---------------------------------------------------------------------------------


def test_install_takes_ipykernel_flags_and_derives_names_per_profile(tmp_path: Path) -> None:
    done = cli(
        "install",
        "--prefix",
        str(tmp_path),
        "--no-precompile",
        "--name",
        "mine",
        "--display-name",
        "Mine",
        "--env",
        "WASM_KERNEL_FUEL",
        "2e11",
        "--env",
        "A",
        "b",
    )
    kernels = tmp_path / "share" / "jupyter" / "kernels"
    specs = kernel_jsons(kernels)
    assert sorted(specs) == ["mine", "mine-strict"]
    assert specs["mine"]["display_name"] == "Mine"
    assert specs["mine-strict"]["display_name"] == "Mine (strict)"
    for spec in specs.values():
        assert spec["env"] == {"WASM_KERNEL_FUEL": "2e11", "A": "b"}
    assert "--WasmKernel.profile=strict" in specs["mine-strict"]["argv"]
    for name in specs:  # where each went, and how to get to it
        assert str(kernels / name) in done.stdout
    assert "jupyter lab" in done.stdout and "'Mine (strict)'" in done.stdout
    assert f"JUPYTER_PATH={tmp_path.resolve() / 'share' / 'jupyter'}" in done.stdout


def test_install_again_writes_whole_lines_saying_what_was_there(tmp_path: Path) -> None:
    """Into a log (not a terminal): lines without carriage returns; with the cache filled,
    nothing is said to be downloaded or compiled, and no warning of the guest's packages."""
    done = cli("install", "--prefix", str(tmp_path), "--sandbox-profile", "strict")
    shown = done.stdout + done.stderr
    assert "\r" not in shown, shown
    assert "downloading" not in shown and "compiling" not in shown, shown
    assert "Warning" not in shown, shown
    assert "is already in the cache" in done.stderr, done.stderr
    assert "ready in" in done.stderr, done.stderr


def test_progress_into_a_log_is_one_whole_line_per_step() -> None:
    """A step's progress, where stderr is a pipe: one line when it is done, no \\r."""
    code = (
        "import time; from wasm_kernel.__main__ import progress\n"
        "with progress('a step'):\n    time.sleep(0.6)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stderr == "a step: done in 00:00\n", repr(done.stderr)


def test_install_names_what_jupyterlab_needs_for_widgets(tmp_path: Path) -> None:
    """Without jupyterlab_widgets, JupyterLab shows widgets and tqdm's bars as text:
    install's closing message says how to add it (the lab extra, as pip takes it here)."""
    code = WITHOUT.format(
        module="jupyterlab_widgets",
        code="from wasm_kernel.__main__ import main\n"
        f"main(['install', '--prefix', {str(tmp_path)!r}, '--no-precompile'])",
    )
    without = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    [line] = [line for line in without.stdout.splitlines() if "jupyterlab_widgets" in line]
    assert "widgets" in line and "[lab]" in line and " install " in line, line
    present = cli("install", "--prefix", str(tmp_path), "--no-precompile")
    assert "jupyterlab_widgets" not in present.stdout, present.stdout


def test_install_one_profile_takes_names_as_written(tmp_path: Path) -> None:
    cli(
        "install",
        "--prefix",
        str(tmp_path),
        "--no-precompile",
        "--sandbox-profile",
        "strict",
        "--name",
        "exam",
        "--display-name",
        "Exam kernel",
    )
    specs = kernel_jsons(tmp_path / "share" / "jupyter" / "kernels")
    assert list(specs) == ["exam"]
    assert specs["exam"]["display_name"] == "Exam kernel"
    assert "--WasmKernel.mounts=[]" in specs["exam"]["argv"]
    assert "env" not in specs["exam"]


def test_install_for_the_user(tmp_path: Path) -> None:
    """--user goes to the user's Jupyter data folder, even inside a virtual environment."""
    done = cli(
        "install",
        "--user",
        "--no-precompile",
        "--sandbox-profile",
        "notebook",
        env={"JUPYTER_DATA_DIR": str(tmp_path)},
    )
    assert list(kernel_jsons(tmp_path / "kernels")) == ["wasm-python"]
    assert "JUPYTER_PATH" not in done.stdout  # Jupyter looks there already


def test_install_into_sys_prefix() -> None:
    name = f"wasm-cli-test-{os.getpid()}"
    folder = Path(sys.prefix) / "share" / "jupyter" / "kernels" / name
    try:
        cli(
            "install",
            "--sys-prefix",
            "--no-precompile",
            "--sandbox-profile",
            "strict",
            "--name",
            name,
        )
        assert json.loads((folder / "kernel.json").read_text())["argv"][0] == sys.executable
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_install_profile_flag_does_not_take_ipython_profiles(tmp_path: Path) -> None:
    """ipykernel's --profile names an IPython profile; ours was renamed --sandbox-profile.
    The old spelling still picks a sandbox profile, with a note."""
    old = cli("install", "--prefix", str(tmp_path), "--no-precompile", "--profile", "strict")
    assert "--sandbox-profile strict" in old.stderr
    assert list(kernel_jsons(tmp_path / "share" / "jupyter" / "kernels")) == ["wasm-python-strict"]
    refused = cli(
        "install", "--prefix", str(tmp_path), "--no-precompile", "--profile", "default", check=False
    )
    assert refused.returncode == 2
    assert "IPython profile" in refused.stderr and "--sandbox-profile" in refused.stderr


def test_install_places_are_exclusive(tmp_path: Path) -> None:
    refused = cli("install", "--user", "--prefix", str(tmp_path), check=False)
    assert refused.returncode == 2 and "not allowed with" in refused.stderr


# -- run ---------------------------------------------------------------------------------------


@pytest.fixture
def notebook_with_csv(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "sales.csv").write_text("region,amount\nnorth,3\nsouth,4\n")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(
            "import os, pandas as pd\nprint('in', os.getcwd())\n"
            "print('total', int(pd.read_csv('sales.csv').amount.sum()))"
        )
    ]
    nbformat.write(notebook, folder / "report.ipynb")
    return folder / "report.ipynb"


@pytest.mark.slow
def test_run_from_another_folder_mounts_the_notebooks_folder(
    tmp_path: Path, notebook_with_csv: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = cli("run", os.path.relpath(notebook_with_csv, elsewhere), cwd=elsewhere)
    assert "in /notebook" in done.stdout
    assert "total 7" in done.stdout
    assert "Parent appears to have exited" not in done.stderr  # the kernel was shut down


@pytest.mark.slow
def test_run_reports_a_missing_notebook_or_kernelspec(
    tmp_path: Path, notebook_with_csv: Path
) -> None:
    missing = cli("run", str(tmp_path / "nope.ipynb"), check=False)
    assert missing.returncode == 2 and "no notebook at" in missing.stderr
    unknown = cli("run", str(notebook_with_csv), "--kernel-name", "no-such-kernel", check=False)
    assert unknown.returncode == 2 and "no kernelspec named 'no-such-kernel'" in unknown.stderr


# -- the README's command-line examples ----------------------------------------------------------


def readme_command(tool: str) -> str:
    """The README's example line that starts with ``tool``, as written."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith(tool + " "):
            return line.strip()
    raise AssertionError(f"no `{tool} ...` line in README.md")


def run_from_root(command: str) -> subprocess.CompletedProcess[str]:
    """``command`` from the repository root, with this environment's tools first on PATH
    (as after activating the venv)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        command,
        shell=True,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.skipif(
    shutil.which("papermill", path=str(BIN)) is None, reason="papermill is in the test extra"
)
@pytest.mark.slow
def test_readme_papermill_line_works_from_the_repository_root(tmp_path: Path) -> None:
    command = readme_command("papermill")
    output = command.split()[2]  # papermill IN OUT ...: written into tmp_path, not the repo
    done = run_from_root(command.replace(f" {output} ", f" {tmp_path / 'out.ipynb'} ", 1))
    assert done.returncode == 0, done.stderr[-3000:]
    executed = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    errors = [o for c in executed.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


@pytest.mark.slow
def test_readme_jupyter_execute_line_works_from_the_repository_root() -> None:
    done = run_from_root(readme_command("jupyter execute"))
    assert done.returncode == 0, done.stderr[-3000:]


# -- the README's list of what works -----------------------------------------------------------


def readme_examples() -> list[tuple[str, str]]:
    """(works, example) for each row of the README's "What works" table."""
    text = (ROOT / "README.md").read_text()
    section = text.split("### What works as under ipykernel")[1].split("\n#")[0]
    rows = re.findall(r"^\| (yes|no) \|.*\| `([^`]+)` \|$", section, re.MULTILINE)
    assert len(rows) >= 10, rows
    return rows


@pytest.mark.slow
def test_readme_list_of_what_works_is_true(start_kernel) -> None:
    """Each example succeeds or fails as its row says (how it fails is other tests' concern:
    the messages are being improved)."""
    kernel = start_kernel(cwd=ROOT / "notebooks")
    for works, example in readme_examples():
        reply = kernel.execute(example).content
        assert reply["status"] == ("ok" if works == "yes" else "error"), (example, reply)


# -- jupyter console -----------------------------------------------------------------------------


@pytest.mark.slow
def test_jupyter_console_as_the_readme_suggests_runs_a_line(tmp_path: Path) -> None:
    """README and install's closing message say `jupyter console --kernel wasm-python`:
    it must be installed with the kernel, start it and run what is typed. Before the first
    prompt the user sees the console's line and the kernel's short banner, and no log line
    of ours (a first start, while the kernel server loads, launches the ordinary way)."""
    pexpect = pytest.importorskip("pexpect")
    jupyter = shutil.which("jupyter", path=str(BIN))
    assert jupyter is not None
    runtime = tmp_path / "runtime"  # no kernel server runs for it yet
    runtime.mkdir(mode=0o700)
    console = pexpect.spawn(
        jupyter,
        ["console", "--kernel", "wasm-python", "--simple-prompt"],
        encoding="utf-8",
        timeout=60,
        env={
            **os.environ,
            "TERM": "dumb",
            "JUPYTER_RUNTIME_DIR": str(runtime),
            "WASM_KERNEL_SERVER_IDLE": "5",  # the server it starts ends soon after
        },
    )
    try:
        console.expect(r"In \[1\]: ")
        shown = console.before.replace("\r\n", "\n").strip().splitlines()
        assert shown[0].startswith("Jupyter console"), shown
        assert not [line for line in shown if line.startswith("[")], shown  # a log line
        assert len(shown) <= 10 and "%sandbox" in shown[-1], shown
        console.sendline("print(6 * 7, 'from the sandbox')")
        console.expect("42 from the sandbox")
        console.expect(r"In \[2\]: ")
        console.sendline("import sys; sys.platform")
        console.expect(r"Out\[2\]: 'wasi'")
        console.sendline("exit")
        console.expect(pexpect.EOF)
    finally:
        console.close(force=True)
