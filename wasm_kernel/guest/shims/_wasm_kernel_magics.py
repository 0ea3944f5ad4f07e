"""The IPython magics notebook users type most, implemented for the sandbox.

Imported on the first magic of a session. Anything that would start a process (``!cmd``,
``%%bash`` ...) ends in a clear error saying why; ``%pip`` asks the host for packages.
"""

import os
import time


class UsageError(Exception):
    """A magic was misused or does not exist (IPython's name for it)."""


UsageError.__module__ = "builtins"  # shown by its bare name, as in IPython


def run_line_magic(shell, name, line):
    magic = LINE_MAGICS.get(name)
    if magic is None:
        if name in CELL_MAGICS:
            raise UsageError(
                f"Line magic function `%{name}` not found (But cell magic "
                f"`%%{name}` exists, did you mean that instead?)."
            )
        raise UsageError(f"Line magic function `%{name}` not found.")
    return magic(shell, line)


def run_cell_magic(shell, name, line, cell):
    magic = CELL_MAGICS.get(name)
    if magic is None:
        raise UsageError(f"Cell magic `%%{name}` not found.")
    return magic(shell, line, cell)


def _run_body(shell, cell):
    # One blank line first keeps tracebacks' line numbers those of the cell (line 1 is %%).
    shell.run_cell("\n" + cell)


# -- processes and packages: not in the sandbox ------------------------------------------------


def no_processes(what):
    raise UsageError(
        f"{what}: this kernel runs Python in a WebAssembly sandbox, which cannot start"
        " processes or shell commands. Use Python instead (os, pathlib, shutil work on the"
        " sandbox's own files)."
    )


def pip_magic(shell, line):
    """%pip install/uninstall/list/show: the host's pip does the work; this sends names only."""
    import importlib
    import shlex

    import _wasm_kernel

    words, args, upgrade = shlex.split(line), [], False
    command = words.pop(0) if words else ""
    if command not in ("install", "uninstall", "list", "show"):
        raise UsageError(f"%pip {command}: the commands here are install, uninstall, list, show")
    while words:
        word = words.pop(0)
        if word in ("-r", "--requirement") and words:
            with open(words.pop(0)) as requirements:  # the guest's file; the host gets names
                args += [
                    text for text in (row.split("#")[0].strip() for row in requirements) if text
                ]
        elif word in ("-U", "--upgrade"):
            upgrade = True
        elif word not in ("-y", "--yes", "-q", "--quiet"):
            args.append(word)
    reply = _wasm_kernel.call_host("pip", command=command, args=args, upgrade=upgrade)
    importlib.invalidate_caches()
    if reply.get("error") == "interrupted":
        raise KeyboardInterrupt
    if reply.get("text"):
        print(reply["text"])
    if reply.get("error"):
        raise UsageError(reply["error"])


def conda_magic(shell, line):
    raise UsageError(
        "%conda: conda cannot run in this sandbox (no processes); %pip install takes"
        " pure-Python packages where the kernel allows it. `%pip list` shows what the runtime"
        " ships."
    )


# -- timing ------------------------------------------------------------------------------------


def _format_time(seconds):
    units = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9))
    for unit, scale in units:
        if seconds >= scale or unit == "ns":
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.3g} s"


def _timed(shell, source, namespace):
    """Run ``source`` (statement or expression); return its value, print IPython-style times."""
    import ast

    tree = ast.parse(source)
    body, last = tree.body, None
    if body and isinstance(body[-1], ast.Expr):  # like IPython: the last expression's value
        body, last = body[:-1], body[-1].value
    wall, cpu = time.perf_counter(), time.process_time()
    exec(compile(ast.Module(body=body, type_ignores=[]), "<timed>", "exec"), namespace)
    value = eval(compile(ast.Expression(last), "<timed>", "eval"), namespace) if last else None
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"CPU times: total: {_format_time(cpu)}")
    print(f"Wall time: {_format_time(wall)}")
    return value


def time_magic(shell, line):
    return _timed(shell, line, shell.user_ns)


def time_cell_magic(shell, line, cell):
    return _timed(shell, cell, shell.user_ns)


class TimeitResult:
    """What ``%timeit -o`` returns: the per-loop times of each run."""

    def __init__(self, loops, repeat, all_runs):
        self.loops, self.repeat, self.all_runs = loops, repeat, all_runs
        self.timings = [run / loops for run in all_runs]
        self.best, self.worst = min(self.timings), max(self.timings)
        self.average = sum(self.timings) / len(self.timings)
        variance = sum((t - self.average) ** 2 for t in self.timings) / len(self.timings)
        self.stdev = variance**0.5

    def __str__(self):
        runs = "run" if self.repeat == 1 else "runs"
        loops = "loop" if self.loops == 1 else "loops"
        return (
            f"{_format_time(self.average)} ± {_format_time(self.stdev)} per loop"
            f" (mean ± std. dev. of {self.repeat} {runs}, {self.loops:,} {loops} each)"
        )

    __repr__ = __str__


def _timeit(shell, options, setup, statement):
    import timeit

    timer = timeit.Timer(statement, setup or "pass", globals=shell.user_ns)
    loops = int(options.get("n", 0))
    repeat = int(options.get("r", 7))
    if not loops:  # like IPython: enough loops for about 0.2 s per run
        loops = 1
        while loops < 10**9 and timer.timeit(loops) < 0.2:
            loops *= 10
    result = TimeitResult(loops, repeat, timer.repeat(repeat, loops))
    if "q" not in options:
        print(result)
    return result if "o" in options else None


def _parse_options(line, spec):
    """Leading getopt-style options (``-n 10 -r3 -qo``) of a magic; returns (options, rest)."""
    with_value = {spec[i] for i in range(len(spec) - 1) if spec[i + 1] == ":"}
    letters = set(spec.replace(":", ""))
    options, rest = {}, line.strip()
    while rest.startswith("-") and len(rest) > 1 and rest[1].isalpha():
        word, _, rest = rest.partition(" ")
        rest = rest.lstrip()
        for index, letter in enumerate(word[1:], start=1):
            if letter not in letters:
                raise UsageError(f"option -{letter} not recognized")
            if letter in with_value:
                value = word[index + 1 :]
                if not value:
                    value, _, rest = rest.partition(" ")
                    rest = rest.lstrip()
                options[letter] = value
                break
            options[letter] = ""
    return options, rest


TIMEIT_OPTIONS = "n:r:qo"


def timeit_magic(shell, line):
    options, statement = _parse_options(line, TIMEIT_OPTIONS)
    return _timeit(shell, options, "", statement)


def timeit_cell_magic(shell, line, cell):
    options, setup = _parse_options(line, TIMEIT_OPTIONS)
    return _timeit(shell, options, setup, cell)


# -- namespace ---------------------------------------------------------------------------------


def _user_names(shell, types=()):
    hidden = shell.initial_names
    names = []
    for name, value in shell.user_ns.items():
        if name.startswith("_") or name in hidden:
            continue
        if types and type(value).__name__ not in types:
            continue
        names.append(name)
    return sorted(names)


def who_magic(shell, line):
    names = _user_names(shell, line.split())
    print("\t".join(names) if names else "Interactive namespace is empty.")


def whos_magic(shell, line):
    names = _user_names(shell, line.split())
    if not names:
        print("Interactive namespace is empty.")
        return
    rows = []
    for name in names:
        value = shell.user_ns[name]
        info = repr(value).replace("\n", "\\n")
        rows.append((name, type(value).__name__, info if len(info) < 60 else info[:57] + "..."))
    widths = [
        max(len(row[i]) for row in rows + [("Variable", "Type", "Data/Info")]) for i in range(2)
    ]
    print(f"{'Variable':<{widths[0]}}   {'Type':<{widths[1]}}   Data/Info")
    print("-" * (widths[0] + widths[1] + 20))
    for name, kind, info in rows:
        print(f"{name:<{widths[0]}}   {kind:<{widths[1]}}   {info}")


def reset_magic(shell, line):
    args = line.split()
    if "-f" not in args:
        answer = input("Once deleted, variables cannot be recovered. Proceed (y/[n])? ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing done.")
            return
    for name in _user_names(shell) + [n for n in list(shell.user_ns) if n in ("_", "__", "___")]:
        shell.user_ns.pop(name, None)


# -- files and environment (of the sandbox) ----------------------------------------------------


def pwd_magic(shell, line):
    return os.getcwd()


def cd_magic(shell, line):
    target = line.strip() or os.environ.get("HOME", "/tmp")
    try:
        os.chdir(os.path.expanduser(target))
    except OSError as exc:
        raise UsageError(f"%cd {target}: {exc.strerror or exc}") from None
    print(os.getcwd())


def env_magic(shell, line):
    line = line.strip()
    if not line:
        return dict(os.environ)
    if "=" in line or " " in line:
        name, _, value = line.replace("=", " ", 1).partition(" ")
        os.environ[name.strip()] = value.strip()
        print(f"env: {name.strip()}={value.strip()}")
        return None
    if line not in os.environ:
        raise UsageError(f"Environment does not have key: {line}")
    return os.environ[line]


def sandbox_magic(shell, line):
    """What the kernel says the sandbox grants: profile, host folders, limits, runtime."""
    import _wasm_kernel

    print(_wasm_kernel.call_host("describe").get("text", "(not available here)"))


def snapshot_magic(shell, line):
    """%snapshot save|restore|list|delete NAME: the kernel saves or restores when the cell ends."""
    import _wasm_kernel

    action, _, name = line.strip().partition(" ")
    reply = _wasm_kernel.call_host("snapshot", action=action, name=name.strip())
    if "error" in reply:
        raise UsageError(reply["error"])
    if reply.get("text"):
        print(reply["text"])


# -- matplotlib, extensions, capture, config ---------------------------------------------------


def matplotlib_magic(shell, line):
    backend = line.strip() or "inline"
    if backend != "inline":
        raise UsageError(
            f"%matplotlib {backend}: only the inline backend works in this sandbox (figures are"
            " sent to the notebook as images); there is no GUI to draw on."
        )
    import matplotlib

    from matplotlib_inline import sandbox_backend

    matplotlib.use(sandbox_backend.NAME)


def config_magic(shell, line):
    """``%config InlineBackend.figure_format = 'svg'`` and friends."""
    import ast

    target, _, value = line.partition("=")
    owner, _, attribute = target.strip().partition(".")
    if owner != "InlineBackend" or not attribute:
        raise UsageError(f"%config: only InlineBackend settings exist here, not {target.strip()!r}")
    from matplotlib_inline import backend_inline

    backend_inline.configure(**{attribute: ast.literal_eval(value.strip())})


def load_ext_magic(shell, line):
    import importlib

    module = importlib.import_module(line.strip())
    loader = getattr(module, "load_ipython_extension", None)
    if loader is None:
        raise UsageError(f"{line.strip()} is not an IPython extension (no load_ipython_extension)")
    loader(shell)


def capture_cell_magic(shell, line, cell):
    from IPython.utils.capture import capture_output

    options = line.split()
    name = next((word for word in options if not word.startswith("-")), None)
    with capture_output(
        stdout="--no-stdout" not in options,
        stderr="--no-stderr" not in options,
        display="--no-display" not in options,
    ) as captured:
        _run_body(shell, cell)
    if name:
        shell.user_ns[name] = captured


def _no_process_magic(label):
    return lambda shell, line, cell=None: no_processes(label)


LINE_MAGICS = {
    "time": time_magic,
    "timeit": timeit_magic,
    "who": who_magic,
    "whos": whos_magic,
    "reset": reset_magic,
    "pwd": pwd_magic,
    "cd": cd_magic,
    "env": env_magic,
    "sandbox": sandbox_magic,
    "snapshot": snapshot_magic,
    "matplotlib": matplotlib_magic,
    "config": config_magic,
    "load_ext": load_ext_magic,
    "pip": pip_magic,
    "conda": conda_magic,
    "system": _no_process_magic("%system"),
    "sx": _no_process_magic("%sx"),
}

CELL_MAGICS = {
    "time": time_cell_magic,
    "timeit": timeit_cell_magic,
    "capture": capture_cell_magic,
    "bash": _no_process_magic("%%bash"),
    "sh": _no_process_magic("%%sh"),
    "script": _no_process_magic("%%script"),
    "system": _no_process_magic("%%system"),
}
