"""autogen-ext's JupyterCodeExecutor running an agent's code in the strict sandbox.

No glue: the executor starts any installed kernelspec by name. Use it wherever an AutoGen
agent takes a code executor (``CodeExecutorAgent(..., code_executor=executor)``).

``python docs/examples/autogen_jupyter.py`` runs, without a model, the code blocks an agent
might have written (state carrying over, a host file and the network out of reach) and prints
each block's exit code and output. It needs autogen-ext, which wasm-kernel's ``frameworks``
extra installs (``pip install '.[frameworks]'`` in a clone), and ``python -m wasm_kernel
install`` first.
"""

import asyncio
import re

from wasm_kernel.install_hints import pip_install

try:
    from autogen_core import CancellationToken
    from autogen_core.code_executor import CodeBlock
    from autogen_ext.code_executors.jupyter import JupyterCodeExecutor
except ModuleNotFoundError as missing:
    raise SystemExit(
        f"this example needs autogen-ext ({missing.name} is missing), which the frameworks"
        f" extra installs: {pip_install('[frameworks]')}"
    ) from None

BLOCKS = (  # what a model's code blocks could be; here fixed, so no model is needed
    "x = 6\nprint(x * 7)",
    "print(x + 1)",
    "print(open('/etc/passwd').read())",
    "import urllib.request\nurllib.request.urlopen('http://example.org')",
)


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


def summary(output: str) -> str:
    """The line worth showing: an error's ``Name: message`` line, else the last line."""
    lines = output.strip().splitlines() or [""]
    errors = [line for line in lines if re.match(r"[A-Za-z_][\w.]*: ", line)]
    return (errors or lines)[-1]


def main() -> None:
    for code, (exit_code, output) in zip(BLOCKS, asyncio.run(run_blocks(*BLOCKS)), strict=True):
        print(f">>> {code.splitlines()[-1]}\nexit code {exit_code}: {summary(output)}")


if __name__ == "__main__":
    main()
