"""The megatron.core modules a GPT training step can import, found statically from the bench's imports.

    python benchmarks/_mcore_closure.py SITE   # prints the .py files (relative to SITE) to keep

Follows every ``import megatron.core.X`` / ``from megatron.core.X import Y`` (inside ``try`` blocks and
functions too, so it keeps more than Python would load), each package's ``__init__.py``, and ``from . import``.
"""

import re
import sys
from pathlib import Path

ROOTS = ["megatron.core", "megatron.core.models.gpt", "megatron.core.models.gpt.gpt_layer_specs",
         "megatron.core.transformer.transformer_config", "megatron.core.quantization.quant_config",
         "megatron.core.distributed", "megatron.core.optimizer", "megatron.core.parallel_state",
         "megatron.core.tensor_parallel", "megatron.core.package_info", "megatron.core.extensions.transformer_engine"]
_IMPORT = re.compile(r"^\s*(?:from\s+(\.*[\w.]*)\s+import\s+([\w, ()*]+)|import\s+([\w.]+))", re.M)


def module_file(site: Path, name: str) -> Path | None:
    base = site / name.replace(".", "/")
    return next((p for p in (base / "__init__.py", base.with_suffix(".py")) if p.exists()), None)


def closure(site: Path) -> set[Path]:
    todo, seen = list(ROOTS), set()
    while todo:
        name = todo.pop()
        path = module_file(site, name)
        if path is None or path in seen:
            continue
        seen.add(path)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages
        package = parts if path.name == "__init__.py" else parts[:-1]
        for frm, names, plain in _IMPORT.findall(path.read_text()):
            target = plain or frm
            if frm.startswith("."):
                dots = len(frm) - len(frm.lstrip("."))
                target = ".".join(package[: len(package) - dots + 1] + ([frm.lstrip(".")] if frm.lstrip(".") else []))
            if not target.startswith("megatron"):
                continue
            todo.append(target)
            if frm:
                todo += [f"{target}.{n.strip()}" for n in names.replace("(", "").replace(")", "").split(",")
                         if n.strip() and n.strip() != "*"]
    return seen


if __name__ == "__main__":
    site = Path(sys.argv[1])
    for p in sorted(closure(site)):
        print(p.relative_to(site))
