//! Entity JSON exactly as ThingsBoard's REST API renders it.

use gridlinks_storage::{AttributeEntry, DeviceRecord};
use gridlinks_types::{Ts, Value};
use serde_json::{json, Value as J};
use uuid::Uuid;

/// ThingsBoard's NULL_UUID, used for "no customer".
pub const NULL_UUID: &str = "13814000-1dd2-11b2-8080-808080808080";

/// Stable id of the device profile named `type` (GridLinks has no profile entities;
/// the id lets clients group devices by profile as they would in ThingsBoard).
pub fn profile_id(device_type: &str) -> Uuid {
    Uuid::new_v5(&Uuid::NAMESPACE_OID, format!("gridlinks/device-profile/{device_type}").as_bytes())
}

/// A device as `GET /api/device/{id}` returns it.
pub fn device(d: &DeviceRecord, tenant: Uuid) -> J {
    json!({
        "id": {"entityType": "DEVICE", "id": d.id},
        "createdTime": d.created_time,
        "additionalInfo": d.additional_info,
        "tenantId": {"entityType": "TENANT", "id": tenant},
        "customerId": {"entityType": "CUSTOMER", "id": NULL_UUID},
        "name": d.name,
        "type": d.device_type,
        "label": d.label,
        "deviceProfileId": {"entityType": "DEVICE_PROFILE", "id": profile_id(&d.device_type)},
        "deviceData": {"configuration": {"type": "DEFAULT"}, "transportConfiguration": {"type": "DEFAULT"}},
        "firmwareId": null,
        "softwareId": null,
        "externalId": null,
        "version": 1,
    })
}

/// A device's credentials as `GET /api/device/{id}/credentials` returns them.
pub fn credentials(d: &DeviceRecord) -> J {
    json!({
        "id": {"id": Uuid::new_v5(&Uuid::NAMESPACE_OID, d.id.0.as_bytes())},
        "createdTime": d.created_time,
        "deviceId": {"entityType": "DEVICE", "id": d.id},
        "credentialsType": "ACCESS_TOKEN",
        "credentialsId": d.token,
        "credentialsValue": null,
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

/// `[{"lastUpdateTs","key","value"}]`, values with their types.
pub fn attributes(entries: &[AttributeEntry]) -> J {
    J::Array(
        entries
            .iter()
            .map(|a| json!({"lastUpdateTs": a.last_update_ts.0, "key": a.key, "value": a.value.to_json()}))
            .collect(),
    )
}

/// A device profile info (GridLinks derives one profile per device type).
pub fn profile_info(device_type: &str, tenant: Uuid) -> J {
    json!({
        "id": {"entityType": "DEVICE_PROFILE", "id": profile_id(device_type)},
        "tenantId": {"entityType": "TENANT", "id": tenant},
        "name": device_type,
        "image": null,
        "defaultDashboardId": null,
        "type": "DEFAULT",
        "transportType": "DEFAULT",
    })
}

/// The administrator as `GET /api/auth/user` returns a ThingsBoard user.
pub fn admin_user(name: &str, tenant: Uuid) -> J {
    json!({
        "id": {"entityType": "USER", "id": Uuid::new_v5(&tenant, name.as_bytes())},
        "createdTime": 0,
        "tenantId": {"entityType": "TENANT", "id": tenant},
        "customerId": {"entityType": "CUSTOMER", "id": NULL_UUID},
        "email": name,
        "name": name,
        "authority": "TENANT_ADMIN",
        "firstName": null,
        "lastName": null,
        "phone": null,
        "additionalInfo": {},
    })
}
