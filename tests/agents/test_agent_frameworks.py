"""The agent-framework examples in docs/examples, run against real sandboxed kernels.

Each framework is driven as an agent would drive it, with a scripted model standing in for
the LLM where the framework needs one. A framework that is not installed skips its test
(``pip install '.[frameworks]'`` installs them all).
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.slow  # each test takes seconds to minutes

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_autogen_jupyter_code_executor_runs_in_the_strict_sandbox() -> None:
    pytest.importorskip("autogen_ext.code_executors.jupyter")
    run_blocks = example("autogen_jupyter").run_blocks
    results = asyncio.run(
        run_blocks(
            "x = 6\nprint(x * 7)",
            "print(x + 1)",  # state carries over between blocks
            "print(open('/etc/passwd').read())",
            "import urllib.request\nurllib.request.urlopen('http://example.org')",
        )
    )
    (first_code, first), (second_code, second), (passwd_code, passwd), (net_code, net) = results
    assert (first_code, first.strip()) == (0, "42")
    assert (second_code, second.strip()) == (0, "7")
    assert passwd_code == 1 and "FileNotFoundError" in passwd and "root:" not in passwd
    assert net_code == 1 and "NetworkUnavailable" in net


def test_smolagents_executor_runs_tools_and_returns_the_final_answer() -> None:
    pytest.importorskip("smolagents")
    from smolagents.default_tools import FinalAnswerTool
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.utils import AgentError

    executor_class = example("smolagents_executor").WasmKernelExecutor
    executor = executor_class(["math"], AgentLogger(LogLevel.OFF), interrupt_grace=0.5)
    try:
        executor.send_tools({"final_answer": FinalAnswerTool()})
        executor.send_variables({"question": "six times seven"})
        step = executor("import math\nprint(question)\nanswer = math.prod([6, 7])")
        assert (step.logs, step.is_final_answer) == ("six times seven\n", False)
        final = executor("final_answer(answer)")
        assert final.is_final_answer and final.output == 42
        with pytest.raises(AgentError, match="ZeroDivisionError"):
            executor("1 / 0")
        with pytest.raises(AgentError, match="FileNotFoundError"):
            executor("open('/etc/passwd').read()")
    finally:
        executor.cleanup()


def test_smolagents_code_agent_with_the_sandbox_executor() -> None:
    pytest.importorskip("smolagents")
    from smolagents import CodeAgent
    from smolagents.models import ChatMessage, MessageRole, Model
    from smolagents.monitoring import AgentLogger, LogLevel

    class ScriptedModel(Model):
        """Stands in for the LLM: first computes in the sandbox, then answers."""

        def __init__(self) -> None:
            super().__init__()
            self.steps = [
                "Thought: compute it.\n<code>\nvalue = sum(range(10))\nprint(value)\n</code>",
                "Thought: done.\n<code>\nfinal_answer(value * 2)\n</code>",
            ]

        def generate(self, messages, stop_sequences=None, **kwargs):  # type: ignore[no-untyped-def]
            return ChatMessage(role=MessageRole.ASSISTANT, content=self.steps.pop(0))

    executor_class = example("smolagents_executor").WasmKernelExecutor
    executor = executor_class([], AgentLogger(LogLevel.OFF))
    try:
        agent = CodeAgent(
            tools=[], model=ScriptedModel(), executor=executor, verbosity_level=LogLevel.OFF
        )
        assert agent.run("What is twice the sum of 0..9?") == 90
    finally:
        executor.cleanup()


def test_langgraph_codeact_eval_fn_runs_the_model_s_code_in_the_sandbox() -> None:
    pytest.importorskip("langgraph_codeact")
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langgraph_codeact import create_codeact

    from wasm_kernel.client import Session

    make_eval_fn = example("langgraph_codeact_sandbox").make_eval_fn
    model = FakeListChatModel(
        responses=[
            (
                "Let me compute.\n```python\nimport statistics\nm = statistics.mean([2, 4, 9])\n"
                "print(m)\n```"
            ),
            "```python\nprint(open('/etc/hostname').read())\n```",
            "The mean is 5.",
        ]
    )
    with Session("strict") as session:
        graph = create_codeact(model, [], make_eval_fn(session)).compile()
        state = graph.invoke({"messages": [{"role": "user", "content": "mean of 2, 4, 9?"}]})
        observations = [m.content for m in state["messages"] if m.type == "human"][1:]
        assert observations[0] == "5\n"
        assert "FileNotFoundError" in observations[1]
        assert state["messages"][-1].content == "The mean is 5."
        assert session.run("m").text == "5"  # the variables live in the kernel


@pytest.mark.parametrize(
    "name, framework, shown",
    [
        (
            "autogen_jupyter",
            "autogen_ext.code_executors.jupyter",
            [
                "exit code 0: 42",
                "exit code 0: 7",
                "FileNotFoundError",
                "no network in this sandbox",
            ],
        ),
        ("smolagents_executor", "smolagents", ["logs: 'sum: 45'", "final answer: 90"]),
        ("langgraph_codeact_sandbox", "langgraph_codeact", ["mean: 5", "10", "FileNotFoundError"]),
    ],
)
def test_each_example_runs_as_a_script(name: str, framework: str, shown: list[str]) -> None:
    """`python docs/examples/NAME.py` shows the sandbox at work, with fixed code in place of
    a model's: nothing else, and no network, is needed."""
    if importlib.util.find_spec(framework.split(".")[0]) is None:
        pytest.skip(f"{framework} is not installed (pip install '.[frameworks]')")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for text in shown:
        assert text in done.stdout, done.stdout
    assert "not in the sandbox" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("name", "framework"),
    [("autogen_jupyter", "autogen_core"), ("smolagents_executor", "smolagents")],
)
def test_an_example_without_its_framework_names_the_extra(name: str, framework: str) -> None:
    """Run where the framework is missing (here: made unimportable), the example says which
    extra brings it and how, instead of a ModuleNotFoundError traceback."""
    code = (
        f"import runpy, sys; sys.modules[{framework!r}] = None\n"
        f"runpy.run_path({str(EXAMPLES / f'{name}.py')!r}, run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert f"({framework}" in done.stderr and "is missing)" in done.stderr
    assert "frameworks extra installs: " in done.stderr and "[frameworks]" in done.stderr


def test_smolagents_executor_names_only_the_packages_the_sandbox_lacks() -> None:
    """A tool's requirements that the runtime ships (numpy) are not reported missing."""
    pytest.importorskip("smolagents")

    class Lines:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def log(self, *parts: object, **_: object) -> None:
            self.lines.append(" ".join(map(str, parts)))

    logger = Lines()
    executor = example("smolagents_executor").WasmKernelExecutor([], logger)
    try:
        assert executor.install_packages(["numpy", "wkm-absent"]) == ["numpy", "wkm-absent"]
    finally:
        executor.cleanup()
    reported = [line for line in logger.lines if "not in the sandbox" in line]
    assert len(reported) == 1 and "wkm-absent" in reported[0] and "numpy" not in reported[0]
