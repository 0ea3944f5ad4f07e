"""A smolagents executor that runs a CodeAgent's code in the sandbox.

smolagents' remote executors (E2B, Docker, Modal) talk to a Jupyter kernel; this one starts
ours through ``wasm_kernel.client``. Tools are sent as source code, as the remote executors
send them, so only tools whose code runs in the sandbox work there (no network, no host
files). Packages cannot be installed from inside the sandbox: ``additional_imports`` must
name modules the runtime ships.

    agent = CodeAgent(tools=[], model=model, executor=WasmKernelExecutor([], logger))
"""

from typing import Any

from smolagents.local_python_executor import CodeOutput
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.utils import AgentError

from wasm_kernel.client import Session


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
        """Tools name the pip packages they need; nothing can be installed in the sandbox, so
        a tool whose import fails says so when it runs (ModuleNotFoundError, with why)."""
        if additional_imports:
            self.logger.log(f"not installed in the sandbox: {', '.join(additional_imports)}")
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
