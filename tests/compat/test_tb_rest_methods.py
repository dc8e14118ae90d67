"""Compatibility test: the rest of tb-rest-client's everyday methods for devices, profiles,
customers, users, dashboards, telemetry, OTA and owners, each called through the client
unchanged (docs/api.md, "tb-rest-client 4.4, method by method", lists what each does here;
conftest.py checks that every method marked "works" there is called by a test)."""

import hashlib
import time
import uuid

import pytest
import requests

from gridlinks_server import gridlinks_server

from tb_rest_client.rest import ApiException
from tb_rest_client.rest_client import RestClient as TbRestClient
from tb_rest_client.models import (
    ActivateUserRequest,
    Asset,
    BulkImportRequest,
    ClaimRequest,
    Customer,
    Dashboard,
    Device,
    DeviceCredentials,
    DeviceProfile,
    DeviceSearchQuery,
    EntityDataPageLink,
    EntityDataQuery,
    EntityId,
    EntityKey,
    EntityRelation,
    EntityTypeFilter,
    SaveOtaPackageInfoRequest,
    RelationsSearchParameters,
    SaveDeviceWithCredentialsRequest,
    User,
)

ADMIN_PASSWORD = "compat-pw-" + uuid.uuid4().hex[:8]
NULL_UUID = "13814000-1dd2-11b2-8080-808080808080"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with gridlinks_server(tmp_path_factory.mktemp("gridlinks"), ADMIN_PASSWORD) as s:
        yield s["base"]


@pytest.fixture(scope="module")
def client(server):
    c = TbRestClient(base_url=server)
    c.login(username="admin", password=ADMIN_PASSWORD)
    yield c
    c.stop()


def ref(entity_type, entity):
    return EntityId(id=entity.id.id, entity_type=entity_type)


def customer_user(server, client, customer, email, password):
    """An activated customer user of `customer`, logged in with its own client."""
    user = client.save_user(User(email=email, authority="CUSTOMER_USER", customer_id=customer.id),
                            send_activation_mail=False)
    link = client.get_activation_link(user_id=user.id.id)
    client.activate_user(ActivateUserRequest(activate_token=link.split("activateToken=")[1], password=password),
                         send_activation_mail=False)
    cu = TbRestClient(base_url=server)
    cu.login(username=email, password=password)
    return user, cu


def test_devices(server, client):
    profile = client.save_device_profile(DeviceProfile(name="m-meter", type="DEFAULT", transport_type="DEFAULT"))
    d = client.save_device(Device(name="m-dev-1", type="m-meter"))
    other = client.save_device(Device(name="m-dev-2", type="default"))
    info = client.get_device_info_by_id(d.id.id)
    assert (info.type, info.active) == ("m-meter", False)
    assert {x.name for x in client.get_devices_by_ids([d.id.id, other.id.id])} == {"m-dev-1", "m-dev-2"}
    assert "m-dev-1" in [x.name for x in client.get_all_device_infos(page_size=100, page=0).data]

    creds = client.get_device_credentials_by_device_id(d.id.id)
    creds.credentials_id = "mDevToken" + uuid.uuid4().hex[:8]
    assert client.update_device_credentials(creds).credentials_id == creds.credentials_id
    assert requests.post(f"{server}/api/v1/{creds.credentials_id}/telemetry", json={"t": 1}).status_code == 200

    customer = client.save_customer(Customer(title="m-customer"))
    client.change_owner_to_customer(customer.id.id, ref("DEVICE", d))
    page = client.get_customer_device_infos(customer.id.id, page_size=10, page=0)
    assert [(x.name, x.owner_name) for x in page.data] == [("m-dev-1", "m-customer")]
    client.change_owner_to_tenant(client.get_user().tenant_id.id, ref("DEVICE", d))
    assert client.get_device_by_id(d.id.id).customer_id.id == NULL_UUID

    # Devices found through relations.
    site = client.save_asset(Asset(name="m-site", type="m-site"))
    client.save_relation(EntityRelation(_from=ref("ASSET", site), to=ref("DEVICE", d), type="Contains",
                                        type_group="COMMON"))
    params = RelationsSearchParameters(root_id=site.id.id, root_type="ASSET", direction="FROM", max_level=1)
    found = client.find_by_query_v1(DeviceSearchQuery(parameters=params, relation_type="Contains",
                                                      device_types=["m-meter"]))
    assert [x.name for x in found] == ["m-dev-1"]

    # CSV import.
    csv = "name,type,token\nm-bulk-1,m-meter,mBulkToken1\nm-bulk-2,m-meter,mBulkToken2\n"
    mapping = {"columns": [{"type": "NAME"}, {"type": "TYPE"}, {"type": "ACCESS_TOKEN"}],
               "delimiter": ",", "update": False, "header": True}
    result = client.process_devices_bulk_import(BulkImportRequest(file=csv, mapping=mapping))
    assert result.created == 2, result
    assert client.get_tenant_device("m-bulk-2").type == "m-meter"

    # A device with its credentials in one call: a token, or MQTT basic credentials.
    token = "mWithCreds" + uuid.uuid4().hex[:8]
    made = client.save_device_with_credentials(SaveDeviceWithCredentialsRequest(
        device=Device(name="m-with-token", type="m-meter"),
        credentials=DeviceCredentials(credentials_type="ACCESS_TOKEN", credentials_id=token)))
    assert client.get_device_credentials_by_device_id(made.id.id).credentials_id == token
    basic = '{"clientId":"m-client","userName":"m-user","password":"m-pass"}'
    made = client.save_device_with_credentials(SaveDeviceWithCredentialsRequest(
        device=Device(name="m-with-basic", type="m-meter"),
        credentials=DeviceCredentials(credentials_type="MQTT_BASIC", credentials_id="m-client", credentials_value=basic)))
    assert client.get_device_credentials_by_device_id(made.id.id).credentials_type == "MQTT_BASIC"
    with pytest.raises(ApiException) as e:
        client.save_device_with_credentials(SaveDeviceWithCredentialsRequest(
            device=Device(name="m-taken", type="m-meter"),
            credentials=DeviceCredentials(credentials_type="MQTT_BASIC", credentials_id="m-client", credentials_value=basic)))
    assert e.value.status == 400
    with pytest.raises(ApiException):
        client.get_tenant_device("m-taken")

    # Devices of a profile without a package of their own.
    assert client.count_by_device_profile_and_empty_ota_package("FIRMWARE", profile.id.id) == 5

    # Claiming: the device opens a claim; a customer user claims it by name with the
    # secret; the tenant takes it back.
    token = "mClaimToken" + uuid.uuid4().hex[:6]
    claimed = client.save_device(Device(name="m-claimed", type="default"), access_token=token)
    assert requests.post(f"{server}/api/v1/{token}/claim", json={"secretKey": "s3cret", "durationMs": 60000}).status_code == 200
    _, cu = customer_user(server, client, customer, "m-cu@compat.test", "m-cu-secret")
    cu.claim_device_by_name("m-claimed", ClaimRequest(secret_key="s3cret"))
    assert client.get_device_by_id(claimed.id.id).customer_id.id == customer.id.id
    client.re_claim_device("m-claimed")
    assert client.get_device_by_id(claimed.id.id).customer_id.id == NULL_UUID
    cu.stop()


def test_device_profiles(client):
    p = client.save_device_profile(DeviceProfile(name="m-prof", type="DEFAULT", transport_type="DEFAULT"))
    d = client.save_device(Device(name="m-prof-dev", type="m-prof"))
    client.save_entity_telemetry(ref("DEVICE", d), "ANY", {"m_ts_key": 1})
    client.save_device_attributes(d.id, "SERVER_SCOPE", {"m_attr_key": 2})
    assert client.get_device_profile_info_by_id(p.id.id).name == "m-prof"
    assert [x.name for x in client.get_device_profile_infos_by_ids([p.id.id])] == ["m-prof"]
    assert [x.name for x in client.get_device_profiles_by_ids([p.id.id])] == ["m-prof"]
    assert "m-prof" in [x.name for x in client.get_device_profile_names()]
    assert client.get_timeseries_keys(p.id.id) == ["m_ts_key"]
    assert client.get_attributes_keys(p.id.id) == ["m_attr_key"]
    default = client.get_default_device_profile_info()
    assert client.set_default_device_profile(p.id.id).default is True
    client.set_default_device_profile(default.id.id)


def test_telemetry_and_attributes(client):
    d = client.save_device(Device(name="m-tel", type="default"))
    client.save_entity_telemetry(ref("DEVICE", d), "ANY", {"a": 1, "b": 2})
    client.save_device_attributes(d.id, "SERVER_SCOPE", {"x": 1, "y": 2})
    client.save_device_attributes(d.id, "SHARED_SCOPE", {"z": 3})
    assert sorted(client.get_attribute_keys(ref("DEVICE", d))) == ["x", "y", "z"]
    client.delete_entity_attributes(ref("DEVICE", d), "SERVER_SCOPE", keys="x")
    client.delete_device_attributes(d.id, "SHARED_SCOPE", keys="z")
    assert client.get_attribute_keys(ref("DEVICE", d)) == ["y"]
    client.delete_entity_timeseries(ref("DEVICE", d), keys="a", delete_all_data_for_keys=True)
    assert client.get_timeseries_keys_v1(ref("DEVICE", d)) == ["b"]

    q = EntityDataQuery(entity_filter=EntityTypeFilter(type="entityType", entity_type="DEVICE"),
                        page_link=EntityDataPageLink(page_size=100, page=0),
                        entity_fields=[EntityKey(type="ENTITY_FIELD", key="name")])
    keys = client.find_available_entity_keys_by_query(q, timeseries=True, attributes=True)
    assert "b" in keys.timeseries and "y" in keys.attribute
    keys = client.find_entity_timeseries_and_attributes_keys_by_query(True, True, q)
    assert "b" in keys.timeseries
    v2 = client.find_available_entity_keys_by_query_v2(q)
    assert "b" in [k.key for k in v2.timeseries]


def test_customers(client):
    c = client.save_customer(Customer(title="m-cust", email="m@x.test"))
    assert client.get_customer_by_id(c.id.id).email == "m@x.test"
    assert client.get_customer_info_by_id(c.id.id).title == "m-cust"
    assert client.get_customer_title_by_id(c.id.id) == "m-cust"
    assert client.get_short_customer_info_by_id(c.id.id)["title"] == "m-cust"
    assert [x.title for x in client.get_customers_by_ids([c.id.id])] == ["m-cust"]
    assert client.get_tenant_customer("m-cust").id.id == c.id.id


def test_users_dashboards_and_assets_of_a_customer(server, client):
    c = client.save_customer(Customer(title="m-cust-2"))
    user, cu = customer_user(server, client, c, "m-cu2@compat.test", "m-cu2-secret")
    assert client.get_user_by_id(user.id.id).email == "m-cu2@compat.test"
    assert [u.email for u in client.get_users_by_ids([user.id.id])] == ["m-cu2@compat.test"]
    pending = client.save_user(User(email="m-pending@compat.test", authority="CUSTOMER_USER", customer_id=c.id),
                               send_activation_mail=False)
    info = client.get_activation_link_info(pending.id.id)
    assert "activateToken=" in info.value and info.ttl_ms > 0

    dash = client.save_dashboard(Dashboard(title="m-dash"))
    client.assign_dashboard_to_customer(c.id.id, dash.id.id)
    assert [x.title for x in client.get_customer_dashboards(c.id.id, page_size=10, page=0).data] == ["m-dash"]
    assert [x.title for x in client.get_dashboards_by_ids([dash.id.id])] == ["m-dash"]
    assert abs(client.get_server_time() - time.time() * 1000) < 60_000
    assert client.get_max_datapoints_limit() > 0

    a = client.save_asset(Asset(name="m-asset", type="m-type"))
    client.change_owner_to_customer(c.id.id, ref("ASSET", a))
    assert [x.name for x in cu.get_user_assets(page_size=10, page=0).data] == ["m-asset"]
    assert [x.name for x in client.get_customer_asset_infos(c.id.id, page_size=10, page=0).data] == ["m-asset"]
    assert "m-asset" in [x.name for x in client.get_all_asset_infos(page_size=10, page=0).data]
    prof = client.get_asset_profile_by_id(a.asset_profile_id.id)
    assert prof.name == "m-type"
    assert "m-type" in [x.name for x in client.get_asset_profile_by_names()]
    assert [x.name for x in client.get_asset_profiles_by_ids([prof.id.id])] == ["m-type"]
    cu.stop()


def test_ota_download(client):
    profile = client.get_default_device_profile_info()
    info = client.save_ota_package_info(SaveOtaPackageInfoRequest(title="m-fw", version="1", type="FIRMWARE",
                                                                  device_profile_id=profile.id, uses_url=False))
    data = b"m-firmware-bytes" * 100
    path = "/tmp/m-fw-" + uuid.uuid4().hex + ".bin"
    with open(path, "wb") as f:
        f.write(data)
    client.save_ota_package_data(info.id, "SHA256", path, checksum=hashlib.sha256(data).hexdigest())
    assert client.download_ota_package(info.id.id) == data
