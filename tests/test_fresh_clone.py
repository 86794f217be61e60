"""A source tree without its built extension says what to run, in one sentence; the
README's two commands are what CI runs (.ci/run reads them from the README)."""
import os
import re
import shutil
import subprocess
import sys

import flexformer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def test_unbuilt_source_tree_names_the_command(tmp_path):
    src = os.path.dirname(os.path.abspath(flexformer.__file__))
    dest = tmp_path / "checkout" / "flexformer"
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("_C*", "__pycache__"))
    # the copy itself is imported: an editable install's finder, which would come first, is dropped
    load = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
            "if not getattr(f, '__module__', '').startswith('__editable__')]; import flexformer")
    proc = subprocess.run([sys.executable, "-c", load], cwd=dest.parent, capture_output=True, text=True)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: flexformer's C extension is not built")
    assert f"pip install {tmp_path / 'checkout'}" in last
    assert "circular" not in proc.stderr


def test_readme_try_it_holds_the_two_commands_ci_runs():
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("\n## Try it", 1)[1].split("\n## ", 1)[0]
    blocks = [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, re.S)][:2]
    assert blocks == ['pip install . && python -m flexformer train', 'pip install -e ".[test]" && python -m pytest']
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "## Try it" in ci and 'bash -c "${readme_cmds[0]}"' in ci and 'bash -c "${readme_cmds[1]}"' in ci
