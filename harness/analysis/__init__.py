"""Tools that read run records: failure signatures, the HTML report, run diffing (triage) and bisect."""
