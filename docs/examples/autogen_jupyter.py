"""autogen-ext's JupyterCodeExecutor running an agent's code in the strict sandbox.

No glue: the executor starts any installed kernelspec by name. Use it wherever an AutoGen
agent takes a code executor (``CodeExecutorAgent(..., code_executor=executor)``).
"""

from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock
from autogen_ext.code_executors.jupyter import JupyterCodeExecutor


async def run_blocks(*blocks: str) -> list[tuple[int, str]]:
    """Run code blocks one after another in one sandboxed kernel; (exit code, output) each."""
    results = []
    async with JupyterCodeExecutor(kernel_name="wasm-python-strict", timeout=60) as executor:
        for code in blocks:
            result = await executor.execute_code_blocks(
                [CodeBlock(code=code, language="python")], CancellationToken()
            )
            results.append((result.exit_code, result.output))
    return results
