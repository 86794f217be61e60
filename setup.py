"""Build of the flexformer C extension.

OpenMP is probed by compiling a tiny program; without it the kernels build serially
(with a warning). Environment switches:

* ``FLEXFORMER_NO_OPENMP=1``  build the serial version even when OpenMP works;
* ``FLEXFORMER_NATIVE=1``     add ``-march=native`` (fast, but not portable);
* ``FLEXFORMER_SANITIZE=1``   build with AddressSanitizer and UBSan (debugging).
"""
import os
import shutil
import subprocess
import tempfile
import warnings

import numpy as np
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PROBE = r"""
#include <omp.h>
int main(void) { int n = 0;
#pragma omp parallel reduction(+:n)
  n += 1;
  return n > 0 ? 0 : 1; }
"""


def _compiler_accepts(compiler_cmd, flags, source=PROBE):
    """True when the C compiler builds and links `source` with `flags`."""
    tmp = tempfile.mkdtemp(prefix="flexformer-probe-")
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as fh:
            fh.write(source)
        cmd = list(compiler_cmd) + [src, "-o", os.path.join(tmp, "probe")] + list(flags)
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    except OSError:
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class BuildExt(build_ext):
    """Adds OpenMP (when the compiler has it) and the optional flags above."""

    def build_extensions(self):
        compiler_cmd = self.compiler.compiler_so[:1] if hasattr(self.compiler, "compiler_so") else ["cc"]
        unix = self.compiler.compiler_type == "unix"
        compile_args, link_args = [], []
        if unix:
            # -std=c99 (unlike GCC's default gnu dialects) stops a*b + c from becoming a fused
            # multiply-add; the AVX2 / AVX-512 copies of the products want them (10-20% on
            # the block products here), and they only ever round less
            compile_args += ["-O3", "-std=c99", "-fno-math-errno", "-ffp-contract=fast"]
        want_omp = os.environ.get("FLEXFORMER_NO_OPENMP", "") in ("", "0")
        if want_omp and unix and _compiler_accepts(compiler_cmd, ["-fopenmp"]):
            compile_args.append("-fopenmp")
            link_args.append("-fopenmp")
        elif want_omp and not unix:
            compile_args.append("/openmp")
        else:
            if want_omp:
                warnings.warn("flexformer: the C compiler has no OpenMP; building the serial kernels")
            if unix and _compiler_accepts(compiler_cmd, ["-fopenmp-simd"], "int main(void){return 0;}"):
                compile_args.append("-fopenmp-simd")
        if unix and os.environ.get("FLEXFORMER_NATIVE", "") not in ("", "0"):
            compile_args.append("-march=native")
        if unix and os.environ.get("FLEXFORMER_SANITIZE", "") not in ("", "0"):
            san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]
            compile_args += san + ["-O1"]
            link_args += san
        for ext in self.extensions:
            ext.extra_compile_args = compile_args + list(ext.extra_compile_args or [])
            ext.extra_link_args = link_args + list(ext.extra_link_args or [])
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "flexformer._C",
            sources=["csrc/kernels.c", "csrc/buffer_cache.c", "csrc/module.c"],
            depends=[os.path.join("csrc", f) for f in os.listdir("csrc") if f.endswith((".h", ".inc"))],
            include_dirs=[np.get_include(), "csrc"],
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
