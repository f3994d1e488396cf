"""The declared statuses (harness.common.statuses): a status's outcome is one of three, a set of statuses finds
them by name and refuses an undeclared one, only a declared failure status is a failure, and summaries show a
declared status with its icon.  The sets are made here, in the test: the module's own are made at import."""

from __future__ import annotations

import pytest

from harness.common.statuses import COMPARISON, STEP, Status, StatusSet


def probe_statuses() -> StatusSet:
    return StatusSet("probe", [Status("fine", "success", "✅", "the thing checked is good"),
                               Status("broken", "failure", "❌", "the thing checked is bad"),
                               Status("unread", "neutral", "❔", "nothing could be read", unproven=True)])


def test_a_status_is_a_success_a_failure_or_neutral_and_another_outcome_is_refused_naming_it():
    for outcome in ("success", "failure", "neutral"):
        assert Status("s", outcome, "x", "meaning").outcome == outcome
    with pytest.raises(ValueError, match=r"^status odd: outcome 'fatal' is not success, failure or neutral$"):
        Status("odd", "fatal", "x", "meaning")


def test_a_set_finds_its_statuses_by_name_in_declaration_order_and_refuses_an_undeclared_one_naming_its_kind():
    statuses = probe_statuses()
    assert statuses.names == ("fine", "broken", "unread")
    assert "broken" in statuses and "missing" not in statuses
    assert statuses["broken"].failure and statuses.check("fine") == "fine"
    assert statuses.failures == {"broken"} and statuses.successes == {"fine"} and statuses.unproven == {"unread"}
    with pytest.raises(ValueError, match=r"^probe status 'missing' not in \('fine', 'broken', 'unread'\)$"):
        statuses.check("missing")


def test_only_a_declared_failure_status_is_a_failure():
    statuses = probe_statuses()
    assert statuses.is_failure("broken")
    assert not statuses.is_failure("fine") and not statuses.is_failure("unread")
    assert not statuses.is_failure("missing")  # undeclared: no failure, and no KeyError


def test_a_declared_status_is_shown_with_its_icon_and_an_undeclared_one_by_its_bare_name():
    assert STEP.icon("failed") == "❌ failed" and COMPARISON.icon("identical") == "✅ identical"
    assert probe_statuses().icon("unread") == "❔ unread"
    assert STEP.icon("no-such-status") == "no-such-status"
