"""The ``isiwatch`` command line (`isiwatch.cli.commands`; ``isiwatch truncate`` in `isiwatch.cli.truncate`), the
offline analysis of files it runs, the HTML report and the demo."""
