"""Small utilities every layer may use: YAML and JSON loading (:mod:`.yaml_io`, :mod:`.json_io`), checks of
names and numbers (:mod:`.names`, :mod:`.numbers`), process helpers (:mod:`.processes`), retries
(:mod:`.retry`), CPU threads, pinned memory, logging, tracing, writable paths, lazy re-exports (:mod:`.lazy`).

Public names are re-exported here and imported on first use.
"""

from __future__ import annotations

from precsearch.utils.lazy import lazy_exports

__all__ = ["check_plain_data", "check_writable", "choose_threads", "die_with_parent", "dump_stacks_on_signal",
           "dying_with_parent", "exit_after", "lazy_exports", "load_yaml", "logger", "MAX_COUNT", "MAX_LAYERS",
           "MAX_SECONDS", "MAX_SEED", "name_problem", "number_problem", "PinnedBlock", "read_json_object",
           "REFUSED", "stop_group", "THREADS_ENV", "user_error", "with_retry"]

_WHERE = {
    "choose_threads": "cpu_threads", "THREADS_ENV": "cpu_threads",
    "read_json_object": "json_io",
    "lazy_exports": "lazy",
    "logger": "log",
    "name_problem": "names", "REFUSED": "names",
    "MAX_COUNT": "numbers", "MAX_LAYERS": "numbers", "MAX_SECONDS": "numbers", "MAX_SEED": "numbers",
    "number_problem": "numbers",
    "PinnedBlock": "pinned",
    "die_with_parent": "processes", "dump_stacks_on_signal": "processes", "dying_with_parent": "processes",
    "exit_after": "processes", "stop_group": "processes",
    "with_retry": "retry",
    "user_error": "validation",
    "check_writable": "writable",
    "check_plain_data": "yaml_io", "load_yaml": "yaml_io",
}
"""Public name -> the module that defines it, imported on first use (:func:`~precsearch.utils.lazy.lazy_exports`)."""

__getattr__ = lazy_exports(__name__, _WHERE)
