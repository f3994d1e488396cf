"""The run record: the layout of ``results/<run-id>/``, statuses (statuses.py), records and failure facts (records.py), JUnit XML, machine and GPU facts."""
