"""The argument parser every `railmq` command is built with.

Three rules for every command, set here once so no command can forget them:

- no abbreviations (`allow_abbrev=False`): `--partition` never silently means `--partitions`;
- every flag's help ends with its default, unless the help already names one;
- every leaf parser records itself as `args.parser`, so an error found after parsing (or a word
  left over) is reported with that command's usage, not the top level's.

Sub-commands inherit the class (argparse builds sub-parsers with the parent's class).
"""

from __future__ import annotations

import argparse
from typing import Any


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends `(default: X)` to a flag's help when it has a default and the text has none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or text == argparse.SUPPRESS:
            return text
        default = action.default
        if default in (None, False, argparse.SUPPRESS) or default == [] or "default" in text.lower():
            return text
        return f"{text} (default: %(default)s)"


class RailmqParser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)
        self.set_defaults(parser=self)
