"""The output guard of the running command: its declared files (cli.file_options) read from the command line.

The guard itself (api.outputs) lives below the command line, where the API's writers use it too.
"""

from __future__ import annotations

from pipeplan.api.outputs import check_declared
from pipeplan.cli.file_options import COMMAND_FILES


def check_files(command: str | None = None) -> None:
    """The one guard for the running command: its declared outputs (cli.file_options) against its declared inputs,
    with the values the command line gave (read from the click context).

    Raises:
        OutputError: as check_outputs.
    """
    from typer._click.globals import get_current_context

    ctx = get_current_context()
    if command is None:
        names, node = [], ctx
        while node.parent is not None:
            names.append(node.info_name or "")
            node = node.parent
        command = " ".join(reversed(names))
    values: dict[str, str | None] = {}
    for param in ctx.command.params:
        key = param.opts[0] if param.param_type_name == "option" else (param.name or "").upper()
        value = ctx.params.get(param.name or "")
        values[key] = value if isinstance(value, str) else None
    check_declared(COMMAND_FILES[command], values)
