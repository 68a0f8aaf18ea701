"""A Python program that started a vLLM engine ends without triton's nanobind shutdown report on stderr, and
everything else it writes to stderr at exit still shows (hubgym.engines.exit_report)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import atexit, os, sys, types

    def shutdown_report():  # registered first, so it runs last: where the binding's own report comes, after Python's
        os.write(2, b'nanobind: leaked 4 instances!\\n - leaked instance 0x1 of type "x"\\n')
        os.write(2, b'nanobind: leaked 514 functions!\\n - leaked function "create_store"\\n')
        os.write(2, b' - ... skipped remainder\\n')
        os.write(2, b'nanobind: this is likely caused by a reference counting issue in the binding code.\\n')
        os.write(2, b'See https://nanobind.readthedocs.io/en/latest/refleaks.html\\n')
        os.write(2, b'a later exit handler still speaks\\n')

    atexit.register(shutdown_report)
    sys.modules["triton._C.libtriton"] = types.ModuleType("triton._C.libtriton")  # the binding is loaded
    if sys.argv[1] == "quiet":
        from hubgym.engines.exit_report import quiet_exit_report
        quiet_exit_report()
        quiet_exit_report()  # once per process, however often engines start
    print("the program's own output", file=sys.stderr)
''')


def run(mode: str) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_the_binding_report_is_filtered_and_every_other_line_kept():
    loud, quiet = run("loud"), run("quiet")
    assert "nanobind: leaked 4 instances!" in loud and "refleaks" in loud  # what a user saw before
    assert quiet.splitlines() == ["the program's own output", "a later exit handler still speaks"]
