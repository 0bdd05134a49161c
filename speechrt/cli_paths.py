"""The options of the `speechrt` commands that name a file or directory to write, checked before a command runs.

An option declares itself with `type=output_file(...)` or `type=output_dir(...)`; `speechrt.cli.main` checks
every such value (`check_outputs`) after parsing and before the command starts, so a path that cannot be
written is one line and exit code 2, before any model loads (speechrt/outputs.py says what is wrong)."""

from __future__ import annotations

from speechrt.outputs import check_output_dir, check_output_file


class OutputPath(str):
    """A path given to an output option: the string itself, with how to check it."""

    option: str = ""
    kind: str = "file"  # file | dir | empty dir
    example: str = "out"
    make_parents: bool = False  # (a file) the command makes its missing directories

    def check(self) -> None:
        if self == "-" and self.kind == "file":  # stdout
            return
        if self.kind == "file":
            check_output_file(self, self.option, self.example, self.make_parents)
        else:
            check_output_dir(self, self.option, empty=self.kind == "empty dir")


def output_file(option: str, example: str = "out", make_parents: bool = False):
    """An argparse type for an option naming a file to write ('-' = stdout); `example`: a file name the error
    for a directory suggests; `make_parents`: the command makes the file's missing directories."""

    def parse(value: str) -> OutputPath:
        p = OutputPath(value)
        p.option, p.kind, p.example, p.make_parents = option, "file", example, make_parents
        return p

    parse.__name__ = "output file"
    return parse


def output_dir(option: str, empty: bool = False):
    """An argparse type for an option naming a directory to write in (made if missing); `empty`: an existing
    one must be empty."""

    def parse(value: str) -> OutputPath:
        p = OutputPath(value)
        p.option, p.kind = option, "empty dir" if empty else "dir"
        return p

    parse.__name__ = "output directory"
    return parse


def check_outputs(args) -> None:
    """Check every output path among the parsed `args` (a UserError for the first that cannot be written)."""
    for value in vars(args).values():
        if isinstance(value, OutputPath):
            value.check()
