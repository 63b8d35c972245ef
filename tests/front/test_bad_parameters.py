"""Query parameters a page does not take, gives twice or cannot honour are refused naming them
(``lib.query``), never dropped: the dashboard's and an agent page's ``part``, the bulk approval's
query, and the helper's own rules."""

from __future__ import annotations

from html import unescape

import pytest
from django.http import QueryDict

from agents.choices import AgentState
from lib.query import BadParameter, check_parameters, choice, whole_number
from tests.support.scalers import make_agent, make_scaler

pytestmark = pytest.mark.django_db


def refusal(response) -> str:
    assert response.status_code == 400
    return unescape(response.content.decode())


def test_the_dashboard_refuses_an_unknown_part_or_parameter(viewer_client):
    assert 'part: must be one of agents, events, got "bogus"' in refusal(viewer_client.get("/?part=bogus"))
    assert "tab: unknown parameter (accepted: part)" in refusal(viewer_client.get("/?tab=agents"))
    assert 'part: takes one value, got 2: "agents", "events"' in refusal(viewer_client.get("/?part=agents&part=events"))
    assert viewer_client.get("/?part=events").status_code == 200


def test_an_agent_page_refuses_an_unknown_part_or_parameter(viewer_client):
    agent = make_agent(make_scaler("bp"), state=AgentState.RUNNING)
    page = f"/agents/{agent.agent_id}/"
    assert 'part: must be one of events, got "rows"' in refusal(viewer_client.get(f"{page}?part=rows"))
    assert "page: unknown parameter (accepted: part)" in refusal(viewer_client.get(f"{page}?page=2"))
    assert viewer_client.get(f"{page}?part=events").status_code == 200


def test_the_bulk_approval_step_refuses_a_parameter_besides_op(approver_client):
    assert "status: unknown parameter (accepted: op)" in refusal(approver_client.get("/operations/approve/?status=x"))


def test_whole_number_names_its_range_and_the_value():
    assert whole_number("n", None, 1, 9, default=4) == 4
    assert whole_number("n", "9", 1, 9) == 9
    with pytest.raises(BadParameter, match=r"^n: is required \(a whole number within 1\.\.9\)$"):
        whole_number("n", "", 1, 9)
    with pytest.raises(BadParameter, match=r"^n: must be a whole number within 1\.\.9 \(why\), got 10$") as caught:
        whole_number("n", "10", 1, 9, hint=" (why)")
    assert caught.value.field == "n"
    with pytest.raises(BadParameter, match=r"^n: must be a whole number within 1\.\.9, got 0$"):
        whole_number("n", "0", 1, 9, hint=" (why)")  # the hint is for a value past the range
    with pytest.raises(BadParameter, match=r'got "1\.5"$'):
        whole_number("n", "1.5", 1, 9)
    # What int() would also read: another script's digits, spaces, digit separators, a plus sign.
    for raw in ("\uff12", " 2", "2 ", "2_0", "+2", "\u0662"):
        with pytest.raises(BadParameter, match="must be a whole number within 1..99"):
            whole_number("n", raw, 1, 99)
    assert whole_number("n", "-0", -5, 5) == 0


def test_check_parameters_refuses_unknown_and_repeated_names_and_takes_several_where_allowed():
    check_parameters(QueryDict("a=1&b=2&b=3"), single=("a",), several=("b",))
    with pytest.raises(BadParameter, match=r"^c: unknown parameter \(accepted: a, b\)$"):
        check_parameters(QueryDict("c=1"), single=("a",), several=("b",))
    with pytest.raises(BadParameter, match=r"^x: unknown parameter \(accepted: no parameters\)$"):
        check_parameters(QueryDict("x="))
    with pytest.raises(BadParameter, match=r'^a: takes one value, got 2: "1", "2"$'):
        check_parameters(QueryDict("a=1&a=2"), single=("a",))
    with pytest.raises(BadParameter, match=r"^" + "y" * 100 + "…: unknown parameter"):
        check_parameters(QueryDict("y" * 300 + "=1"))


def test_choice_lists_the_choices():
    assert choice("k", "", ("a", "b")) == "" and choice("k", "b", ("a", "b")) == "b"
    with pytest.raises(BadParameter, match=r'^k: must be one of a, b, got "c"$'):
        choice("k", "c", ("a", "b"))
