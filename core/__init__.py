"""ragscope engine: examples -> layout -> trace -> features -> verdicts.

No import-time side effects: import the submodules you need
(``core.engine.model``, ``core.engine.layout``, ``core.engine.trace``, ...).
"""

__version__ = "0.1.0"
