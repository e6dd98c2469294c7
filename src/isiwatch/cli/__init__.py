"""The ``isiwatch`` command line (:mod:`.commands`), the offline analysis of files it runs, the HTML report and the
demo."""
