"""Compatibility test: ThingsBoard's official Python REST client against GridLinks.

The client (PyPI `tb-rest-client`, version pinned in requirements.txt next to
this file) is used unchanged. The test starts its own gridlinks server on a
free loopback port with a temporary data dir, drives it through the client,
and stops it with SIGTERM.

    pip install -r tests/compat/requirements.txt
    python3 -m pytest -q tests/compat

GRIDLINKS_BIN selects the binary (default: target/debug/gridlinks of this repository).

The steps are separate test functions that share one server and one device,
so they run in file order.
"""

import json
import time
import uuid

import jwt
import pytest
import requests

from gridlinks_server import gridlinks_server

# tb-rest-client 4.4 has no rest_client_ce/RestClientCE any more: Community and
# Professional Edition were merged into this one RestClient. (4.3's RestClientCE
# cannot even build a Device without a device_profile_id; GridLinks serves
# /api/deviceProfileInfo/default and /api/deviceProfileInfos for it.)
from tb_rest_client.rest_client import RestClient as TbRestClient
from tb_rest_client.models import (
    ActivateUserRequest,
    ApiKeyInfo,
    ChangePasswordRequest,
    Customer,
    Dashboard,
    Device,
    DeviceProfile,
    DeviceProfileData,
    Tenant,
    User,
)
from tb_rest_client.rest import ApiException

ADMIN_USER = "admin"
ADMIN_PASSWORD = "compat-pw-" + uuid.uuid4().hex[:8]
SYSADMIN_PASSWORD = "compat-sys-" + uuid.uuid4().hex[:8]
DEVICE_NAME = "compat-thermo-1"
DEVICE_TYPE = "thermostat"
DEVICE_TOKEN = "compatTok" + uuid.uuid4().hex[:12]

# Telemetry: an older point, then the one from the task; the latest must be the second.
NOW_MS = int(time.time() * 1000)
TS_OLD = NOW_MS - 60_000
TS_NEW = NOW_MS - 30_000
OLD_VALUES = {"temperature": 19.75, "on": False}
NEW_VALUES = {"temperature": 21.5, "on": True}

SERVER_ATTRS = {"firmware": "1.2.3", "threshold": 30, "calibrated": True, "gain": 0.25}




def _body(exc):
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    return body or ""


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with gridlinks_server(tmp_path_factory.mktemp("gridlinks"), ADMIN_PASSWORD,
                          GRIDLINKS_ADMIN_SYSADMIN_PASSWORD=SYSADMIN_PASSWORD) as s:
        yield s["base"]


@pytest.fixture(scope="module")
def client(server):
    c = TbRestClient(base_url=server)
    c.login(username=ADMIN_USER, password=ADMIN_PASSWORD)
    yield c
    c.stop()  # the refresh thread is never started; stop() only sets its event


@pytest.fixture(scope="module")
def state():
    """Values handed from one step to the next (device id, ...)."""
    return {}


def _device_id(state):
    if "device_id" not in state:
        pytest.fail("no device: the save_device step did not succeed")
    return state["device_id"]


# ---------------------------------------------------------------- steps

def test_login(client):
    token = client.get_token()
    assert isinstance(token, str) and token.count(".") == 2, f"login gave no JWT: {client.token_info!r}"
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["sub"] == ADMIN_USER
    assert "TENANT_ADMIN" in claims["scopes"]
    assert claims["exp"] > time.time()
    assert client.token_info["exp"] == claims["exp"]
    assert client.token_info["refreshToken"], "login response had no refreshToken"


def test_login_wrong_password_is_rejected(server):
    r = requests.post(server + "/api/auth/login", json={"username": ADMIN_USER, "password": "wrong"}, timeout=10)
    assert r.status_code == 401
    assert "token" not in r.json()


def test_save_device(client, state):
    device = client.save_device(body=Device(name=DEVICE_NAME, type=DEVICE_TYPE), access_token=DEVICE_TOKEN)
    assert isinstance(device, Device)
    assert device.name == DEVICE_NAME
    assert device.type == DEVICE_TYPE
    assert device.id.entity_type == "DEVICE"
    uuid.UUID(device.id.id)  # a real UUID
    assert device.tenant_id.entity_type == "TENANT"
    assert device.device_profile_id.entity_type == "DEVICE_PROFILE"
    assert abs(device.created_time - int(time.time() * 1000)) < 120_000
    state["device_id"] = device.id
    state["device"] = device


def test_get_device_by_id(client, state):
    device_id = _device_id(state)
    device = client.get_device_by_id(device_id=device_id)
    assert isinstance(device, Device)
    assert device.id.id == device_id.id
    assert device.id.entity_type == "DEVICE"
    assert device.name == DEVICE_NAME
    assert device.type == DEVICE_TYPE
    assert device.created_time == state["device"].created_time
    assert device.tenant_id.id == state["device"].tenant_id.id


def test_get_tenant_devices(client, state):
    device_id = _device_id(state)
    page = client.get_tenant_devices(page_size=10, page=0)
    assert page.total_elements == 1
    assert page.total_pages == 1
    assert page.has_next is False
    assert len(page.data) == 1
    only = page.data[0]
    assert isinstance(only, Device)
    assert only.id.id == device_id.id
    assert only.name == DEVICE_NAME
    assert only.type == DEVICE_TYPE


def test_device_types_and_infos(client, state):
    types = client.get_device_types()
    assert [(t.entity_type, t.type) for t in types] == [("DEVICE", DEVICE_TYPE)]
    infos = client.get_tenant_device_infos(page_size=10, page=0)
    assert [(d.name, d.type, d.active) for d in infos.data] == [(DEVICE_NAME, DEVICE_TYPE, False)]


def test_get_device_credentials(client, state):
    device_id = _device_id(state)
    creds = client.get_device_credentials_by_device_id(device_id=device_id)
    assert creds.credentials_id == DEVICE_TOKEN
    assert creds.credentials_type == "ACCESS_TOKEN"
    assert creds.device_id.id == device_id.id
    assert creds.device_id.entity_type == "DEVICE"


def test_post_telemetry_via_device_api(server, state):
    _device_id(state)
    for ts, values in ((TS_OLD, OLD_VALUES), (TS_NEW, NEW_VALUES)):
        r = requests.post(f"{server}/api/v1/{DEVICE_TOKEN}/telemetry",
                          json={"ts": ts, "values": values}, timeout=10)
        assert r.status_code == 200, r.text
    state["telemetry_posted"] = True


def test_latest_timeseries(client, state):
    device_id = _device_id(state)
    assert state.get("telemetry_posted"), "telemetry step did not succeed"
    latest = client.get_latest_timeseries(entity_id=device_id, keys="temperature,on")
    assert set(latest) == {"temperature", "on"}
    # Without useStrictDataTypes ThingsBoard returns every value as a string.
    assert [(p.ts, p.value) for p in latest["temperature"]] == [(TS_NEW, "21.5")]
    assert [(p.ts, p.value) for p in latest["on"]] == [(TS_NEW, "true")]


def test_latest_timeseries_strict_types(client, state):
    device_id = _device_id(state)
    assert state.get("telemetry_posted"), "telemetry step did not succeed"
    # The client sends useStrictDataTypes=True (a Python bool, capital T).
    latest = client.get_latest_timeseries(entity_id=device_id, keys="temperature,on",
                                          use_strict_data_types=True)
    assert [(p.ts, p.value) for p in latest["temperature"]] == [(TS_NEW, 21.5)]
    assert [(p.ts, p.value) for p in latest["on"]] == [(TS_NEW, True)]


def test_timeseries_history(client, state):
    device_id = _device_id(state)
    assert state.get("telemetry_posted"), "telemetry step did not succeed"
    # Client 4.4 calls GET .../values/timeseries/history.
    history = client.get_timeseries(entity_id=device_id, keys="temperature,on",
                                    start_ts=TS_OLD - 1000, end_ts=TS_NEW + 1000)
    assert set(history) == {"temperature", "on"}
    # Default order is DESC, values as strings (no useStrictDataTypes).
    assert [(p.ts, p.value) for p in history["temperature"]] == [(TS_NEW, "21.5"), (TS_OLD, "19.75")]
    assert [(p.ts, p.value) for p in history["on"]] == [(TS_NEW, "true"), (TS_OLD, "false")]


def test_timeseries_keys(client, state):
    device_id = _device_id(state)
    assert state.get("telemetry_posted"), "telemetry step did not succeed"
    assert sorted(client.get_timeseries_keys_v1(entity_id=device_id)) == ["on", "temperature"]


def _assert_server_attrs(client, device_id, expected):
    attrs = client.get_attributes_by_scope(entity_id=device_id, scope="SERVER_SCOPE",
                                           keys=",".join(expected))
    got = {a.key: a.value for a in attrs}
    assert got == expected
    for a in attrs:
        assert type(a.value) is type(expected[a.key]), (a.key, a.value)
        assert abs(a.last_update_ts - int(time.time() * 1000)) < 120_000
    # get_attributes (all scopes) sees the same server-scope values
    every = {a.key: a.value for a in client.get_attributes(entity_id=device_id, keys=",".join(expected))}
    assert every == expected
    assert sorted(client.get_attribute_keys_by_scope(entity_id=device_id, scope="SERVER_SCOPE")) \
        == sorted(expected)


def test_save_device_attributes(client, state):
    device_id = _device_id(state)
    attrs = {"location": "boiler-room", "maxTemp": 80}
    # The legacy device-only route: POST /api/plugins/telemetry/{deviceId}/{scope}.
    client.save_device_attributes(device_id=device_id, scope="SERVER_SCOPE", body=attrs)
    got = {a.key: a.value for a in client.get_attributes_by_scope(
        entity_id=device_id, scope="SERVER_SCOPE", keys="location,maxTemp")}
    assert got == attrs


def test_save_entity_attributes_and_read_back(client, state):
    device_id = _device_id(state)
    # POST /api/plugins/telemetry/DEVICE/{id}/attributes/SERVER_SCOPE
    result = client.save_entity_attributes_v2(entity_id=device_id, scope="SERVER_SCOPE", body=SERVER_ATTRS)
    assert result is None
    # ... plus those test_save_device_attributes saved through the legacy route.
    expected = dict(SERVER_ATTRS, location="boiler-room", maxTemp=80)
    _assert_server_attrs(client, device_id, expected)
    # The older entity form POST .../DEVICE/{id}/{scope} writes too.
    client.save_entity_attributes_v1(entity_id=device_id, scope="SERVER_SCOPE", body={"floor": 3})
    got = {a.key: a.value for a in client.get_attributes_by_scope(entity_id=device_id, scope="SERVER_SCOPE", keys="floor")}
    assert got == {"floor": 3}
    # Server-scope attributes are not client-scope attributes.
    assert client.get_attributes_by_scope(entity_id=device_id, scope="CLIENT_SCOPE") == []


def test_current_user_and_device_profiles(client):
    user = client.get_user()
    assert user.authority == "TENANT_ADMIN"
    assert user.email == "admin"
    default = client.get_default_device_profile_info()
    assert default.name == "default"
    infos = client.get_device_profile_infos(page_size=10, page=0)
    names = sorted(p.name for p in infos.data)
    assert "default" in names and infos.total_elements == len(names)


def test_device_profiles_as_entities(client):
    # A profile with ThingsBoard's model classes, a device pointing at it by id, the
    # refusals ThingsBoard gives, and the profile gone once nothing uses it.
    data = DeviceProfileData(configuration={"type": "DEFAULT"},
                             transport_configuration={"type": "DEFAULT"},
                             provision_configuration={"type": "DISABLED", "provisionDeviceSecret": None})
    saved = client.save_device_profile(DeviceProfile(name="compat-meter", description="meters", type="DEFAULT",
                                                     transport_type="DEFAULT", provision_type="DISABLED",
                                                     profile_data=data))
    assert saved.id.entity_type == "DEVICE_PROFILE" and saved.name == "compat-meter"
    again = client.get_device_profile_by_id(device_profile_id=saved.id.id)
    assert again.description == "meters" and again.profile_data.to_dict()["configuration"] == {"type": "DEFAULT"}
    assert "compat-meter" in [p.name for p in client.get_device_profiles(page_size=100, page=0).data]

    device = client.save_device(Device(name="compat-meter-1", device_profile_id=saved.id))
    assert device.type == "compat-meter" and device.device_profile_id.id == saved.id.id
    with pytest.raises(ApiException) as err:
        client.delete_device_profile(device_profile_id=saved.id.id)
    assert err.value.status == 400 and "cannot be deleted" in _body(err.value)
    with pytest.raises(ApiException) as err:
        client.delete_device_profile(device_profile_id=client.get_default_device_profile_info().id.id)
    assert err.value.status == 400

    client.delete_device(device_id=device.id.id)
    client.delete_device_profile(device_profile_id=saved.id.id)
    with pytest.raises(ApiException) as err:
        client.get_device_profile_by_id(device_profile_id=saved.id.id)
    assert err.value.status == 404


def test_dashboards(client):
    config = {"widgets": {"w1": {"type": "latest", "config": {}}}, "states": {"default": {"name": "main"}}}
    saved = client.save_dashboard(Dashboard(title="compat-dashboard", configuration=config))
    assert saved.id.entity_type == "DASHBOARD" and saved.title == "compat-dashboard"
    again = client.get_dashboard_by_id(dashboard_id=saved.id.id)
    assert again.configuration == config
    assert client.get_dashboard_info_by_id(dashboard_id=saved.id.id).title == "compat-dashboard"
    page = client.get_tenant_dashboards(page_size=10, page=0, text_search="compat")
    assert [d.title for d in page.data] == ["compat-dashboard"]
    client.delete_dashboard(dashboard_id=saved.id.id)
    with pytest.raises(ApiException) as err:
        client.get_dashboard_by_id(dashboard_id=saved.id.id)
    assert err.value.status == 404


def test_api_keys(server, client):
    # A key made with the client's own call, then a second client that logs in with it only.
    user = client.get_user()
    key = client.save_api_key(ApiKeyInfo(description="compat-automation", expiration_time=0, enabled=True,
                                         user_id=user.id))
    assert key.value and key.enabled
    automation = TbRestClient(base_url=server)
    automation.api_key_login(key.value)
    assert automation.get_user().email == ADMIN_USER
    assert automation.get_tenant_devices(page_size=10, page=0).total_elements >= 0
    keys = client.get_user_api_keys(user_id=user.id.id, page_size=10, page=0)
    assert [k.description for k in keys.data] == ["compat-automation"]
    client.delete_api_key(id=key.id.id)
    with pytest.raises(ApiException) as err:
        automation.get_tenant_devices(page_size=10, page=0)
    assert err.value.status == 401


def test_customers_and_assignment(client):
    customer = client.save_customer(Customer(title="compat-customer", email="ops@example.test"))
    assert customer.id.entity_type == "CUSTOMER" and customer.title == "compat-customer"
    device = client.save_device(Device(name="compat-assigned", type="default"))
    assigned = client.assign_device_to_customer(customer_id=customer.id.id, device_id=device.id.id)
    assert assigned.customer_id.id == customer.id.id
    page = client.get_customer_devices(customer_id=customer.id.id, page_size=10, page=0)
    assert [d.name for d in page.data] == ["compat-assigned"]
    back = client.unassign_device_from_customer(device_id=device.id.id)
    assert back.customer_id.id == "13814000-1dd2-11b2-8080-808080808080"
    assert "compat-customer" in [c.title for c in client.get_customers(page_size=10, page=0).data]
    client.delete_customer(customer_id=customer.id.id)
    client.delete_device(device_id=device.id.id)


def test_customer_users_see_only_their_customers_devices(server, client):
    customer = client.save_customer(Customer(title="compat-users"))
    mine = client.save_device(Device(name="compat-cu-device", type="default"))
    tenants = client.save_device(Device(name="compat-tenant-device", type="default"))
    client.assign_device_to_customer(customer_id=customer.id.id, device_id=mine.id.id)
    body = User(email="cu@compat.test", authority="CUSTOMER_USER", customer_id=customer.id, first_name="Cu")
    user = client.save_user(body, send_activation_mail=False)
    assert user.authority == "CUSTOMER_USER" and user.customer_id.id == customer.id.id

    # Activated through its link (the client builds its API objects only at login, so the
    # logged-in one calls this no-auth path).
    link = client.get_activation_link(user_id=user.id.id)
    token = link.split("activateToken=")[1]
    pair = client.activate_user(ActivateUserRequest(activate_token=token, password="cu-secret-1"), send_activation_mail=False)
    assert pair.token.count(".") == 2

    cu = TbRestClient(base_url=server)
    cu.login(username="cu@compat.test", password="cu-secret-1")
    claims = jwt.decode(cu.get_token(), options={"verify_signature": False})
    assert claims["scopes"] == ["CUSTOMER_USER"] and claims["customerId"] == customer.id.id
    assert claims["userId"] == user.id.id
    me = cu.get_user()
    assert me.email == "cu@compat.test" and me.authority == "CUSTOMER_USER"
    page = cu.get_customer_devices(customer_id=customer.id.id, page_size=10, page=0)
    assert [d.name for d in page.data] == ["compat-cu-device"]
    assert cu.get_device_by_id(device_id=mine.id.id).name == "compat-cu-device"
    for call in (lambda: cu.get_device_by_id(device_id=tenants.id.id),
                 lambda: cu.get_tenant_devices(page_size=10, page=0),
                 lambda: cu.get_customers(page_size=10, page=0)):
        with pytest.raises(ApiException) as e:
            call()
        assert e.value.status == 403, _body(e.value)
        assert "compat-tenant-device" not in _body(e.value)

    new = cu.change_password(ChangePasswordRequest(current_password="cu-secret-1", new_password="cu-secret-2"))
    assert new.token.count(".") == 2
    users = client.get_customer_users(customer_id=customer.id.id, page_size=10, page=0)
    assert [u.email for u in users.data] == ["cu@compat.test"]
    client.delete_user(user_id=user.id.id)
    with pytest.raises(ApiException) as e:
        cu.get_user()
    assert e.value.status == 401
    client.delete_customer(customer_id=customer.id.id)
    client.delete_device(device_id=mine.id.id)
    client.delete_device(device_id=tenants.id.id)
    cu.stop()


def test_tenants_and_their_administrators(server, client, state):
    sys = TbRestClient(base_url=server)
    sys.login(username="sysadmin", password=SYSADMIN_PASSWORD)
    tenant = sys.save_tenant(Tenant(title="compat-beta"))
    assert tenant.id.entity_type == "TENANT" and tenant.title == "compat-beta"
    assert "compat-beta" in [t.title for t in sys.get_tenants(page_size=10, page=0).data]
    body = User(email="boss@compat-beta.test", authority="TENANT_ADMIN", tenant_id=tenant.id)
    boss = sys.save_user(body, send_activation_mail=False)
    token = sys.get_activation_link(user_id=boss.id.id).split("activateToken=")[1]
    sys.activate_user(ActivateUserRequest(activate_token=token, password="beta-secret"), send_activation_mail=False)
    admins = sys.get_tenant_admins(tenant_id=tenant.id, page_size=10, page=0)
    assert [u.email for u in admins.data] == ["boss@compat-beta.test"]

    beta = TbRestClient(base_url=server)
    beta.login(username="boss@compat-beta.test", password="beta-secret")
    claims = jwt.decode(beta.get_token(), options={"verify_signature": False})
    assert claims["scopes"] == ["TENANT_ADMIN"] and claims["tenantId"] == tenant.id.id
    # The same device name as the first tenant's device: each tenant has its own names.
    device = beta.save_device(Device(name=DEVICE_NAME, type="default"))
    assert [d.name for d in beta.get_tenant_devices(page_size=10, page=0).data] == [DEVICE_NAME]
    # Another tenant's device is answered as one that does not exist (404; ThingsBoard
    # answers 403, GridLinks with auth.hide_other_tenants = false too); the system
    # administrator reads no tenant's devices (403).
    for call, status in ((lambda: beta.get_device_by_id(device_id=_device_id(state)), 404),
                         (lambda: client.get_device_by_id(device_id=device.id.id), 404),
                         (lambda: sys.get_tenant_devices(page_size=10, page=0), 403)):
        with pytest.raises(ApiException) as e:
            call()
        assert e.value.status == status, _body(e.value)

    sys.delete_tenant(tenant_id=tenant.id)
    with pytest.raises(ApiException) as e:
        beta.get_user()
    assert e.value.status == 401
    assert client.get_device_by_id(device_id=_device_id(state)).name == DEVICE_NAME
    sys.stop()
    beta.stop()


def test_delete_device(server, client, state):
    device_id = _device_id(state)
    # the token works right before the delete ...
    r = requests.post(f"{server}/api/v1/{DEVICE_TOKEN}/telemetry", json={"temperature": 22.0}, timeout=10)
    assert r.status_code == 200, r.text

    assert client.delete_device(device_id=device_id) is None

    # ... and is refused right after it
    r = requests.post(f"{server}/api/v1/{DEVICE_TOKEN}/telemetry",
                      json={"ts": NOW_MS, "values": NEW_VALUES}, timeout=10)
    assert r.status_code == 401, (r.status_code, r.text)

    with pytest.raises(ApiException) as err:
        client.get_device_by_id(device_id=device_id)
    assert err.value.status == 404
    assert json.loads(_body(err.value))["status"] == 404

    page = client.get_tenant_devices(page_size=10, page=0)
    assert page.total_elements == 0
    assert page.data == []
