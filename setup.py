"""Build of the flexformer C extension (``flexformer._C``); the metadata is in pyproject.toml.

The build first checks that a C compiler works and names what to install when it does not,
then probes OpenMP by compiling a tiny program: without it the kernels build serially, with
a warning, and ``flexformer.openmp_enabled()`` returns False. Environment switches:

* ``FLEXFORMER_NO_OPENMP=1``  build the serial version even when OpenMP works;
* ``FLEXFORMER_NATIVE=1``     add ``-march=native`` (fast, but not portable);
* ``FLEXFORMER_SANITIZE=1``   build with AddressSanitizer and UBSan (debugging).

A regular (not in-place) build also copies the extension into the source folder
``flexformer/``, so that ``python -m flexformer`` typed in the root of a checkout after
``pip install .`` finds the package there complete, as it finds the installed one elsewhere.
"""
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))

OPENMP_PROBE = r"""
#include <omp.h>
int main(void) { int n = 0;
#pragma omp parallel reduction(+:n)
  n += 1;
  return n > 0 ? 0 : 1; }
"""
PYTHON_PROBE = "#include <Python.h>\nint main(void) { return 0; }\n"
# whether the kernels get their AVX2 and AVX-512 copies: ff_common.h decides (FF_X86_DISPATCH)
ISA_COPIES_PROBE = '#include "ff_common.h"\n#if !FF_X86_DISPATCH\n#error portable copies only\n#endif\nint main(void) { return 0; }\n'

NO_COMPILER = ("flexformer: no working C compiler ({cmd}). flexformer builds its kernels from C: install "
               "a compiler and the Python headers (Debian/Ubuntu: apt-get install gcc python3-dev; "
               "Fedora: dnf install gcc python3-devel; macOS: xcode-select --install; Windows: the "
               "Visual Studio Build Tools), then run pip again.")
NO_PYTHON_HEADERS = ("flexformer: the C compiler works but cannot find Python.h ({include}). Install the "
                     "Python development headers (Debian/Ubuntu: apt-get install python3-dev; Fedora: "
                     "dnf install python3-devel), then run pip again.")
NO_ISA_COPIES = ("flexformer: this C compiler ({cmd}) builds the kernels' portable copies only: their AVX2 and "
                 "AVX-512 copies, chosen at run time, need GCC 11 or later. They are as accurate and run "
                 "about 3x slower on an AVX-512 CPU (flexformer.dense_paths() says 'base'). For the fast "
                 "copies, install gcc >= 11 and reinstall with CC=gcc.")
NO_OPENMP = ("flexformer: the C compiler ({cmd}) has no OpenMP (-fopenmp was refused); building the "
             "serial kernels: every call runs on one thread and flexformer.openmp_enabled() is False. "
             "For threads, install OpenMP (macOS: brew install libomp, or build with gcc) and reinstall.")


def _compiler_accepts(compiler_cmd, flags, source):
    """True when the C compiler builds and links ``source`` with ``flags``."""
    tmp = tempfile.mkdtemp(prefix="flexformer-probe-")
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as fh:
            fh.write(source)
        cmd = list(compiler_cmd) + [src, "-o", os.path.join(tmp, "probe")] + list(flags)
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    except OSError:  # the compiler's program does not exist
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _cores():
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _compile_in_parallel(compiler):
    """Make ``compiler.compile`` compile its sources at the same time, one per core: the two
    dtypes' kernels (kernels_f32.c, kernels_f64.c) take most of the build, about equally."""
    one_by_one = compiler.compile

    def compile(sources, *args, **kwargs):
        jobs = min(len(sources), _cores())
        if jobs < 2:
            return one_by_one(sources, *args, **kwargs)
        with ThreadPoolExecutor(jobs) as pool:  # each job waits on its own compiler process
            objects = pool.map(lambda source: one_by_one([source], *args, **kwargs), sources)
            return [obj for objs in objects for obj in objs]

    compiler.compile = compile


def _say(message):
    """A build message pip shows: stderr, framed so it stands out in a build log."""
    print(f"\n{'=' * 78}\n{message}\n{'=' * 78}\n", file=sys.stderr, flush=True)


class BuildExt(build_ext):
    """Checks the compiler, adds OpenMP (when the compiler has it) and the optional flags
    above, and copies a regular build's extension into the source package."""

    def build_extensions(self):
        unix = self.compiler.compiler_type == "unix"
        compile_args, link_args = [], []
        if unix:
            compiler_cmd = self.compiler.compiler_so[:1]
            if not _compiler_accepts(compiler_cmd, [], "int main(void) { return 0; }\n"):
                raise SystemExit(NO_COMPILER.format(cmd=" ".join(compiler_cmd)))
            include = sysconfig.get_paths()["include"]
            if not _compiler_accepts(compiler_cmd, ["-c", "-I" + include], PYTHON_PROBE):
                raise SystemExit(NO_PYTHON_HEADERS.format(include=include))
            # -std=c99 (unlike GCC's default gnu dialects) stops a*b + c from becoming a fused
            # multiply-add; the AVX2 / AVX-512 copies of the products want them (10-20% on
            # the block products), and they only ever round less
            compile_args += ["-O3", "-std=c99", "-fno-math-errno", "-ffp-contract=fast"]
            # a function the headers did not declare (e.g. a NumPy C-API call outside the
            # targeted version) would otherwise build and fail only at import
            compile_args.append("-Werror=implicit-function-declaration")
            if platform.machine().lower() in ("x86_64", "amd64") and not _compiler_accepts(
                    compiler_cmd, ["-c", "-I" + os.path.join(ROOT, "csrc")], ISA_COPIES_PROBE):
                _say(NO_ISA_COPIES.format(cmd=" ".join(compiler_cmd)))
        want_omp = os.environ.get("FLEXFORMER_NO_OPENMP", "") in ("", "0")
        if want_omp and unix and _compiler_accepts(compiler_cmd, ["-fopenmp"], OPENMP_PROBE):
            compile_args.append("-fopenmp")
            link_args.append("-fopenmp")
        elif want_omp and not unix:
            compile_args.append("/openmp")
        else:
            if want_omp:
                _say(NO_OPENMP.format(cmd=" ".join(compiler_cmd)))
            if unix and _compiler_accepts(compiler_cmd, ["-fopenmp-simd"], "int main(void){return 0;}"):
                compile_args.append("-fopenmp-simd")
        if unix and os.environ.get("FLEXFORMER_NATIVE", "") not in ("", "0"):
            compile_args.append("-march=native")
        if unix and os.environ.get("FLEXFORMER_SANITIZE", "") not in ("", "0"):
            san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]
            compile_args += san + ["-O1"]
            link_args += san
        if unix:
            _compile_in_parallel(self.compiler)
        for ext in self.extensions:
            ext.extra_compile_args = compile_args + list(ext.extra_compile_args or [])
            ext.extra_link_args = link_args + list(ext.extra_link_args or [])
        super().build_extensions()

    def run(self):
        super().run()
        # A build into the project's own build/ folder (pip install ., setup.py build) also
        # places the extension in flexformer/: the source package, which Python imports
        # first when run from the project root, is then as complete as the installed one.
        # A build directed elsewhere (--build-lib outside the project) leaves it alone.
        inside = os.path.abspath(self.build_lib).startswith(os.path.join(ROOT, "build") + os.sep)
        if not self.inplace and inside:
            self.copy_extensions_to_source()


setup(
    ext_modules=[
        Extension(
            "flexformer._C",
            # the two dtypes' kernels first: the longest compiles start first
            sources=["csrc/kernels_f32.c", "csrc/kernels_f64.c", "csrc/module.c", "csrc/kernels.c",
                     "csrc/buffer_cache.c"],
            depends=[os.path.join("csrc", f) for f in os.listdir(os.path.join(ROOT, "csrc"))
                     if f.endswith((".h", ".inc"))],
            include_dirs=[np.get_include(), "csrc"],
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
