"""The ``ragscope`` command line.

The CLI is a package with one module per command group: ``model`` (``info``,
``prepare``, ``serve-llm``, ``bench``), ``datasets`` (``datasets
validate|import|list``), ``generation`` (``generate``, ``answer``), ``analysis``
(``trace``, ``spad-check``, ``shap``), ``training`` (``evaluate``, ``train``),
``artifacts`` (``token-thresholds``, ``artifacts verify|seal``), ``mitigation``
(``mitigate``, ``aarf``) and ``sae`` (``sae train|eval``). Each group module pairs
``add_parser(sub, command)``, which registers one of its ``COMMANDS`` on the argparse
subparsers, with the ``cmd_*`` functions that run them; the groups share only
``common`` (argument helpers, model loading, example picking, dataset splits, output)
and never import each other. ``dispatch`` builds the top-level parser, registering the
commands in the order ``ragscope --help`` lists them, and runs the chosen one: errors
ragscope raises on purpose print one line naming the fix and exit with status 2. Each
command has ``--help``.
"""

from core.cli.dispatch import build_parser, main

__all__ = ["build_parser", "main"]
