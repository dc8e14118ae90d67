"""Compatibility test: tb-rest-client's asset, asset-profile, relation and entity-query
calls against GridLinks, with the client unchanged (see test_tb_rest_client.py for how
to run). Each test starts from the same server; names are unique per test."""

import uuid

import pytest

from gridlinks_server import gridlinks_server

from tb_rest_client.rest_client import RestClient as TbRestClient
from tb_rest_client.models import (
    Asset,
    AssetProfile,
    AssetSearchQuery,
    AssetTypeFilter,
    Customer,
    Device,
    DeviceTypeFilter,
    EntityCountQuery,
    EntityDataPageLink,
    EntityDataQuery,
    EntityDataSortOrder,
    EntityId,
    EntityKey,
    EntityRelation,
    EntityRelationsQuery,
    FilterPredicateValueDouble,
    KeyFilter,
    NumericFilterPredicate,
    RelationEntityTypeFilter,
    RelationsQueryFilter,
    RelationsSearchParameters,
)
from tb_rest_client.rest import ApiException

ADMIN_PASSWORD = "compat-pw-" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with gridlinks_server(tmp_path_factory.mktemp("gridlinks"), ADMIN_PASSWORD) as s:
        c = TbRestClient(base_url=s["base"])
        c.login(username="admin", password=ADMIN_PASSWORD)
        yield c
        c.stop()


def relation(source, target, relation_type):
    # The client's model insists on a group; ThingsBoard's own default is COMMON.
    return EntityRelation(_from=source, to=target, type=relation_type, type_group="COMMON")


def ref(entity_type, entity):
    return EntityId(id=entity.id.id, entity_type=entity_type)


def test_assets_and_asset_profiles(client):
    default = client.get_default_asset_profile_info()
    assert default.name == "default"
    hq = client.save_asset(Asset(name="hq", type="building", label="Head office"))
    assert hq.id.entity_type == "ASSET" and hq.type == "building" and hq.label == "Head office"
    assert client.get_asset_by_id(hq.id.id).name == "hq"
    info = client.get_asset_info_by_id(hq.id.id)
    assert info.type == "building" and info.owner_name is None
    assert client.get_tenant_asset("hq").id.id == hq.id.id
    assert "building" in [t.type for t in client.get_asset_types()]
    assert [a.name for a in client.get_tenant_assets(page_size=10, page=0, type="building").data] == ["hq"]
    assert "hq" in [a.name for a in client.get_tenant_asset_infos(page_size=10, page=0).data]
    assert [a.name for a in client.get_assets_by_ids([hq.id.id])] == ["hq"]

    profile = client.save_asset_profile(AssetProfile(name="plant", description="a plant"))
    assert profile.id.entity_type == "ASSET_PROFILE" and profile.default is False
    assert client.get_asset_profile_info_by_id(profile.id.id).name == "plant"
    names = [p.name for p in client.get_asset_profiles(page_size=10, page=0).data]
    assert {"default", "building", "plant"} <= set(names)
    assert {"default", "building", "plant"} <= {p.name for p in client.get_asset_profile_infos(page_size=10, page=0).data}
    made = client.set_default_asset_profile(profile.id.id)
    assert made.default is True
    assert client.get_default_asset_profile_info().name == "plant"
    client.set_default_asset_profile(default.id.id)
    client.delete_asset_profile(profile.id.id)

    customer = client.save_customer(Customer(title="asset-customer"))
    assigned = client.assign_asset_to_customer(customer.id.id, hq.id.id)
    assert assigned.customer_id.id == customer.id.id
    assert client.get_asset_info_by_id(hq.id.id).owner_name == "asset-customer"
    assert [a.name for a in client.get_customer_assets(customer.id.id, page_size=10, page=0).data] == ["hq"]
    back = client.unassign_asset_from_customer(hq.id.id)
    assert back.customer_id.id == "13814000-1dd2-11b2-8080-808080808080"

    # Telemetry and attributes of an asset, through the same calls as a device's.
    client.save_entity_telemetry(ref("ASSET", hq), "ANY", {"power": 42.5})
    client.save_entity_attributes_v2(ref("ASSET", hq), "SERVER_SCOPE", {"area": 1200})
    latest = client.get_latest_timeseries(ref("ASSET", hq), keys="power")
    assert latest["power"][0].value == "42.5"

    client.delete_asset(hq.id.id)
    with pytest.raises(ApiException) as e:
        client.get_asset_by_id(hq.id.id)
    assert e.value.status == 404


def test_relations(client):
    site = client.save_asset(Asset(name="site", type="site"))
    floor = client.save_asset(Asset(name="floor", type="floor"))
    meter = client.save_device(Device(name="rel-meter", type="meter"))
    saved = client.save_relation(relation(ref("ASSET", site), ref("ASSET", floor), "Contains"))
    assert saved.type == "Contains" and saved.type_group == "COMMON"
    client.save_relation(relation(ref("ASSET", floor), ref("DEVICE", meter), "Contains"))

    got = client.get_relation(ref("ASSET", site), "Contains", ref("ASSET", floor))
    assert got.to.id == floor.id.id
    assert [r.to.id for r in client.find_by_from(ref("ASSET", site), "Contains")] == [floor.id.id]
    assert [r.to.id for r in client.find_by_from_v1(site.id.id, "ASSET")] == [floor.id.id]
    assert [r._from.id for r in client.find_by_to(ref("DEVICE", meter), "Contains")] == [floor.id.id]
    assert [r._from.id for r in client.find_by_to_v1(meter.id.id, "DEVICE")] == [floor.id.id]
    infos = client.find_info_by_from(ref("ASSET", site))
    assert [(i.from_name, i.to_name) for i in infos] == [("site", "floor")]
    assert [i.from_name for i in client.find_info_by_to(meter.id.id, "DEVICE")] == ["floor"]

    params = RelationsSearchParameters(root_id=site.id.id, root_type="ASSET", direction="FROM", max_level=2)
    found = client.find_by_query_v3(EntityRelationsQuery(parameters=params, filters=[]))
    assert sorted(r.to.id for r in found) == sorted([floor.id.id, meter.id.id])
    only_devices = [RelationEntityTypeFilter(relation_type="Contains", entity_types=["DEVICE"])]
    found = client.find_info_by_query(EntityRelationsQuery(parameters=params, filters=only_devices))
    assert [r.to_name for r in found] == ["rel-meter"]
    assets = client.find_by_query(AssetSearchQuery(parameters=params, relation_type="Contains", asset_types=["floor"]))
    assert [a.name for a in assets] == ["floor"]

    gone = client.delete_relation(ref("ASSET", floor), "Contains", ref("DEVICE", meter))
    assert gone.to.id == meter.id.id
    assert client.find_by_to_v1(meter.id.id, "DEVICE") == []
    client.delete_relations(ref("ASSET", site))
    assert client.find_by_from_v1(site.id.id, "ASSET") == []


def test_entity_queries(client):
    for name, temp in [("q-th-1", 19.0), ("q-th-2", 23.5), ("q-th-3", 30.0)]:
        d = client.save_device(Device(name=name, type="q-thermostat"))
        client.save_entity_telemetry(ref("DEVICE", d), "ANY", {"temperature": temp})
    building = client.save_asset(Asset(name="q-building", type="q-building"))

    name = EntityKey(type="ENTITY_FIELD", key="name")
    temperature = EntityKey(type="TIME_SERIES", key="temperature")
    warm = KeyFilter(key=temperature, value_type="NUMERIC", predicate=NumericFilterPredicate(
        type="NUMERIC", operation="GREATER", value=FilterPredicateValueDouble(default_value=20.0)))
    devices = DeviceTypeFilter(type="deviceType", device_types=["q-thermostat"])
    page_link = EntityDataPageLink(page_size=10, page=0, sort_order=EntityDataSortOrder(key=temperature, direction="DESC"))
    query = EntityDataQuery(entity_filter=devices, page_link=page_link, entity_fields=[name],
                            latest_values=[temperature], key_filters=[warm])
    page = client.find_entity_data_by_query(query)
    assert page.total_elements == 2
    assert [e.latest["ENTITY_FIELD"]["name"].value for e in page.data] == ["q-th-3", "q-th-2"]
    assert [e.latest["TIME_SERIES"]["temperature"].value for e in page.data] == ["30.0", "23.5"]
    assert client.count_entities_by_query(EntityCountQuery(entity_filter=devices, key_filters=[warm])) == 2
    assert client.count_entities_by_query(EntityCountQuery(entity_filter=devices)) == 3

    assets = AssetTypeFilter(type="assetType", asset_types=["q-building"])
    page = client.find_entity_data_by_query(EntityDataQuery(
        entity_filter=assets, page_link=EntityDataPageLink(page_size=10, page=0), entity_fields=[name]))
    assert [e.entity_id.id for e in page.data] == [building.id.id]

    meter = client.get_tenant_device("q-th-1")
    client.save_relation(relation(ref("ASSET", building), ref("DEVICE", meter), "Contains"))
    related = RelationsQueryFilter(type="relationsQuery", root_entity=ref("ASSET", building), direction="FROM",
                                   max_level=1, filters=[RelationEntityTypeFilter(relation_type="Contains", entity_types=["DEVICE"])])
    page = client.find_entity_data_by_query(EntityDataQuery(
        entity_filter=related, page_link=EntityDataPageLink(page_size=10, page=0), entity_fields=[name]))
    assert [e.latest["ENTITY_FIELD"]["name"].value for e in page.data] == ["q-th-1"]
