"""Render a ModuleModel with jinja2 (StrictUndefined, no logic beyond loops): byte-stable Triton source."""

from __future__ import annotations

from functools import cache

import jinja2

from tilec._version import __version__
from tilec.codegen.emit import ModuleModel


@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("tilec.codegen", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render(m: ModuleModel) -> str:
    return _env().get_template("module.py.j2").render(m=m, version=__version__)
