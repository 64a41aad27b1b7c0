"""Build the Cython kernels; all metadata lives in pyproject.toml.

The .pyx sources are cythonized at build time (generated C is never committed).
Set DQCEP_DEBUG_CYTHON=1 to build with bounds and wraparound checks on (and debug info).
Set DQCEP_REUSE_INPLACE_KERNELS=1 to put in a wheel the kernels an in-place build
(`pip install -e .`) left in dqcep/_kernels/, where they are newer than every kernel source,
instead of compiling them again: the tests build a wheel of the checkout they run from,
whose kernels the editable install compiled from the same sources minutes before.
"""
import os
import shutil
import sysconfig
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

DEBUG = os.environ.get("DQCEP_DEBUG_CYTHON", "") not in ("", "0")

DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
}

# module -> its source: the library's kernels by role (the event store and queues,
# predicates, leaves, joins, guards, Kleene lists, runs, chains; payload codecs, the
# journal's records (framed from MQTT packets, scanned for the consumers); matches'
# formatting and arrivals; the SASE baseline's automata), and the generator's walk
# kernel beside the generator
KERNELS = {f"dqcep._kernels.{name}": f"dqcep/_kernels/{name}.pyx" for name in [
    "ring", "store", "predicates", "leaves", "joins", "guards", "lists", "runs", "chains",
    "msgpack_encode", "msgpack_decode", "map_decode", "journal_records", "recent_ids",
    "timelines",
    "match_format", "arrivals", "sase"]}
KERNELS["dqcep.generator._walk"] = "generator/_walk.pyx"

extensions = [
    Extension(
        name,
        [source],
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        # No debug info (Python's CFLAGS have -g) unless DQCEP_DEBUG_CYTHON: a quarter of
        # the compile time and 7x smaller objects (operators, before it was split by
        # role: 18.4 s, 6.6 MB -> 13.4 s, 0.9 MB); every install and the tests' wheel
        # build compile all kernels.
        extra_compile_args=[] if DEBUG else ["-g0"],
    )
    for name, source in KERNELS.items()
]

KERNEL_DIR = Path("dqcep/_kernels")


def inplace_kernel(source: str) -> Path | None:
    """The in-place build of the kernel built from ``source`` if it is newer than every
    kernel source and this file (a .pxd change can change any kernel), else None."""
    built = Path(source).with_suffix(sysconfig.get_config_var("EXT_SUFFIX"))
    if not built.exists():
        return None
    sources = [*KERNEL_DIR.glob("*.pyx"), *KERNEL_DIR.glob("*.pxd"), Path(__file__),
               *map(Path, KERNELS.values())]
    return built if built.stat().st_mtime >= max(p.stat().st_mtime for p in sources) else None


REUSED = {}
if os.environ.get("DQCEP_REUSE_INPLACE_KERNELS", "") not in ("", "0"):
    REUSED = {name: path for name, source in KERNELS.items()
              if (path := inplace_kernel(source)) is not None}


class BuildKernels(build_ext):
    """Compiles each kernel, or with DQCEP_REUSE_INPLACE_KERNELS copies its fresh in-place
    build into the build directory."""

    def run(self):
        """Also drops, from the build directory, what a kernel that is no longer built
        (a renamed or split one) left there from an earlier build, its compiled module,
        stub and declarations: a wheel takes every file there."""
        if not self.inplace:
            suffix = sysconfig.get_config_var("EXT_SUFFIX")
            folders = {Path(self.build_lib, *name.split(".")[:-1]): Path(source).parent
                       for name, source in KERNELS.items()}
            for folder, source_folder in folders.items():
                package = ".".join(folder.relative_to(self.build_lib).parts)
                for built in folder.glob(f"*{suffix}"):
                    if f"{package}.{built.name[:-len(suffix)]}" not in KERNELS:
                        built.unlink()
                for built in [*folder.glob("*.pyi"), *folder.glob("*.pxd")]:
                    if not (source_folder / built.name).exists():
                        built.unlink()
        super().run()

    def build_extension(self, ext):
        if ext.name in REUSED and not self.inplace:
            target = Path(self.get_ext_fullpath(ext.name))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REUSED[ext.name], target)
            return
        super().build_extension(ext)


# The kernels compile in parallel, one per core: the install (and the tests' wheel
# build) took ~80 s on 2 cores one after the other. Cythonizing a reused kernel would
# only rewrite its C (the isolated build's numpy headers are newer than any C file).
to_compile = [ext for ext in extensions if ext.name not in REUSED]
setup(ext_modules=(cythonize(to_compile, compiler_directives=DIRECTIVES,
                             nthreads=os.cpu_count() or 1) if to_compile else [])
      + [ext for ext in extensions if ext.name in REUSED],
      cmdclass={"build_ext": BuildKernels},
      options={"build_ext": {"parallel": os.cpu_count() or 1}})
