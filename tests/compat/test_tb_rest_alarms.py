"""Compatibility test: tb-rest-client's alarm and alarm-comment calls against GridLinks,
with the client unchanged (see test_tb_rest_client.py for how to run): ThingsBoard's own
REST client creates a device profile with an alarm rule, and the alarm the device's
telemetry raises appears, is acknowledged and clears as ThingsBoard would.

The alarm rule is ThingsBoard's `profileData.alarms` (its `DeviceProfileAlarm`, what its
UI and tb-rest-client up to 4.2 write). tb-rest-client 4.4, pinned here, no longer models
it: ThingsBoard 4.3 moved alarm rules to calculated fields (`/api/alarm/rule`,
`AlarmRuleDefinition`), so 4.4's `DeviceProfileData` has no `alarms` and its `AlarmRule` /
`AlarmCondition` are the calculated-field ones. The profile is therefore saved with the
client's own `save_device_profile`, its `profileData` a dict: the filters in it are 4.4's
`KeyFilter`/`EntityKey`/`NumericFilterPredicate`, which serialize to exactly the JSON of
4.2's `AlarmConditionFilter`/`AlarmConditionFilterKey`/`NumericFilterPredicate`; only the
envelope (`DeviceProfileAlarm`, the rule's `condition` and `spec`) is written as JSON.

Each test starts from the same server; names are unique per test."""

import json
import uuid

import pytest
import requests

from gridlinks_server import WAIT_S, gridlinks_server, wait_until

from tb_rest_client.rest_client import RestClient as TbRestClient
from tb_rest_client.models import (
    Alarm,
    AlarmComment,
    AlarmCountQuery,
    AlarmDataPageLink,
    AlarmDataQuery,
    DeviceTypeFilter,
    EntityDataSortOrder,
    DefaultDeviceProfileConfiguration,
    DefaultDeviceProfileTransportConfiguration,
    Device,
    DeviceProfile,
    DisabledDeviceProfileProvisionConfiguration,
    EntityKey,
    FilterPredicateValueDouble,
    FilterPredicateValueString,
    KeyFilter,
    NumericFilterPredicate,
    StringFilterPredicate,
)
from tb_rest_client.rest import ApiException

ADMIN_PASSWORD = "compat-pw-" + uuid.uuid4().hex[:8]
RAISE_S = 20  # the bound of a wait for the rule engine to raise or clear an alarm


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with gridlinks_server(tmp_path_factory.mktemp("alarms"), ADMIN_PASSWORD) as s:
        yield s["base"]


@pytest.fixture(scope="module")
def client(server):
    c = TbRestClient(base_url=server)
    c.login(username="admin", password=ADMIN_PASSWORD)
    yield c
    c.stop()


def _body(exc):
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    return body or ""


def numeric_filter(key, operation, threshold):
    """A filter on a time series key (4.2's `AlarmConditionFilter`, same JSON)."""
    return KeyFilter(key=EntityKey(type="TIME_SERIES", key=key), value_type="NUMERIC",
                     predicate=NumericFilterPredicate(type="NUMERIC", operation=operation,
                                                      value=FilterPredicateValueDouble(default_value=threshold)))


def alarm_rule(filters, details=None):
    """4.2's `AlarmRule` with a `SIMPLE` spec, as its client serializes it (no nulls)."""
    rule = {"condition": {"condition": filters, "spec": {"type": "SIMPLE"}}}
    if details is not None:
        rule["alarmDetails"] = details
    return rule


def profile_alarm(alarm_type, create_rules, clear_rule):
    """4.2's `DeviceProfileAlarm`."""
    alarm = {"id": str(uuid.uuid4()), "alarmType": alarm_type, "createRules": create_rules,
             "propagate": False, "propagateToOwner": False, "propagateToTenant": False}
    if clear_rule is not None:
        alarm["clearRule"] = clear_rule
    return alarm


def profile_with_alarms(name, alarms):
    data = {
        "configuration": DefaultDeviceProfileConfiguration(type="DEFAULT"),
        "transportConfiguration": DefaultDeviceProfileTransportConfiguration(type="DEFAULT"),
        "provisionConfiguration": DisabledDeviceProfileProvisionConfiguration(type="DISABLED"),
        "alarms": alarms,
    }
    return DeviceProfile(name=name, type="DEFAULT", transport_type="DEFAULT", provision_type="DISABLED",
                         profile_data=data)


HIGH_TEMPERATURE = profile_alarm(
    "High Temperature",
    {"CRITICAL": alarm_rule([numeric_filter("temperature", "GREATER", 50.0)], "Temperature is ${temperature}")},
    alarm_rule([numeric_filter("temperature", "LESS", 30.0)]),
)


def post_telemetry(server, token, values):
    r = requests.post(f"{server}/api/v1/{token}/telemetry", json=values, timeout=WAIT_S)
    assert r.status_code == 200, r.text


def ids(page):
    return [a.id.id for a in page.data]


def test_a_profile_rule_raises_acks_and_clears_an_alarm(server, client):
    profile = client.save_device_profile(profile_with_alarms("alarm-thermostats", [HIGH_TEMPERATURE]))
    assert profile.id.entity_type == "DEVICE_PROFILE" and profile.name == "alarm-thermostats"
    # 4.4's DeviceProfileData drops `alarms` when it deserializes: the same call, not
    # deserialized, shows the rule was kept as sent.
    raw = client.device_profile_controller.get_device_profile_by_id(device_profile_id=profile.id.id,
                                                                     _preload_content=False)
    kept = json.loads(raw.data)["profileData"]["alarms"]
    assert [a["alarmType"] for a in kept] == ["High Temperature"]
    critical = kept[0]["createRules"]["CRITICAL"]
    assert critical["alarmDetails"] == "Temperature is ${temperature}"
    assert critical["condition"]["spec"] == {"type": "SIMPLE"}
    assert critical["condition"]["condition"][0]["predicate"]["value"]["defaultValue"] == 50.0
    assert kept[0]["clearRule"]["condition"]["condition"][0]["predicate"]["operation"] == "LESS"

    device = client.save_device(Device(name="boiler-1", label="Boiler 1", type="alarm-thermostats",
                                       device_profile_id=profile.id))
    assert device.device_profile_id.id == profile.id.id
    token = client.get_device_credentials_by_device_id(device.id).credentials_id

    # 60 > 50: the CRITICAL rule raises the alarm.
    post_telemetry(server, token, {"temperature": 60})

    def raised():
        page = client.get_alarms(device.id, page_size=10, page=0, search_status="ACTIVE")
        return [a for a in page.data if (a.type, a.severity, a.status) == ("High Temperature", "CRITICAL", "ACTIVE_UNACK")]

    [alarm] = wait_until(raised, "the High Temperature alarm", timeout=RAISE_S)
    assert alarm.id.entity_type == "ALARM"
    assert alarm.name == "High Temperature"
    assert (alarm.originator.entity_type, alarm.originator.id) == ("DEVICE", device.id.id)
    assert alarm.acknowledged is False and alarm.cleared is False
    assert alarm.start_ts > 0 and alarm.end_ts >= alarm.start_ts
    assert alarm.ack_ts == 0 and alarm.clear_ts == 0
    assert alarm.details["data"] == "Temperature is 60"
    assert alarm.tenant_id.id == device.tenant_id.id
    assert alarm.originator_name == "boiler-1"

    # The v1 lists by search status.
    for status, listed in [("ANY", True), ("ACTIVE", True), ("UNACK", True), ("ACK", False), ("CLEARED", False)]:
        page = client.get_alarms(device.id, page_size=10, page=0, search_status=status)
        assert ids(page) == ([alarm.id.id] if listed else []), status
    page = client.get_alarms(device.id, page_size=10, page=0, status="ACTIVE_UNACK", fetch_originator=True)
    assert ids(page) == [alarm.id.id] and page.data[0].originator_name == "boiler-1"
    assert ids(client.get_all_alarms(page_size=10, page=0, search_status="ACTIVE")) == [alarm.id.id]
    # The v2 lists by statuses, severities and types.
    page = client.get_alarms_v2(device.id, page_size=10, page=0, status_list=["ACTIVE", "UNACK"],
                                severity_list=["CRITICAL"], type_list=["High Temperature"])
    assert ids(page) == [alarm.id.id] and page.total_elements == 1 and page.has_next is False
    assert ids(client.get_alarms_v2(device.id, page_size=10, page=0, severity_list=["MAJOR", "MINOR"])) == []
    assert ids(client.get_alarms_v2(device.id, page_size=10, page=0, type_list=["Low Temperature"])) == []
    assert ids(client.get_alarms_v2(device.id, page_size=10, page=0, status_list=["CLEARED"])) == []
    assert ids(client.get_all_alarms_v2(page_size=10, page=0, type_list=["High Temperature"])) == [alarm.id.id]

    info = client.get_alarm_info_by_id(alarm.id)
    assert (info.id.id, info.status, info.severity) == (alarm.id.id, "ACTIVE_UNACK", "CRITICAL")
    assert (info.originator_name, info.originator_label, info.originator_display_name) == ("boiler-1", "Boiler 1", "Boiler 1")
    assert info.assignee is None and info.assignee_id is None
    got = client.get_alarm_by_id(alarm.id)
    assert isinstance(got, Alarm) and (got.type, got.status, got.details) == ("High Temperature", "ACTIVE_UNACK", alarm.details)
    assert client.get_highest_alarm_severity(device.id) == "CRITICAL"
    assert client.get_highest_alarm_severity(device.id, search_status="ACTIVE") == "CRITICAL"
    types = client.get_alarm_types(page_size=10, page=0)
    assert [(t.entity_type, t.type) for t in types.data] == [("ALARM", "High Temperature")]

    # Acknowledged: ACTIVE_ACK; a second time, ThingsBoard's 400.
    acked = client.ack_alarm(alarm.id)
    assert (acked.status, acked.acknowledged, acked.cleared) == ("ACTIVE_ACK", True, False)
    assert acked.ack_ts >= alarm.start_ts and acked.originator_name == "boiler-1"
    with pytest.raises(ApiException) as e:
        client.ack_alarm(alarm.id)
    assert e.value.status == 400 and "Alarm was already acknowledged!" in _body(e.value)
    assert ids(client.get_alarms(device.id, page_size=10, page=0, search_status="ACK")) == [alarm.id.id]
    assert ids(client.get_alarms(device.id, page_size=10, page=0, search_status="UNACK")) == []

    # 20 < 30: the clear rule clears it; acknowledged before, it is CLEARED_ACK.
    post_telemetry(server, token, {"temperature": 20})
    def cleared_ack():
        info = client.get_alarm_info_by_id(alarm.id)
        return info if info.status == "CLEARED_ACK" else None

    cleared = wait_until(cleared_ack, "the alarm cleared by the clear rule", timeout=RAISE_S)
    assert cleared.cleared is True and cleared.acknowledged is True and cleared.clear_ts >= acked.ack_ts
    assert ids(client.get_alarms(device.id, page_size=10, page=0, search_status="CLEARED")) == [alarm.id.id]
    assert ids(client.get_alarms(device.id, page_size=10, page=0, search_status="ACTIVE")) == []
    assert ids(client.get_alarms_v2(device.id, page_size=10, page=0, status_list=["CLEARED", "ACK"])) == [alarm.id.id]
    # None active: ThingsBoard's empty body, which the client reads as None.
    assert client.get_highest_alarm_severity(device.id, search_status="ACTIVE") is None
    with pytest.raises(ApiException) as e:
        client.clear_alarm(alarm.id)
    assert e.value.status == 400 and "Alarm was already cleared!" in _body(e.value)

    # Comments: the client's own and ThingsBoard's system comments.
    me = client.get_user()
    mine = client.save_alarm_comment(alarm.id, AlarmComment(comment={"text": "fan replaced"}))
    assert mine.type == "OTHER" and mine.comment["text"] == "fan replaced"
    assert mine.alarm_id.id == alarm.id.id and mine.user_id.id == me.id.id and mine.id.id
    page = client.get_alarm_comments(alarm.id, page_size=10, page=0, sort_property="createdTime", sort_order="ASC")
    texts = [(c.type, c.comment.get("subtype"), c.comment["text"]) for c in page.data]
    assert texts == [("SYSTEM", "ACKED_BY_USER", f"Alarm was acknowledged by user {me.email}"),
                     ("OTHER", None, "fan replaced")], texts
    assert page.data[1].email == me.email and page.data[1].user_id.id == me.id.id
    system = page.data[0]
    with pytest.raises(ApiException) as e:
        client.delete_alarm_comment(alarm.id, system.id)
    assert e.value.status == 400, _body(e.value)
    client.delete_alarm_comment(alarm.id, mine.id)
    page = client.get_alarm_comments(alarm.id, page_size=10, page=0, sort_property="createdTime", sort_order="ASC")
    texts = [(c.type, c.comment.get("subtype")) for c in page.data]
    assert texts == [("SYSTEM", "ACKED_BY_USER"), ("SYSTEM", "COMMENT_DELETED")], texts
    assert me.email in page.data[1].comment["text"]

    # The condition again: a new alarm (the cleared one stays as it is).
    post_telemetry(server, token, {"temperature": 61})
    [again] = wait_until(lambda: client.get_alarms(device.id, page_size=10, page=0, search_status="ACTIVE").data,
                         "a second alarm", timeout=RAISE_S)
    assert again.id.id != alarm.id.id and again.status == "ACTIVE_UNACK" and again.details["data"] == "Temperature is 61"
    assert client.get_alarm_info_by_id(alarm.id).status == "CLEARED_ACK"
    assert ids(client.get_alarms(device.id, page_size=10, page=0, sort_property="createdTime", sort_order="ASC")) == \
        [alarm.id.id, again.id.id]

    # The alarm query (what the alarm widget asks over WebSocket), and its count.
    boilers = DeviceTypeFilter(type="deviceType", device_types=["alarm-thermostats"])
    newest = EntityDataSortOrder(key=EntityKey(type="ALARM_FIELD", key="createdTime"), direction="DESC")
    link = AlarmDataPageLink(page_size=10, page=0, sort_order=newest, status_list=["ACTIVE"], severity_list=["CRITICAL"])
    found = client.find_alarm_data_by_query(AlarmDataQuery(
        entity_filter=boilers, page_link=link, entity_fields=[EntityKey(type="ENTITY_FIELD", key="name")],
        latest_values=[EntityKey(type="TIME_SERIES", key="temperature")]))
    assert found.total_elements == 1 and found.data[0].id.id == again.id.id
    assert found.data[0].entity_id.id == device.id.id
    assert found.data[0].latest["TIME_SERIES"]["temperature"].value == "61"
    assert client.count_alarms_by_query(AlarmCountQuery(entity_filter=boilers, status_list=["ACTIVE"])) == 1
    assert client.count_alarms_by_query(AlarmCountQuery(status_list=["CLEARED"], type_list=["High Temperature"])) == 1

    # Who the alarm may be assigned to: the tenant's administrator.
    me = client.get_user()
    candidates = client.get_users_for_assign(again.id, page_size=10, page=0)
    assert me.email in [u.email for u in candidates.data]


def test_alarms_saved_by_the_client(client):
    pump = client.save_device(Device(name="alarm-pump", type="default"))
    me = client.get_user()
    body = Alarm(name="Pump Failure", type="Pump Failure", originator=pump.id, severity="MAJOR",
                 acknowledged=False, cleared=False, status="ACTIVE_UNACK", details={"pressure": 1.5})
    made = client.save_alarm(body)
    assert made.id.id and (made.type, made.severity, made.status) == ("Pump Failure", "MAJOR", "ACTIVE_UNACK")
    assert made.originator.id == pump.id.id and made.details == {"pressure": 1.5}
    # Saved again while it is active: the same alarm, updated in place (ThingsBoard's
    # createOrUpdateActiveAlarm), with a system comment for the new severity.
    body.severity, body.details = "CRITICAL", {"pressure": 0.2}
    same = client.save_alarm(body)
    assert same.id.id == made.id.id and same.severity == "CRITICAL" and same.details == {"pressure": 0.2}
    assert ids(client.get_alarms(pump.id, page_size=10, page=0)) == [made.id.id]

    assigned = client.assign_alarm(made.id, me.id.id)
    assert assigned.assignee_id.id == me.id.id and assigned.assign_ts > 0
    info = client.get_alarm_info_by_id(made.id)
    assert info.assignee.id.id == me.id.id and info.assignee.email == me.email
    assert ids(client.get_alarms(pump.id, page_size=10, page=0, assignee_id=me.id.id)) == [made.id.id]
    assert ids(client.get_alarms_v2(pump.id, page_size=10, page=0, assignee_id=me.id.id)) == [made.id.id]
    unassigned = client.unassign_alarm(made.id)
    assert unassigned.assignee_id is None
    assert client.get_alarm_info_by_id(made.id).assignee is None
    assert ids(client.get_alarms(pump.id, page_size=10, page=0, assignee_id=me.id.id)) == []

    cleared = client.clear_alarm(made.id)
    assert (cleared.status, cleared.cleared, cleared.acknowledged) == ("CLEARED_UNACK", True, False)
    page = client.get_alarm_comments(made.id, page_size=10, page=0, sort_property="createdTime", sort_order="ASC")
    subtypes = [c.comment["subtype"] for c in page.data]
    assert subtypes == ["SEVERITY_CHANGED", "ASSIGNED_TO_USER", "UNASSIGNED_BY_USER", "CLEARED_BY_USER"], subtypes
    assert page.data[0].comment["text"] == "Alarm severity was updated from MAJOR to CRITICAL"
    assert page.data[3].comment["text"] == f"Alarm was cleared by user {me.email}"

    # Cleared, a save of the same type makes a new alarm.
    body.severity = "MINOR"
    fresh = client.save_alarm(body)
    assert fresh.id.id != made.id.id and fresh.status == "ACTIVE_UNACK"
    # Without a status, as in ThingsBoard, cleared alarms count too.
    assert client.get_highest_alarm_severity(pump.id) == "CRITICAL"
    assert client.get_highest_alarm_severity(pump.id, search_status="ACTIVE") == "MINOR"
    assert client.get_highest_alarm_severity(pump.id, status="CLEARED_UNACK") == "CRITICAL"

    assert client.delete_alarm(made.id) is True
    with pytest.raises(ApiException) as e:
        client.get_alarm_by_id(made.id)
    assert e.value.status == 404
    with pytest.raises(ApiException) as e:
        client.get_alarm_comments(made.id, page_size=10, page=0)
    assert e.value.status == 404
    assert ids(client.get_alarms(pump.id, page_size=10, page=0)) == [fresh.id.id]
    client.delete_alarm(fresh.id)


def test_a_bad_rule_is_refused_naming_where(client):
    wrong = KeyFilter(key=EntityKey(type="TIME_SERIES", key="temperature"), value_type="NUMERIC",
                      predicate=StringFilterPredicate(type="STRING", operation="EQUAL",
                                                      value=FilterPredicateValueString(default_value="hot")))
    bad = profile_alarm("Bad", {"MAJOR": alarm_rule([wrong])}, None)
    with pytest.raises(ApiException) as e:
        client.save_device_profile(profile_with_alarms("alarm-bad", [bad]))
    assert e.value.status == 400
    message = json.loads(_body(e.value))["message"]
    assert "alarms[0].createRules.MAJOR.condition[0].predicate" in message, message
    assert "STRING" in message and "NUMERIC" in message, message
    assert "alarm-bad" not in [p.name for p in client.get_device_profiles(page_size=100, page=0).data]
