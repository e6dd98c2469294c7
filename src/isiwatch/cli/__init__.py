"""The ``isiwatch`` command line (`isiwatch.cli.commands`), the offline analysis of files it runs, the HTML report and
the demo."""
