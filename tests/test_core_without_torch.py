"""The core (workload, hardware, plan, simulator, CLI parser) must import and run with torch absent."""

import subprocess
import sys
import textwrap


def test_core_imports_and_simulates_without_torch():
    code = textwrap.dedent("""
        import sys
        for name in ("torch", "scipy", "matplotlib", "rich", "numpy"):
            sys.modules[name] = None  # any import of these now raises ImportError
        import slackswap
        from slackswap.cli import build_parser
        from slackswap.workloads.synthetic import chain
        build_parser()
        t = slackswap.simulate(chain(4), "a100-80gb-pcie4")
        assert t.throughput_pct == 100.0
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
