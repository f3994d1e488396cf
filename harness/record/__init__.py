"""The run record: the layout of ``results/<run-id>/``, statuses and failure facts (results.py), JUnit XML, machine and GPU facts."""
