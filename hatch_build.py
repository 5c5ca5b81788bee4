"""The optional compiled build: ``KEYTURN_COMPILE=1 pip install .`` compiles the hot path.

Without the variable (the default) the wheel is pure Python and needs no compiler. With it,
the modules of the warm request path are compiled with mypyc (the project is ``mypy
--strict`` clean) and their extension modules go into a platform wheel beside the ``.py``
files, which stay the reference and the fallback: Python imports an extension module
before a source file of the same name. An editable install stays interpreted (it runs the
source tree), and says so.

The hot path's modules whose compiled form would change behaviour stay interpreted:
``_hashing.py`` (its verifier is subclassed and patched), ``_web.py`` (Django's middleware
extends its base class), ``fastapi.py`` and ``_dependency.py`` (FastAPI reads a
dependency's signature, which a compiled function lacks), and everything off the request
path. ``tests/test_compiled.py`` keeps this list and those in step.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SWITCH = "KEYTURN_COMPILE"
# The warm request's path, in import order.
COMPILED = (
    "_token",
    "_target",
    "_decision",
    "authenticator",
    "asgi",
    "wsgi",
)


def wanted() -> bool:
    return os.environ.get(SWITCH, "").strip() not in ("", "0")


class CompileHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def dependencies(self) -> list[str]:
        if not wanted() or self.target_name != "wheel":
            return []
        # mypy reads the imports of the compiled modules: the runtime dependencies too.
        return ["mypy>=1.10", "setuptools>=65", *self.metadata.core.dependencies]

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if not wanted() or self.target_name != "wheel":
            return
        if version == "editable":
            self.app.display_warning(
                f"{SWITCH}: an editable install runs the source tree; it stays interpreted"
            )
            return
        out = Path(self.directory) / "compiled"
        for built in self._compile(out):
            relative = built.relative_to(out).as_posix()
            build_data["force_include"][str(built)] = relative
        build_data["pure_python"] = False
        build_data["infer_tag"] = True

    def _compile(self, out: Path) -> list[Path]:
        from mypyc.build import mypycify
        from setuptools import Distribution
        from setuptools.command.build_ext import build_ext

        source = Path(self.root) / "src"
        paths = [f"keyturn/{name}.py" for name in COMPILED]
        here = os.getcwd()
        with tempfile.TemporaryDirectory(prefix="keyturn-mypyc-") as scratch:
            os.chdir(source)  # mypy names the modules from the paths: keyturn.<name>
            try:
                extensions = mypycify(
                    ["--config-file", str(Path(self.root) / "pyproject.toml"), *paths],
                    opt_level="3",
                    target_dir=str(Path(scratch) / "c"),
                )
                command = build_ext(Distribution({"name": "keyturn", "ext_modules": extensions}))
                command.build_lib = str(out)
                command.build_temp = str(Path(scratch) / "temp")
                command.ensure_finalized()
                command.run()
            finally:
                os.chdir(here)
        built = sorted(out.rglob("*.so")) + sorted(out.rglob("*.pyd"))
        if len(built) < len(COMPILED):
            raise RuntimeError(f"{SWITCH}: mypyc built {len(built)} modules, expected more")
        print(f"{SWITCH}: compiled {', '.join(COMPILED)}", file=sys.stderr)
        return built
