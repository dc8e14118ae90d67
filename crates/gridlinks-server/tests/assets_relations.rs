//! Assets, asset profiles, relations of any type and entity queries on the real binary, as
//! ThingsBoard's REST API serves them: an asset's type is its profile (created on first
//! use), its data lives and dies with it, relations join any two entities of a tenant and
//! are found by either end or by a query, and `/api/entitiesQuery/find|count` selects
//! devices, assets and customers by type, name, relations and key filters — for a customer
//! user, only its own customer's.
#![allow(clippy::unwrap_used)] // tests unwrap: a panic is the failure report

mod common;
use common::*;

fn id(j: &J) -> String {
    j["id"]["id"].as_str().unwrap_or_else(|| panic!("no id in {j}")).to_owned()
}

fn asset(s: &Server, jwt: &str, name: &str, t: &str) -> String {
    let (st, a) =
        s.json("POST", "/api/asset", jwt, Some(json!({"name": name, "type": t, "label": format!("{name} label")})));
    assert_eq!(st, 200, "{a}");
    id(&a)
}

fn relate(s: &Server, jwt: &str, from: (&str, &str), to: (&str, &str), t: &str) {
    let r = json!({"from": {"entityType": from.0, "id": from.1}, "to": {"entityType": to.0, "id": to.1}, "type": t});
    let (st, out) = s.json("POST", "/api/v2/relation", jwt, Some(r.clone()));
    assert_eq!(st, 200, "{out}");
    assert_eq!((out["type"].clone(), out["typeGroup"].as_str()), (r["type"].clone(), Some("COMMON")), "{out}");
}

#[test]
fn assets_and_their_profiles_data_and_customers() {
    let s = Server::start();
    let jwt = s.login();

    // A new type is a new profile; a tenant has its default from the first call.
    let (_, default) = s.json("GET", "/api/assetProfileInfo/default", &jwt, None);
    assert_eq!(default["name"], "default", "{default}");
    let hq = asset(&s, &jwt, "HQ", "building");
    let plant = asset(&s, &jwt, "Plant", "building");
    let pump = asset(&s, &jwt, "pump-room", "room");
    let plain = {
        let (_, a) = s.json("POST", "/api/asset", &jwt, Some(json!({"name": "no-type"})));
        assert_eq!(
            (a["type"].as_str(), a["assetProfileId"]["id"].clone()),
            (Some("default"), default["id"]["id"].clone())
        );
        id(&a)
    };
    let (_, types) = s.json("GET", "/api/asset/types", &jwt, None);
    let types: Vec<&str> = types.as_array().unwrap().iter().map(|t| t["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["building", "default", "room"]);
    let (_, a) = s.json("GET", &format!("/api/asset/{hq}"), &jwt, None);
    assert_eq!(
        (a["name"].as_str(), a["type"].as_str(), a["label"].as_str()),
        (Some("HQ"), Some("building"), Some("HQ label"))
    );
    assert_eq!(a["id"]["entityType"], "ASSET");
    let building = a["assetProfileId"]["id"].as_str().unwrap().to_owned();

    // Names are unique in the tenant; an update keeps the id and may rename.
    let (st, dup) = s.json("POST", "/api/asset", &jwt, Some(json!({"name": "HQ", "type": "x"})));
    assert_eq!(st, 400, "{dup}");
    let (st, renamed) = s.json(
        "POST",
        "/api/asset",
        &jwt,
        Some(json!({"id": {"id": hq, "entityType": "ASSET"}, "name": "Head office", "type": "building"})),
    );
    assert_eq!((st, renamed["name"].as_str(), id(&renamed)), (200, Some("Head office"), hq.clone()));
    let (_, found) = s.json("GET", "/api/tenant/asset?assetName=Head%20office", &jwt, None);
    assert_eq!(id(&found), hq);
    assert_eq!(s.json("GET", "/api/tenant/asset?assetName=HQ", &jwt, None).0, 404);

    // Lists: type, text, sort, pages.
    let names = |path: &str| -> Vec<String> {
        let (st, p) = s.json("GET", path, &jwt, None);
        assert_eq!(st, 200, "{path}: {p}");
        p["data"].as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(names("/api/tenant/assets?pageSize=10&page=0&type=building"), ["Head office", "Plant"]);
    assert_eq!(names("/api/tenant/assets?pageSize=10&page=0&textSearch=ROOM"), ["pump-room"]);
    assert_eq!(
        names("/api/tenant/assets?pageSize=2&page=1&sortProperty=name&sortOrder=DESC"),
        ["Plant", "Head office"]
    );
    let (_, page) = s.json("GET", "/api/tenant/assets?pageSize=3&page=0", &jwt, None);
    assert_eq!(
        (page["totalElements"].as_i64(), page["totalPages"].as_i64(), page["hasNext"].as_bool()),
        (Some(4), Some(2), Some(true))
    );
    assert_eq!(
        names(&format!("/api/assetInfos/all?pageSize=10&page=0&assetProfileId={building}")),
        ["Head office", "Plant"]
    );
    let (_, by_ids) = s.json("GET", &format!("/api/assets?assetIds={plant},{pump}"), &jwt, None);
    assert_eq!(by_ids.as_array().unwrap().len(), 2);

    // Profiles: the default moves; one in use or the default is not deleted.
    let (_, profiles) = s.json("GET", "/api/assetProfiles?pageSize=10&page=0", &jwt, None);
    assert_eq!(profiles["totalElements"], 3, "{profiles}");
    let (st, made) = s.json("POST", &format!("/api/assetProfile/{building}/default"), &jwt, None);
    assert_eq!((st, made["default"].as_bool()), (200, Some(true)), "{made}");
    let (_, now_default) = s.json("GET", "/api/assetProfileInfo/default", &jwt, None);
    assert_eq!(now_default["name"], "building");
    let (_, old) = s.json("GET", &format!("/api/assetProfile/{}", default["id"]["id"].as_str().unwrap()), &jwt, None);
    assert_eq!(old["default"], false);
    assert_eq!(s.json("DELETE", &format!("/api/assetProfile/{building}"), &jwt, None).0, 400, "the default");
    let (_, room) = s.json("GET", &format!("/api/asset/{pump}"), &jwt, None);
    let room_profile = room["assetProfileId"]["id"].as_str().unwrap().to_owned();
    assert_eq!(s.json("DELETE", &format!("/api/assetProfile/{room_profile}"), &jwt, None).0, 400, "in use");
    let (st, spare) = s.json("POST", "/api/assetProfile", &jwt, Some(json!({"name": "spare", "description": "d"})));
    assert_eq!((st, spare["description"].as_str(), spare["default"].as_bool()), (200, Some("d"), Some(false)));
    assert_eq!(s.json("DELETE", &format!("/api/assetProfile/{}", id(&spare)), &jwt, None).0, 200);
    let (_, names_list) = s.json("GET", "/api/assetProfile/names?activeOnly=true", &jwt, None);
    assert_eq!(names_list.as_array().unwrap().len(), 3, "{names_list}");

    // An asset holds telemetry and attributes as a device does.
    let tel = format!("/api/plugins/telemetry/ASSET/{plant}");
    assert_eq!(s.req("POST", &format!("{tel}/timeseries/ANY"), Some(&jwt), Some(r#"{"power":42.5}"#)).0, 200);
    assert_eq!(s.req("POST", &format!("{tel}/attributes/SERVER_SCOPE"), Some(&jwt), Some(r#"{"area":1200}"#)).0, 200);
    let (_, v) = s.json("GET", &format!("{tel}/values/timeseries?keys=power"), &jwt, None);
    assert_eq!(v["power"][0]["value"], "42.5", "{v}");
    let (_, v) = s.json("GET", &format!("{tel}/values/attributes/SERVER_SCOPE"), &jwt, None);
    assert_eq!((v[0]["key"].as_str(), v[0]["value"].as_i64()), (Some("area"), Some(1200)), "{v}");

    // Customers: assigned, listed, seen by the customer's user only.
    let acme = s.customer(&jwt, "Acme");
    let other = s.customer(&jwt, "Other");
    let (st, assigned) = s.json("POST", &format!("/api/customer/{acme}/asset/{plant}"), &jwt, None);
    assert_eq!((st, assigned["customerId"]["id"].as_str()), (200, Some(&*acme)));
    let (_, info) = s.json("GET", &format!("/api/asset/info/{plant}"), &jwt, None);
    assert_eq!(info["customerTitle"], "Acme");
    assert_eq!(s.json("POST", &format!("/api/owner/CUSTOMER/{other}/ASSET/{pump}"), &jwt, None).0, 200);
    let (_, cu) = s.user(&jwt, "cu@acme.test", Some(&acme), "acme-pw");
    let (_, mine) = s.json("GET", "/api/user/assets?pageSize=10&page=0", &cu, None);
    assert_eq!(mine["data"].as_array().unwrap().iter().map(|a| a["name"].clone()).collect::<Vec<_>>(), ["Plant"]);
    assert_eq!(s.json("GET", &format!("/api/asset/{plant}"), &cu, None).0, 200);
    assert_eq!(s.json("GET", &format!("/api/asset/{pump}"), &cu, None).0, 403);
    assert_eq!(s.json("GET", &format!("{tel}/values/timeseries?keys=power"), &cu, None).0, 200);
    let (_, theirs) = s.json("GET", &format!("/api/customer/{acme}/assets?pageSize=10&page=0"), &jwt, None);
    assert_eq!(theirs["totalElements"], 1);
    let (_, back) = s.json("DELETE", &format!("/api/customer/asset/{plant}"), &jwt, None);
    assert_eq!(back["customerId"]["id"].as_str(), Some("13814000-1dd2-11b2-8080-808080808080"));
    assert_eq!(s.json("GET", &format!("/api/asset/{plant}"), &cu, None).0, 403);

    // Deleting an asset deletes its data; a new asset of the same name starts empty.
    assert_eq!(s.json("DELETE", &format!("/api/asset/{plant}"), &jwt, None).0, 200);
    assert_eq!(s.json("GET", &format!("/api/asset/{plant}"), &jwt, None).0, 404);
    assert_eq!(s.json("GET", &format!("{tel}/values/timeseries?keys=power"), &jwt, None).0, 404);
    assert_eq!(s.req("POST", &format!("{tel}/timeseries/ANY"), Some(&jwt), Some(r#"{"power":1}"#)).0, 404);
    let again = asset(&s, &jwt, "Plant", "building");
    let (_, v) =
        s.json("GET", &format!("/api/plugins/telemetry/ASSET/{again}/values/timeseries?keys=power"), &jwt, None);
    assert_eq!(v["power"][0]["value"], J::Null, "no value, as ThingsBoard answers a key never written: {v}");

    // Bad input: a clear 400, nothing made.
    for bad in [json!({"type": "x"}), json!({"name": "  "}), json!({"name": "p", "assetProfileId": {"id": "nope"}})] {
        let (st, out) = s.json("POST", "/api/asset", &jwt, Some(bad.clone()));
        assert_eq!(st, 400, "{bad}: {out}");
    }
    assert_eq!(s.json("GET", "/api/asset/not-a-uuid", &jwt, None).0, 400);
    let _ = plain;
}

#[test]
fn relations_of_any_type_between_any_entities() {
    let s = Server::start();
    let jwt = s.login();
    let site = asset(&s, &jwt, "site", "site");
    let floor = asset(&s, &jwt, "floor-1", "floor");
    let meter = s.device(&jwt, "meter", "METERTOKEN");
    let acme = s.customer(&jwt, "Acme");
    relate(&s, &jwt, ("ASSET", &site), ("ASSET", &floor), "Contains");
    relate(&s, &jwt, ("ASSET", &floor), ("DEVICE", &meter), "Contains");
    relate(&s, &jwt, ("CUSTOMER", &acme), ("ASSET", &site), "Manages");

    // One relation; saved again it is the same one, with what was attached last.
    let one = format!("fromId={site}&fromType=ASSET&relationType=Contains&toId={floor}&toType=ASSET");
    let (st, r) = s.json("GET", &format!("/api/relation?{one}"), &jwt, None);
    assert_eq!((st, r["to"]["id"].as_str()), (200, Some(&*floor)), "{r}");
    let again = json!({"from": {"entityType": "ASSET", "id": site}, "to": {"entityType": "ASSET", "id": floor},
        "type": "Contains", "additionalInfo": {"note": "north"}});
    assert_eq!(s.json("POST", "/api/relation", &jwt, Some(again)).0, 200);
    let (_, from_site) = s.json("GET", &format!("/api/relations?fromId={site}&fromType=ASSET"), &jwt, None);
    assert_eq!(from_site.as_array().unwrap().len(), 1, "{from_site}");
    assert_eq!(from_site[0]["additionalInfo"]["note"], "north");

    // By either end, by type, with names; ThingsBoard 4's paths too.
    let (_, to_meter) = s.json("GET", &format!("/api/relations/info?toId={meter}&toType=DEVICE"), &jwt, None);
    assert_eq!(
        (to_meter[0]["fromName"].as_str(), to_meter[0]["toName"].as_str()),
        (Some("floor-1"), Some("meter")),
        "{to_meter}"
    );
    let (_, managed) = s.json("GET", &format!("/api/relations/from/CUSTOMER/{acme}/Manages"), &jwt, None);
    assert_eq!(managed[0]["to"]["id"].as_str(), Some(&*site));
    let (_, none) = s.json("GET", &format!("/api/relations/from/CUSTOMER/{acme}/Contains"), &jwt, None);
    assert_eq!(none, json!([]));
    let (_, to_site) = s.json("GET", &format!("/api/relations/info/to/ASSET/{site}"), &jwt, None);
    assert_eq!(to_site[0]["fromName"], "Acme");

    // A relations query walks levels, by filter, last level only on request.
    let query = |params: J, filters: J| {
        let (st, r) =
            s.json("POST", "/api/relations/info", &jwt, Some(json!({"parameters": params, "filters": filters})));
        assert_eq!(st, 200, "{r}");
        let mut names: Vec<String> =
            r.as_array().unwrap().iter().map(|x| x["toName"].as_str().unwrap().to_owned()).collect();
        names.sort();
        names
    };
    let root = json!({"rootId": site, "rootType": "ASSET", "direction": "FROM", "maxLevel": 2});
    assert_eq!(query(root.clone(), json!([])), ["floor-1", "meter"]);
    assert_eq!(
        query(root.clone(), json!([{"relationType": "Contains", "entityTypes": ["DEVICE"]}])),
        ["meter"],
        "the walk goes through every relation; the filter picks from what it found, as in ThingsBoard"
    );
    let mut last = root.clone();
    last["fetchLastLevelOnly"] = json!(true);
    assert_eq!(query(last, json!([])), ["meter"]);
    let mut one_level = root.clone();
    one_level["maxLevel"] = json!(1);
    assert_eq!(query(one_level, json!([])), ["floor-1"]);
    let (_, found) = s.json(
        "POST",
        "/api/assets",
        &jwt,
        Some(json!({"parameters": root, "relationType": "Contains", "assetTypes": ["floor"]})),
    );
    assert_eq!(found.as_array().unwrap().iter().map(|a| a["name"].clone()).collect::<Vec<_>>(), ["floor-1"]);

    // The gateway's "Created" relation is the device's gateway.
    let gw = s.gateway(&jwt, "gw", "GWTOKEN");
    relate(&s, &jwt, ("DEVICE", &gw), ("DEVICE", &meter), "Created");
    let (_, from_gw) = s.json("GET", &format!("/api/relations?fromId={gw}&fromType=DEVICE"), &jwt, None);
    assert_eq!(from_gw[0]["to"]["id"].as_str(), Some(&*meter), "{from_gw}");
    let created = format!("fromId={gw}&fromType=DEVICE&relationType=Created&toId={meter}&toType=DEVICE");
    let (st, gone) = s.json("DELETE", &format!("/api/v2/relation?{created}"), &jwt, None);
    assert_eq!((st, gone["type"].as_str()), (200, Some("Created")), "{gone}");
    assert_eq!(s.json("GET", &format!("/api/relation?{created}"), &jwt, None).0, 404);

    // Deleting an entity deletes its relations; DELETE /api/relations deletes them all.
    assert_eq!(s.json("DELETE", &format!("/api/device/{meter}"), &jwt, None).0, 200);
    let (_, from_floor) = s.json("GET", &format!("/api/relations?fromId={floor}&fromType=ASSET"), &jwt, None);
    assert_eq!(from_floor, json!([]));
    assert_eq!(s.json("DELETE", &format!("/api/relations?entityId={site}&entityType=ASSET"), &jwt, None).0, 200);
    let (_, to_site) = s.json("GET", &format!("/api/relations?toId={site}&toType=ASSET"), &jwt, None);
    let (_, from_site) = s.json("GET", &format!("/api/relations?fromId={site}&fromType=ASSET"), &jwt, None);
    assert_eq!((to_site, from_site), (json!([]), json!([])));

    // Bad input: clear errors, nothing saved.
    let bad = [
        (
            json!({"from": {"entityType": "EDGE", "id": site}, "to": {"entityType": "ASSET", "id": floor}, "type": "T"}),
            400,
        ),
        (
            json!({"from": {"entityType": "ASSET", "id": site}, "to": {"entityType": "ASSET", "id": floor}, "type": ""}),
            400,
        ),
        (json!({"from": {"entityType": "ASSET", "id": site}, "type": "T"}), 400),
        (
            json!({"from": {"entityType": "ASSET", "id": site}, "to": {"entityType": "ASSET", "id": "nope"}, "type": "T"}),
            400,
        ),
        (
            json!({"from": {"entityType": "ASSET", "id": site}, "to": {"entityType": "DEVICE", "id": meter}, "type": "T"}),
            404,
        ),
        (
            json!({"from": {"entityType": "ASSET", "id": site}, "to": {"entityType": "ASSET", "id": floor}, "type": "x".repeat(300)}),
            400,
        ),
        (
            json!({"from": {"entityType": "ASSET", "id": site}, "to": {"entityType": "ASSET", "id": floor}, "type": "a\nb"}),
            400,
        ),
    ];
    for (body, code) in bad {
        let (st, out) = s.json("POST", "/api/v2/relation", &jwt, Some(body.clone()));
        assert_eq!(st, code, "{body}: {out}");
    }
    let (_, from_site) = s.json("GET", &format!("/api/relations?fromId={site}&fromType=ASSET"), &jwt, None);
    assert_eq!(from_site, json!([]));
}

#[test]
fn entity_queries_select_devices_assets_and_customers() {
    let s = Server::start();
    let jwt = s.login();
    let acme = s.customer(&jwt, "Acme");
    let mut devices = Vec::new();
    for (name, t, temp) in [
        ("Th-1", "thermostat", 19.0),
        ("Th-2", "thermostat", 23.5),
        ("Th-3", "thermostat", 30.0),
        ("Meter", "meter", 50.0),
    ] {
        let (st, d) = s.json("POST", "/api/device", &jwt, Some(json!({"name": name, "type": t})));
        assert_eq!(st, 200, "{d}");
        let d = id(&d);
        let tel = format!("/api/plugins/telemetry/DEVICE/{d}/timeseries/ANY");
        assert_eq!(s.req("POST", &tel, Some(&jwt), Some(&json!({"temperature": temp}).to_string())).0, 200);
        devices.push(d);
    }
    assert_eq!(s.json("POST", &format!("/api/customer/{acme}/device/{}", devices[1]), &jwt, None).0, 200);
    let site = asset(&s, &jwt, "Site", "site");
    relate(&s, &jwt, ("ASSET", &site), ("DEVICE", &devices[0]), "Contains");
    relate(&s, &jwt, ("ASSET", &site), ("DEVICE", &devices[3]), "Contains");
    let attrs = format!("/api/plugins/telemetry/ASSET/{site}/attributes/SERVER_SCOPE");
    assert_eq!(s.req("POST", &attrs, Some(&jwt), Some(r#"{"city":"Kyiv"}"#)).0, 200);

    let find = |jwt: &str, q: J| -> (Vec<String>, J) {
        let (st, page) = s.json("POST", "/api/entitiesQuery/find", jwt, Some(q.clone()));
        assert_eq!(st, 200, "{q}: {page}");
        let (_, n) = s.json("POST", "/api/entitiesQuery/count", jwt, Some(q.clone()));
        assert_eq!(n, page["totalElements"], "count agrees with find: {q}");
        let names = page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["latest"]["ENTITY_FIELD"]["name"]["value"].as_str().unwrap_or_default().to_owned())
            .collect();
        (names, page)
    };
    let fields = json!([{"type": "ENTITY_FIELD", "key": "name"}, {"type": "ENTITY_FIELD", "key": "type"}]);
    let q = |filter: J| {
        json!({"entityFilter": filter, "pageLink": {"pageSize": 10, "page": 0,
        "sortOrder": {"key": {"type": "ENTITY_FIELD", "key": "name"}, "direction": "ASC"}}, "entityFields": fields,
        "latestValues": [{"type": "TIME_SERIES", "key": "temperature"}, {"type": "SERVER_ATTRIBUTE", "key": "city"}]})
    };

    // The filters ThingsBoard's dashboards use.
    assert_eq!(find(&jwt, q(json!({"type": "deviceType", "deviceTypes": ["thermostat"]}))).0, ["Th-1", "Th-2", "Th-3"]);
    assert_eq!(
        find(&jwt, q(json!({"type": "entityName", "entityType": "DEVICE", "entityNameFilter": "th"}))).0,
        ["Th-1", "Th-2", "Th-3"]
    );
    assert_eq!(
        find(&jwt, q(json!({"type": "entityName", "entityType": "DEVICE", "entityNameFilter": "%-3"}))).0,
        ["Th-3"]
    );
    assert_eq!(
        find(&jwt, q(json!({"type": "entityList", "entityType": "DEVICE", "entityList": [devices[3], devices[0]]}))).0,
        ["Meter", "Th-1"]
    );
    assert_eq!(find(&jwt, q(json!({"type": "entityType", "entityType": "CUSTOMER"}))).0, ["Acme"]);
    let (names, page) = find(&jwt, q(json!({"type": "assetType", "assetTypes": ["site"]})));
    assert_eq!(names, ["Site"]);
    let e = &page["data"][0];
    assert_eq!(e["entityId"], json!({"entityType": "ASSET", "id": site}));
    assert_eq!(
        (
            e["latest"]["ENTITY_FIELD"]["type"]["value"].as_str(),
            e["latest"]["SERVER_ATTRIBUTE"]["city"]["value"].as_str()
        ),
        (Some("site"), Some("Kyiv")),
        "{e}"
    );
    let (names, page) = find(
        &jwt,
        q(json!({"type": "relationsQuery", "rootEntity": {"entityType": "ASSET", "id": site},
        "direction": "FROM", "maxLevel": 1, "filters": [{"relationType": "Contains", "entityTypes": ["DEVICE"]}]})),
    );
    assert_eq!(names, ["Meter", "Th-1"]);
    assert_eq!(page["data"][1]["latest"]["TIME_SERIES"]["temperature"]["value"], "19.0", "{page}");
    let (names, _) = find(
        &jwt,
        q(json!({"type": "deviceSearchQuery", "rootEntity": {"entityType": "ASSET", "id": site},
        "direction": "FROM", "maxLevel": 1, "relationType": "Contains", "deviceTypes": ["meter"]})),
    );
    assert_eq!(names, ["Meter"]);

    // Key filters, sort by a latest value, pages.
    let mut warm = q(json!({"type": "deviceType", "deviceTypes": ["thermostat", "meter"]}));
    warm["keyFilters"] = json!([{"key": {"type": "TIME_SERIES", "key": "temperature"}, "valueType": "NUMERIC",
        "predicate": {"type": "NUMERIC", "operation": "GREATER", "value": {"defaultValue": 20, "userValue": null}}}]);
    warm["pageLink"] = json!({"pageSize": 2, "page": 0, "sortOrder": {"key": {"type": "TIME_SERIES", "key": "temperature"}, "direction": "DESC"}});
    let (names, page) = find(&jwt, warm.clone());
    assert_eq!(names, ["Meter", "Th-3"]);
    assert_eq!(
        (page["totalElements"].as_i64(), page["totalPages"].as_i64(), page["hasNext"].as_bool()),
        (Some(3), Some(2), Some(true))
    );
    warm["pageLink"]["page"] = json!(1);
    assert_eq!(find(&jwt, warm).0, ["Th-2"]);

    // A customer user's query sees its customer's entities only, whatever it asks for.
    let (_, cu) = s.user(&jwt, "cu@acme.test", Some(&acme), "acme-pw");
    assert_eq!(find(&cu, q(json!({"type": "entityType", "entityType": "DEVICE"}))).0, ["Th-2"]);
    assert_eq!(find(&cu, q(json!({"type": "entityList", "entityType": "DEVICE", "entityList": devices}))).0, ["Th-2"]);
    assert_eq!(find(&cu, q(json!({"type": "assetType", "assetTypes": ["site"]}))).0, Vec::<String>::new());
    assert_eq!(find(&cu, q(json!({"type": "entityType", "entityType": "CUSTOMER"}))).0, ["Acme"]);
    let related =
        q(json!({"type": "relationsQuery", "rootEntity": {"entityType": "ASSET", "id": site}, "direction": "FROM"}));
    assert_eq!(s.json("POST", "/api/entitiesQuery/find", &cu, Some(related)).0, 400, "a root it may not read");

    // Bad queries: 400 naming what is wrong.
    for (bad, says) in [
        (json!({}), "entityFilter"),
        (json!({"entityFilter": {"type": "apiUsageState"}}), "apiUsageState"),
        (json!({"entityFilter": {"type": "entityType", "entityType": "EDGE"}}), "EDGE"),
        (
            json!({"entityFilter": {"type": "entityType", "entityType": "DEVICE"}, "pageLink": {"pageSize": 0}}),
            "pageSize",
        ),
        (
            json!({"entityFilter": {"type": "singleEntity", "singleEntity": {"entityType": "DEVICE", "id": "x"}}}),
            "UUID",
        ),
    ] {
        let (st, out) = s.json("POST", "/api/entitiesQuery/find", &jwt, Some(bad.clone()));
        assert_eq!(st, 400, "{bad}: {out}");
        assert!(out["message"].as_str().unwrap_or_default().contains(says), "{bad}: {out}");
    }
}

/// An asset's data reaches the WebSocket API as a device's does: a `TIMESERIES` and an
/// `ATTRIBUTES` subscription by `entityType: ASSET`, and an `ENTITY_DATA` page of assets
/// with its `latestCmd` and `tsCmd`, each answered and then updated on every commit.
#[test]
fn asset_data_is_live_over_the_websocket_api() {
    use common::ws::{next, open, send};
    let s = Server::start();
    let jwt = s.login();
    let plant = asset(&s, &jwt, "Plant", "plant");
    let tel = format!("/api/plugins/telemetry/ASSET/{plant}");
    assert_eq!(s.req("POST", &format!("{tel}/timeseries/ANY"), Some(&jwt), Some(r#"{"power":1}"#)).0, 200);

    let mut ws = open(&s, "/api/ws", std::time::Duration::from_secs(10));
    let sub = json!({"cmdId": 1, "type": "TIMESERIES", "entityType": "ASSET", "entityId": plant, "keys": "power"});
    send(&mut ws, json!({"authCmd": {"cmdId": 0, "token": jwt}, "cmds": [sub]}));
    let first = next(&mut ws);
    assert_eq!(
        (first["subscriptionId"].as_i64(), first["data"]["power"][0][1].as_str()),
        (Some(1), Some("1")),
        "{first}"
    );
    let attrs =
        json!({"cmdId": 2, "type": "ATTRIBUTES", "entityType": "ASSET", "entityId": plant, "scope": "SERVER_SCOPE"});
    send(&mut ws, json!({"cmds": [attrs]}));
    assert_eq!(next(&mut ws)["subscriptionId"], 2);
    let page = json!({"cmdId": 3, "type": "ENTITY_DATA",
        "query": {"entityFilter": {"type": "assetType", "assetTypes": ["plant"]}, "pageLink": {"pageSize": 10, "page": 0},
                  "entityFields": [{"type": "ENTITY_FIELD", "key": "name"}]},
        "latestCmd": {"keys": [{"type": "TIME_SERIES", "key": "power"}]},
        "tsCmd": {"keys": ["power"], "startTs": 0, "timeWindow": 9_999_999_999_999u64, "limit": 10}});
    send(&mut ws, json!({"cmds": [page]}));
    let answer = next(&mut ws);
    assert_eq!(answer["data"]["data"][0]["entityId"], json!({"entityType": "ASSET", "id": plant}), "{answer}");
    let window = next(&mut ws);
    assert_eq!(window["update"][0]["entityId"]["entityType"], "ASSET", "{window}");
    assert_eq!(window["update"][0]["timeseries"]["power"][0]["value"], "1", "{window}");

    // Commits after: each subscription hears of them.
    assert_eq!(s.req("POST", &format!("{tel}/timeseries/ANY"), Some(&jwt), Some(r#"{"power":2}"#)).0, 200);
    assert_eq!(s.req("POST", &format!("{tel}/attributes/SERVER_SCOPE"), Some(&jwt), Some(r#"{"area":7}"#)).0, 200);
    let mut heard = Vec::new();
    while heard.len() < 3 {
        let m = next(&mut ws);
        if let Some(id) = m["subscriptionId"].as_i64() {
            heard.push((id, m["data"].to_string()));
        } else {
            assert_eq!(m["update"][0]["entityId"]["entityType"], "ASSET", "{m}");
            assert_eq!(m["update"][0]["latest"]["TIME_SERIES"]["power"]["value"], "2", "{m}");
            heard.push((m["cmdId"].as_i64().unwrap(), m["update"].to_string()));
        }
    }
    heard.sort();
    assert_eq!(heard.iter().map(|h| h.0).collect::<Vec<_>>(), [1, 2, 3], "{heard:?}");
    assert!(heard[0].1.contains("\"2\"") && heard[1].1.contains("area"), "{heard:?}");
}
