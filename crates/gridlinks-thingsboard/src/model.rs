//! Entity JSON exactly as ThingsBoard's REST API renders it, and the entity references
//! its requests carry. Records come in as borrowed views ([`Device`]), so this module
//! knows the JSON shapes and nothing of how devices are stored.

use std::str::FromStr;

use gridlinks_types::{DeviceId, ProfileId, Ts, Value};
use serde::Deserialize;
use serde_json::{json, Value as J};
use uuid::Uuid;

/// ThingsBoard's NULL_UUID, used for "no customer".
pub const NULL_UUID: &str = "13814000-1dd2-11b2-8080-808080808080";

/// The relation type of a gateway and its devices (as ThingsBoard's gateway API creates
/// it): the one relation GridLinks keeps.
pub const CREATED: &str = "Created";

/// An entity's own id as a request body carries it (`"id"`, `"deviceProfileId"`):
/// `{"id":"…"}`, any `entityType` ignored, as ThingsBoard's typed ids read it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Id {
    /// The UUID, as sent.
    pub id: String,
}

/// An entity reference in a request body: `{"entityType":"DEVICE","id":"…"}`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct EntityId {
    /// `DEVICE`, `TENANT`, … (GridLinks has devices only).
    #[serde(rename = "entityType")]
    pub entity_type: String,
    /// The UUID, as sent.
    pub id: String,
}

impl EntityId {
    /// The device it names; other entity types are refused.
    pub fn device_id(&self) -> Result<DeviceId, EntityError> {
        entity_device_id(&self.entity_type, &self.id)
    }
}

/// Why an entity reference names no device.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EntityError {
    /// The id is not a UUID.
    #[error("Invalid UUID string: {0}")]
    InvalidUuid(String),
    /// An entity type other than `DEVICE`.
    #[error("entity type '{0}' is not supported: GridLinks has DEVICE entities only")]
    UnsupportedType(String),
}

/// A device id as sent in a path or a body.
pub fn device_id(s: &str) -> Result<DeviceId, EntityError> {
    DeviceId::from_str(s).map_err(|_| EntityError::InvalidUuid(s.to_owned()))
}

/// The device named by an entity reference (type and id, as in
/// `/api/plugins/telemetry/{entityType}/{entityId}/…`).
pub fn entity_device_id(entity_type: &str, id: &str) -> Result<DeviceId, EntityError> {
    if entity_type != "DEVICE" {
        return Err(EntityError::UnsupportedType(entity_type.to_owned()));
    }
    device_id(id)
}

/// `{"entityType":…,"id":…}` as ThingsBoard renders an id.
pub fn entity_id(entity_type: &str, id: impl serde::Serialize) -> J {
    json!({"entityType": entity_type, "id": id})
}

/// What the device JSON shows of a device, borrowed from wherever it is kept.
#[derive(Clone, Copy, Debug)]
pub struct Device<'a> {
    /// Its id.
    pub id: DeviceId,
    /// Creation time, ms since epoch.
    pub created_time: i64,
    /// Unique name.
    pub name: &'a str,
    /// Device type (the device profile's name).
    pub device_type: &'a str,
    /// Its device profile.
    pub profile: ProfileId,
    /// Free-text label.
    pub label: Option<&'a str>,
    /// Its access token.
    pub token: &'a str,
    /// ThingsBoard's `additionalInfo`.
    pub additional_info: Option<&'a J>,
    /// The custom-protocol identity (protocol, identity), a credential beside the token.
    pub identity: Option<(&'a str, &'a str)>,
    /// MQTT_BASIC credentials (client id, user name), when the device has them.
    pub basic: Option<(Option<&'a str>, Option<&'a str>)>,
    /// X509_CERTIFICATE credentials (fingerprint, certificate), when it has them.
    pub x509: Option<(&'a str, &'a str)>,
    /// The customer it is assigned to.
    pub customer: Option<Uuid>,
}

/// A customer reference: the id, or ThingsBoard's NULL_UUID for none.
fn customer_id(customer: Option<Uuid>) -> J {
    match customer {
        Some(c) => entity_id("CUSTOMER", c),
        None => entity_id("CUSTOMER", NULL_UUID),
    }
}

/// A device as `GET /api/device/{id}` returns it; one with a custom-protocol identity
/// also has `protocolIdentity: {"protocol", "id"}` (GridLinks' own field).
pub fn device(d: &Device<'_>, tenant: Uuid) -> J {
    let mut j = json!({
        "id": entity_id("DEVICE", d.id),
        "createdTime": d.created_time,
        "additionalInfo": d.additional_info,
        "tenantId": entity_id("TENANT", tenant),
        "customerId": customer_id(d.customer),
        "name": d.name,
        "type": d.device_type,
        "label": d.label,
        "deviceProfileId": entity_id("DEVICE_PROFILE", d.profile),
        "deviceData": {"configuration": {"type": "DEFAULT"}, "transportConfiguration": {"type": "DEFAULT"}},
        "firmwareId": null,
        "softwareId": null,
        "externalId": null,
        "version": 1,
    });
    if let (Some((protocol, id)), Some(obj)) = (d.identity, j.as_object_mut()) {
        obj.insert("protocolIdentity".into(), json!({"protocol": protocol, "id": id}));
    }
    j
}

/// The `credentialsId` ThingsBoard gives MQTT_BASIC credentials: the user name alone when
/// there is no client id, else SHA3-256 hex of the client id, or of `clientId|userName`.
pub fn basic_credentials_id(client_id: Option<&str>, user_name: Option<&str>) -> String {
    let (c, u) = (client_id.filter(|c| !c.is_empty()), user_name.filter(|u| !u.is_empty()));
    match (c, u) {
        (None, u) => u.unwrap_or_default().to_owned(),
        (Some(c), None) => crate::x509::sha3_hex(c),
        (Some(c), Some(u)) => crate::x509::sha3_hex(&format!("{c}|{u}")),
    }
}

/// A device's protocol identity as ThingsBoard-shaped credentials (`POST
/// /api/device/credentials` with `credentialsType: "PROTOCOL_IDENTITY"` answers this).
pub fn identity_credentials(d: &Device<'_>) -> J {
    let (protocol, id) = d.identity.unwrap_or_default();
    json!({
        "id": {"id": Uuid::new_v5(&Uuid::NAMESPACE_OID, format!("{}/identity", d.id.0).as_bytes())},
        "createdTime": d.created_time,
        "deviceId": entity_id("DEVICE", d.id),
        "credentialsType": "PROTOCOL_IDENTITY",
        "credentialsId": id,
        "credentialsValue": protocol,
        "version": 1,
    })
}

/// A device's credentials as `GET /api/device/{id}/credentials` returns them.
pub fn credentials(d: &Device<'_>) -> J {
    // MQTT_BASIC: the password is never shown (only its hash is kept).
    let (kind, id, value) = match (d.basic, d.x509) {
        (Some((client_id, user_name)), _) => {
            let value = json!({"clientId": client_id, "userName": user_name, "password": null}).to_string();
            ("MQTT_BASIC", J::String(basic_credentials_id(client_id, user_name)), J::String(value))
        }
        (None, Some((fingerprint, cert))) => ("X509_CERTIFICATE", J::from(fingerprint), J::from(cert)),
        (None, None) => ("ACCESS_TOKEN", J::String(d.token.to_owned()), J::Null),
    };
    json!({
        "id": {"id": Uuid::new_v5(&Uuid::NAMESPACE_OID, d.id.0.as_bytes())},
        "createdTime": d.created_time,
        "deviceId": entity_id("DEVICE", d.id),
        "credentialsType": kind,
        "credentialsId": id,
        "credentialsValue": value,
        "version": 1,
    })
}

/// ThingsBoard's `PageData`.
pub fn page(data: Vec<J>, total: usize, page_size: usize, page: usize) -> J {
    let total_pages = total.div_ceil(page_size);
    json!({
        "data": data,
        "totalPages": total_pages,
        "totalElements": total,
        "hasNext": (page + 1) < total_pages,
    })
}

/// A telemetry value: a string unless `strict` (`useStrictDataTypes=true`).
pub fn ts_value(v: &Value, strict: bool) -> J {
    if strict {
        v.to_json()
    } else {
        J::String(v.to_display_string())
    }
}

/// `{"key":[{"ts":..,"value":..}]}`.
pub fn ts_map(series: Vec<(String, Vec<(Ts, Value)>)>, strict: bool) -> J {
    let mut m = serde_json::Map::new();
    for (k, points) in series {
        let arr: Vec<J> = points.iter().map(|(ts, v)| json!({"ts": ts.0, "value": ts_value(v, strict)})).collect();
        m.insert(k, J::Array(arr));
    }
    J::Object(m)
}

/// `[{"lastUpdateTs","key","value"}]` from (key, last update, value), values with their types.
pub fn attributes<'a>(entries: impl IntoIterator<Item = (&'a str, Ts, &'a Value)>) -> J {
    J::Array(
        entries
            .into_iter()
            .map(|(key, ts, value)| json!({"lastUpdateTs": ts.0, "key": key, "value": value.to_json()}))
            .collect(),
    )
}

/// What the device profile JSON shows of a profile, borrowed from wherever it is kept.
#[derive(Clone, Copy, Debug)]
pub struct Profile<'a> {
    /// Its id.
    pub id: ProfileId,
    /// Creation time, ms since epoch.
    pub created_time: i64,
    /// Unique name.
    pub name: &'a str,
    /// The tenant's default profile.
    pub default: bool,
    /// The rest, as the client gave it (an object).
    pub doc: &'a J,
}

/// The fields of a profile GridLinks keeps itself; a client's copy of them is ignored.
pub const PROFILE_OWN_FIELDS: [&str; 6] = ["id", "createdTime", "tenantId", "name", "default", "version"];

/// A device profile as `GET /api/deviceProfile/{id}` returns it: what the client stored,
/// ThingsBoard's defaults for what it left out.
pub fn profile(p: &Profile<'_>, tenant: Uuid) -> J {
    let mut j = json!({
        "description": null,
        "type": "DEFAULT",
        "transportType": "DEFAULT",
        "provisionType": "DISABLED",
        "profileData": {
            "configuration": {"type": "DEFAULT"},
            "transportConfiguration": {"type": "DEFAULT"},
            "provisionConfiguration": {"type": "DISABLED", "provisionDeviceSecret": null},
            "alarms": null,
        },
        "image": null,
        "defaultRuleChainId": null,
        "defaultDashboardId": null,
        "defaultQueueName": null,
        "defaultEdgeRuleChainId": null,
        "provisionDeviceKey": null,
        "firmwareId": null,
        "softwareId": null,
        "externalId": null,
    });
    if let (Some(out), Some(doc)) = (j.as_object_mut(), p.doc.as_object()) {
        for (k, v) in doc.iter().filter(|(k, _)| !PROFILE_OWN_FIELDS.contains(&k.as_str())) {
            out.insert(k.clone(), v.clone());
        }
        out.insert("id".into(), entity_id("DEVICE_PROFILE", p.id));
        out.insert("createdTime".into(), p.created_time.into());
        out.insert("tenantId".into(), entity_id("TENANT", tenant));
        out.insert("name".into(), p.name.into());
        out.insert("default".into(), p.default.into());
        out.insert("version".into(), 1.into());
    }
    j
}

/// A device profile info (`GET /api/deviceProfileInfos`).
pub fn profile_info(p: &Profile<'_>, tenant: Uuid) -> J {
    let full = profile(p, tenant);
    json!({
        "id": full["id"],
        "tenantId": full["tenantId"],
        "name": p.name,
        "image": full["image"],
        "defaultDashboardId": full["defaultDashboardId"],
        "type": full["type"],
        "transportType": full["transportType"],
    })
}

/// What the dashboard JSON shows of a dashboard, borrowed from wherever it is kept.
#[derive(Clone, Copy, Debug)]
pub struct Dashboard<'a> {
    /// Its id.
    pub id: Uuid,
    /// Creation time, ms since epoch.
    pub created_time: i64,
    /// Its title.
    pub title: &'a str,
    /// The rest, as the client gave it (an object: `configuration`, `image`, …).
    pub doc: &'a J,
    /// The customers it is assigned to: (id, title).
    pub customers: &'a [(Uuid, &'a str)],
}

/// A dashboard info (`GET /api/tenant/dashboards`): everything but the configuration.
pub fn dashboard_info(d: &Dashboard<'_>, tenant: Uuid) -> J {
    let field = |k: &str| d.doc.get(k).cloned().unwrap_or(J::Null);
    json!({
        "id": entity_id("DASHBOARD", d.id),
        "createdTime": d.created_time,
        "tenantId": entity_id("TENANT", tenant),
        "title": d.title,
        "name": d.title,
        "image": field("image"),
        "assignedCustomers": (!d.customers.is_empty()).then(|| {
            d.customers
                .iter()
                .map(|(id, title)| json!({"customerId": entity_id("CUSTOMER", id), "title": title, "public": false}))
                .collect::<Vec<_>>()
        }),
        "mobileHide": d.doc.get("mobileHide").and_then(J::as_bool).unwrap_or(false),
        "mobileOrder": field("mobileOrder"),
        "externalId": null,
        "version": 1,
    })
}

/// A dashboard as `GET /api/dashboard/{id}` returns it: the info and its configuration.
pub fn dashboard(d: &Dashboard<'_>, tenant: Uuid) -> J {
    let mut j = dashboard_info(d, tenant);
    if let Some(obj) = j.as_object_mut() {
        obj.insert("configuration".into(), d.doc.get("configuration").cloned().unwrap_or(J::Null));
        obj.insert("resources".into(), d.doc.get("resources").cloned().unwrap_or(J::Null));
    }
    j
}

/// What the customer JSON shows of a customer.
#[derive(Clone, Copy, Debug)]
pub struct Customer<'a> {
    /// Its id.
    pub id: Uuid,
    /// Creation time, ms since epoch.
    pub created_time: i64,
    /// Its title (unique).
    pub title: &'a str,
    /// The rest, as the client gave it (address, email, phone, `additionalInfo`, …).
    pub doc: &'a J,
}

/// A customer as `GET /api/customer/{id}` returns it.
pub fn customer(c: &Customer<'_>, tenant: Uuid) -> J {
    let field = |k: &str| c.doc.get(k).cloned().unwrap_or(J::Null);
    json!({
        "id": entity_id("CUSTOMER", c.id),
        "createdTime": c.created_time,
        "tenantId": entity_id("TENANT", tenant),
        "title": c.title,
        "name": c.title,
        "country": field("country"),
        "state": field("state"),
        "city": field("city"),
        "address": field("address"),
        "address2": field("address2"),
        "zip": field("zip"),
        "phone": field("phone"),
        "email": field("email"),
        "additionalInfo": field("additionalInfo"),
        "externalId": null,
        "version": 1,
    })
}

/// What the asset JSON shows of an asset.
#[derive(Clone, Copy, Debug)]
pub struct Asset<'a> {
    /// Its id.
    pub id: Uuid,
    /// Creation time, ms since epoch.
    pub created_time: i64,
    /// Its name (unique in its tenant).
    pub name: &'a str,
    /// Its profile and that profile's name (the asset's type).
    pub profile: (Uuid, &'a str),
    /// Its customer: id and title.
    pub customer: Option<(Uuid, &'a str)>,
    /// `label`, `additionalInfo`.
    pub doc: &'a J,
}

/// An asset as `GET /api/asset/{id}` returns it.
pub fn asset(a: &Asset<'_>, tenant: Uuid) -> J {
    let field = |k: &str| a.doc.get(k).cloned().unwrap_or(J::Null);
    json!({
        "id": entity_id("ASSET", a.id),
        "createdTime": a.created_time,
        "tenantId": entity_id("TENANT", tenant),
        "customerId": customer_id(a.customer.map(|c| c.0)),
        "name": a.name,
        "type": a.profile.1,
        "label": field("label"),
        "assetProfileId": entity_id("ASSET_PROFILE", a.profile.0),
        "additionalInfo": field("additionalInfo"),
        "externalId": null,
        "version": 1,
    })
}

/// An asset as `GET /api/asset/info/{id}` returns it (ThingsBoard's `AssetInfo`): with its
/// customer's title (`customerTitle`, and `ownerName` as 4.4 names it) and profile name.
pub fn asset_info(a: &Asset<'_>, tenant: Uuid) -> J {
    let mut j = asset(a, tenant);
    if let Some(o) = j.as_object_mut() {
        o.insert("customerTitle".into(), a.customer.map(|c| c.1).into());
        o.insert("customerIsPublic".into(), false.into());
        o.insert("assetProfileName".into(), a.profile.1.into());
        // tb-rest-client 4.4's `AssetInfo` (Community and Professional Edition merged).
        o.insert("ownerName".into(), a.customer.map(|c| c.1).into());
    }
    j
}

/// An asset profile as `GET /api/assetProfile/{id}` returns it; `doc` holds `default`,
/// `description`, `image` and the default dashboard, rule chain and queue as given.
pub fn asset_profile(id: Uuid, created_time: i64, name: &str, doc: &J, tenant: Uuid) -> J {
    let field = |k: &str| doc.get(k).cloned().unwrap_or(J::Null);
    json!({
        "id": entity_id("ASSET_PROFILE", id),
        "createdTime": created_time,
        "tenantId": entity_id("TENANT", tenant),
        "name": name,
        "default": doc.get("default").and_then(J::as_bool).unwrap_or(false),
        "description": field("description"),
        "image": field("image"),
        "defaultDashboardId": field("defaultDashboardId"),
        "defaultRuleChainId": field("defaultRuleChainId"),
        "defaultQueueName": field("defaultQueueName"),
        "defaultEdgeRuleChainId": field("defaultEdgeRuleChainId"),
        "externalId": null,
        "version": 1,
    })
}

/// An asset profile as ThingsBoard's `AssetProfileInfo` (`/api/assetProfileInfo/…`).
pub fn asset_profile_info(id: Uuid, name: &str, doc: &J, tenant: Uuid) -> J {
    json!({
        "id": entity_id("ASSET_PROFILE", id),
        "tenantId": entity_id("TENANT", tenant),
        "name": name,
        "image": doc.get("image").cloned().unwrap_or(J::Null),
        "defaultDashboardId": doc.get("defaultDashboardId").cloned().unwrap_or(J::Null),
    })
}

/// An API key as ThingsBoard 4.3 shows it (`ApiKeyInfo`; never its value).
#[derive(Clone, Copy, Debug)]
pub struct ApiKey<'a> {
    /// Its id.
    pub id: Uuid,
    /// Creation time, ms since epoch.
    pub created_time: i64,
    /// Whose it is.
    pub user: Uuid,
    /// Ms since epoch; 0: never.
    pub expiration_time: i64,
    /// What it is for.
    pub description: &'a str,
    /// Whether it works.
    pub enabled: bool,
}

/// `ApiKeyInfo` at `now` (ms since epoch).
pub fn api_key_info(k: &ApiKey<'_>, tenant: Uuid, now: i64) -> J {
    json!({
        "id": entity_id("API_KEY", k.id),
        "createdTime": k.created_time,
        "tenantId": entity_id("TENANT", tenant),
        "userId": entity_id("USER", k.user),
        "expirationTime": k.expiration_time,
        "description": k.description,
        "enabled": k.enabled,
        "expired": k.expiration_time != 0 && now >= k.expiration_time,
    })
}

/// A "Created" relation from a gateway to one of its devices.
pub fn relation(gateway: DeviceId, device: DeviceId) -> J {
    json!({
        "from": entity_id("DEVICE", gateway),
        "to": entity_id("DEVICE", device),
        "type": CREATED,
        "typeGroup": "COMMON",
        "additionalInfo": null,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_ids_are_thingsboards() {
        // SHA3-256("abc"), the FIPS 202 test vector.
        let abc = "3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532";
        assert_eq!(basic_credentials_id(Some("abc"), None), abc);
        assert_eq!(basic_credentials_id(Some("abc"), Some("")), abc);
        assert_eq!(basic_credentials_id(None, Some("user")), "user");
        assert_eq!(basic_credentials_id(Some("a"), Some("bc")), crate::x509::sha3_hex("a|bc"));
    }

    #[test]
    fn entity_references() {
        let id = DeviceId::new_random();
        assert_eq!(entity_device_id("DEVICE", &id.to_string()), Ok(id));
        assert_eq!(
            entity_device_id("ASSET", &id.to_string()).unwrap_err().to_string(),
            "entity type 'ASSET' is not supported: GridLinks has DEVICE entities only"
        );
        assert_eq!(device_id("x").unwrap_err().to_string(), "Invalid UUID string: x");
        let e: EntityId = serde_json::from_str(&format!(r#"{{"entityType":"DEVICE","id":"{id}"}}"#)).unwrap();
        assert_eq!(e.device_id(), Ok(id));
        assert_eq!(entity_id("DEVICE", id), json!({"entityType": "DEVICE", "id": id.to_string()}));
    }

    #[test]
    fn device_json() {
        let info = json!({"gateway": true});
        let d = Device {
            id: DeviceId::new_random(),
            created_time: 5,
            name: "Boiler",
            device_type: "boiler",
            profile: ProfileId::for_name("boiler"),
            label: None,
            token: "tok",
            additional_info: Some(&info),
            identity: None,
            basic: None,
            x509: None,
            customer: None,
        };
        let j = device(&d, Uuid::nil());
        assert!(j.get("protocolIdentity").is_none());
        let lamp = device(&Device { identity: Some(("lamp", "000000000001")), ..d }, Uuid::nil());
        assert_eq!(lamp["protocolIdentity"], json!({"protocol": "lamp", "id": "000000000001"}));
        assert_eq!(j["name"], "Boiler");
        assert_eq!(j["label"], J::Null);
        assert_eq!(j["additionalInfo"]["gateway"], true);
        assert_eq!(j["customerId"]["id"], NULL_UUID);
        assert_eq!(j["deviceProfileId"]["id"], ProfileId::for_name("boiler").to_string());
        assert_eq!(credentials(&d)["credentialsId"], "tok");
        let basic = credentials(&Device { basic: Some((Some("c1"), Some("u1"))), ..d });
        assert_eq!(basic["credentialsType"], "MQTT_BASIC");
        let value: J = serde_json::from_str(basic["credentialsValue"].as_str().unwrap()).unwrap();
        assert_eq!(value, json!({"clientId": "c1", "userName": "u1", "password": null}));
    }

    #[test]
    fn profiles_keep_what_the_client_gave_and_fill_in_the_rest() {
        let doc = json!({"description": "pumps", "provisionType": "ALLOW_CREATE_NEW_DEVICES", "name": "ignored",
                         "profileData": {"alarms": [{"id": "a1"}]}});
        let p = Profile { id: ProfileId::for_name("pump"), created_time: 9, name: "pump", default: false, doc: &doc };
        let j = profile(&p, Uuid::nil());
        assert_eq!(j["name"], "pump", "the name is the profile's, not the document's");
        assert_eq!(j["description"], "pumps");
        assert_eq!(j["provisionType"], "ALLOW_CREATE_NEW_DEVICES");
        assert_eq!(j["profileData"]["alarms"][0]["id"], "a1");
        assert_eq!(j["transportType"], "DEFAULT");
        assert_eq!((j["default"].as_bool(), j["createdTime"].as_i64()), (Some(false), Some(9)));
        let info = profile_info(&p, Uuid::nil());
        assert_eq!((info["name"].as_str(), info["type"].as_str()), (Some("pump"), Some("DEFAULT")));
        assert_eq!(info["id"], j["id"]);
    }

    #[test]
    fn page_data() {
        assert_eq!(page(vec![], 0, 10, 0), json!({"data": [], "totalPages": 0, "totalElements": 0, "hasNext": false}));
        let p = page(vec![json!(1)], 21, 10, 1);
        assert_eq!((p["totalPages"].as_u64(), p["hasNext"].as_bool()), (Some(3), Some(true)));
    }

    #[test]
    fn values_and_attributes() {
        assert_eq!(ts_value(&Value::Long(3), false), json!("3"));
        assert_eq!(ts_value(&Value::Long(3), true), json!(3));
        let v = Value::Bool(true);
        assert_eq!(attributes([("on", Ts(7), &v)]), json!([{"lastUpdateTs": 7, "key": "on", "value": true}]));
    }
}
