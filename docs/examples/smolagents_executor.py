"""A smolagents executor that runs a CodeAgent's code in the sandbox.

smolagents' remote executors (E2B, Docker, Modal) talk to a Jupyter kernel; this one starts
ours through ``wasm_kernel.client``. Tools are sent as source code, as the remote executors
send them, so only tools whose code runs in the sandbox work there (no network, no host
files). The strict profile installs nothing: a tool's requirements must be modules the
runtime ships (numpy, pandas, matplotlib and the standard library among them).

    from smolagents import CodeAgent
    from smolagents.monitoring import AgentLogger, LogLevel

    executor = WasmKernelExecutor([], AgentLogger(LogLevel.INFO))
    agent = CodeAgent(tools=[], model=model, executor=executor)

``python docs/examples/smolagents_executor.py`` runs, without a model, the steps a
CodeAgent would send (a computation, then ``final_answer``) and prints the logs and the
answer. It needs smolagents, which wasm-kernel's ``frameworks`` extra installs (``pip install
'.[frameworks]'`` in a clone), and ``python -m wasm_kernel install`` first.
"""

import ast
from typing import Any

from wasm_kernel.client import Session
from wasm_kernel.install_hints import pip_install

try:
    from smolagents.local_python_executor import CodeOutput
    from smolagents.remote_executors import RemotePythonExecutor
    from smolagents.utils import AgentError
except ModuleNotFoundError as missing:
    raise SystemExit(
        f"this example needs smolagents ({missing.name} is missing), which the frameworks"
        f" extra installs: {pip_install('[frameworks]')}"
    ) from None

STEPS = (  # what a model's code could be; here fixed, so no model is needed
    "import numpy as np\nvalues = np.arange(10)\nprint('sum:', values.sum())",
    "final_answer(int(values.sum()) * 2)",
)


class WasmKernelExecutor(RemotePythonExecutor):
    def __init__(
        self,
        additional_imports: list[str],
        logger: Any,
        profile: str = "strict",
        timeout: float | None = None,
        **settings: Any,
    ):
        super().__init__(additional_imports, logger)
        self.timeout = timeout
        self.session = Session(profile, **settings)
        self.session.start()
        for module in additional_imports:  # fails now, clearly, if the runtime lacks one
            self.run_code_raise_errors(f"import {module}")

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """Tools name the pip packages they need; the strict sandbox installs nothing, so
        say which of them it lacks (a tool that imports one fails when it runs)."""
        modules = {
            name: "PIL" if name == "pillow" else name.replace("-", "_")
            for name in additional_imports
        }
        found = self.session.run(
            "import importlib.util\n"
            f"[name for name, module in {modules!r}.items()"
            " if importlib.util.find_spec(module) is None]"
        )
        missing = ast.literal_eval(found.text) if found.text else []
        if missing:
            self.logger.log(f"not in the sandbox, and not installable there: {', '.join(missing)}")
        return list(additional_imports)

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        execution = self.session.run(code, timeout=self.timeout)
        logs = execution.stdout + execution.stderr
        error = execution.error
        if error is not None and error.name == self.FINAL_ANSWER_EXCEPTION:
            answer = self._deserialize_final_answer(error.value, self.allow_pickle)
            return CodeOutput(output=answer, logs=logs, is_final_answer=True)
        if error is not None:
            raise AgentError(error.traceback or str(error), self.logger)
        return CodeOutput(output=execution.text, logs=logs, is_final_answer=False)

    def cleanup(self) -> None:
        self.session.close()


def main() -> None:
    from smolagents.default_tools import FinalAnswerTool
    from smolagents.monitoring import AgentLogger, LogLevel

    executor = WasmKernelExecutor([], AgentLogger(LogLevel.INFO))
    try:
        executor.send_tools({"final_answer": FinalAnswerTool()})
        for code in STEPS:
            step = executor(code)
            print(f">>> {code.splitlines()[-1]}\nlogs: {step.logs.strip()!r}")
            if step.is_final_answer:
                print(f"final answer: {step.output}")
    finally:
        executor.cleanup()


if __name__ == "__main__":
    main()
