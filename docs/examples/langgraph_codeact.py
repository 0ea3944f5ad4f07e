"""An ``eval_fn`` for LangGraph CodeAct (langgraph-codeact) that runs the model's code in
the sandbox.

CodeAct hands ``eval_fn`` the code and a dict of variables and tools, and keeps the
variables it returns for the next call. Here the kernel keeps them itself (names persist
between cells), so nothing is returned; tools passed as Python functions cannot cross into
the sandbox, so give CodeAct none and let the code use what the sandbox has.

    session = Session("strict"); session.start()
    graph = create_codeact(model, [], make_eval_fn(session)).compile()
"""

from collections.abc import Callable
from typing import Any

from wasm_kernel.client import Session


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
