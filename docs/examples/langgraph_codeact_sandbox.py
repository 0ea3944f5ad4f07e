"""An ``eval_fn`` for LangGraph CodeAct (langgraph-codeact) that runs the model's code in
the sandbox.

CodeAct hands ``eval_fn`` the code and a dict of variables and tools, and keeps the
variables it returns for the next call. Here the kernel keeps them itself (names persist
between cells), so nothing is returned; tools passed as Python functions cannot cross into
the sandbox, so give CodeAct none and let the code use what the sandbox has.

    from langgraph_codeact import create_codeact
    with Session("strict") as session:
        graph = create_codeact(model, [], make_eval_fn(session)).compile()

(This file is not named ``langgraph_codeact.py``: run as a script, it would be imported in
place of the package.) ``python docs/examples/langgraph_codeact_sandbox.py`` calls the
``eval_fn`` as CodeAct would, with fixed code in place of a model's, and prints what CodeAct
would hand back to the model. It needs ``python -m wasm_kernel install`` first; CodeAct
itself (langgraph-codeact) comes with wasm-kernel's ``frameworks`` extra (``pip install
'.[frameworks]'`` in a clone).
"""

import re
from collections.abc import Callable
from typing import Any

from wasm_kernel.client import Session

CODE = (  # what a model could write; here fixed, so no model is needed
    "import statistics\nm = statistics.mean([2, 4, 9])\nprint('mean:', m)",
    "print(m * 2)",  # names persist between calls
    "print(open('/etc/hostname').read())",  # no host file in the strict profile
)


def make_eval_fn(
    session: Session, timeout: float | None = 60
) -> Callable[[str, dict[str, Any]], tuple[str, dict[str, Any]]]:
    def eval_fn(code: str, _locals: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        execution = session.run(code, timeout=timeout)
        parts = [execution.stdout, execution.stderr]
        if execution.text is not None:
            parts.append(execution.text)
        if execution.error is not None:
            parts.append(f"Error: {execution.error.traceback or execution.error}")
        return "".join(part if part.endswith("\n") else part + "\n" for part in parts if part), {}

    return eval_fn


def summary(output: str) -> str:
    """The line worth showing: an error's ``Name: message`` line, else the last line."""
    lines = output.strip().splitlines() or [""]
    errors = [line for line in lines if re.match(r"[A-Za-z_][\w.]*: ", line)]
    return (errors or lines)[-1]


def main() -> None:
    with Session("strict") as session:
        eval_fn = make_eval_fn(session)
        for code in CODE:
            observation, _ = eval_fn(code, {})
            print(f">>> {code.splitlines()[-1]}\n{summary(observation)}")


if __name__ == "__main__":
    main()
